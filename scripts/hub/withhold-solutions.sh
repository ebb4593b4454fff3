#!/usr/bin/env bash
# A graded workshop's install: the reference solutions readable by the instructors' Unix group only.
# COURSE is an installed course folder (PREFIX/course); GROUP an existing group whose members are the instructors
# (and the account that runs `course grade`). Every folder of COURSE/solutions/ and COURSE/tests/ (whose faulty
# submissions are solutions with a few edits, some whole correct files) goes to root:GROUP, mode 0750 / 0640.
# Two folders of solutions/ stay readable, since every learner's kernel reads them and no grade comes from them:
# answers/ (the quiz keys, which a notebook shows once the learner has answered) and 01_serial/ (the serial
# script notebook 01 has learners read, and that the jobs of notebooks 01-04 run).
# shared-install.sh calls this with SOLUTIONS_GROUP set; re-running either is safe.
# usage: withhold-solutions.sh COURSE GROUP
set -euo pipefail
COURSE=${1:?usage: withhold-solutions.sh COURSE GROUP}
GROUP=${2:?usage: withhold-solutions.sh COURSE GROUP}
say() { echo "[withhold-solutions] $*"; }

if ! getent group "$GROUP" >/dev/null; then
    say "no group $GROUP: make it (groupadd $GROUP) and add the instructors (usermod -a -G $GROUP NAME)"
    exit 2
fi
[ -d "$COURSE/solutions" ] || { say "no $COURSE/solutions: give the installed course folder (PREFIX/course)"; exit 2; }
withheld=()
[ -d "$COURSE/tests" ] && withheld+=("$COURSE/tests")
for path in "$COURSE"/solutions/*; do
    case "$(basename "$path")" in
        answers|01_serial) ;;
        *) withheld+=("$path") ;;
    esac
done
chown -R "0:$GROUP" "${withheld[@]}"
chmod -R u+rwX,g+rX,g-w,o-rwx "${withheld[@]}"
say "readable by group $GROUP only: ${withheld[*]#"$COURSE/"}"
