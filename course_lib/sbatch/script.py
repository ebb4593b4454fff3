"""Read a job script as sbatch and bash do: the #SBATCH directives, the variables it exports, its launch lines.

sbatch reads ``#SBATCH`` lines only up to the first line that is neither a comment nor blank (sbatch(1):
"before any executable commands"); a directive after that is a comment, which is a classic mistake.
"""
import re
import shlex
from dataclasses import dataclass, field

# short options -> long ones (sbatch(1))
SHORT = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "t": "time", "p": "partition", "A": "account",
         "J": "job-name", "o": "output", "e": "error", "G": "gpus", "q": "qos", "D": "chdir", "w": "nodelist"}
# sbatch's long options (sbatch(1)); a directive not among them makes sbatch stop with "unrecognized option"
KNOWN = set("""account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint
container container-id contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline
delay-boot dependency distribution error exclude exclusive export export-file extra extra-node-info
get-user-env gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags
help hint hold ignore-pbs input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem
mem-bind mem-per-cpu mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist nodes ntasks
ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output overcommit oversubscribe
parsable partition power prefer priority profile propagate qos quiet reboot requeue reservation
signal sockets-per-node spread-job switches test-only thread-spec threads-per-core time time-min tmp
tres-per-task uid usage verbose version wait wait-all-nodes wckey wrap""".split())
MISSPELT = re.compile(r"^#+\s+SBATCH\b|^#sbatch\b|^#SBATCH\S")     # '# SBATCH', '#sbatch', '#SBATCH--x'
EXPORT = re.compile(r"^\s*(?:export\s+)([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
EXPORT_NAMES = re.compile(r"^\s*export((?:\s+[A-Za-z_][A-Za-z0-9_]*)+)\s*$")     # export A B (set earlier)
ASSIGN = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
NAME_VALUE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {";", "&", "&&", "||", "|", "|&", ";;"}


@dataclass
class Directive:
    line: int
    key: str          # long name: "ntasks-per-node"
    value: str        # "" for a flag


@dataclass
class Script:
    text: str
    directives: list = field(default_factory=list)     # [Directive] that sbatch reads
    ignored: list = field(default_factory=list)        # [(line, text)]: #SBATCH after the first command
    misspelt: list = field(default_factory=list)       # [(line, text)]: looks like a directive, is a comment
    exports: dict = field(default_factory=dict)        # NAME -> (line, value) for export NAME=... lines
    assigned: set = field(default_factory=set)         # names set without export
    commands: list = field(default_factory=list)       # [(line, text)]: logical command lines (continuations joined)
    values: dict = field(default_factory=dict)         # NAME -> (line, value) of the last NAME=... (export or not)
    simple: list = field(default_factory=list)         # [Simple]: the simple commands, in order
    unread: list = field(default_factory=list)         # [(line, FILE, folders)]: srun's wrapper, not found there

    def get(self, key: str, default: str | None = None) -> str | None:
        """The value of the last directive ``key`` (sbatch takes the last one)."""
        return next((d.value for d in reversed(self.directives) if d.key == key), default)


@dataclass
class Simple:
    """One simple command of a line (``a && b & c`` has three), as bash runs it."""
    line: int
    words: list                  # the command's words, NAME=VALUE prefixes left out
    env: dict                    # NAME -> VALUE given on the command itself (``MASTER_ADDR=x srun ...``)
    background: bool             # ended by a single ``&``: the script goes on without waiting for it

    @property
    def name(self) -> str:
        return self.words[0].rsplit("/", 1)[-1] if self.words else ""


def _masked(command: str) -> str:
    """``command`` with each ``$(...)``, ``$((...))`` and backtick substitution as one placeholder word part,
    so that the separators inside it do not split the command it belongs to."""
    out, i = [], 0
    while i < len(command):
        if command.startswith("$(", i):
            depth, j = 0, i + 1
            while j < len(command):
                depth += {"(": 1, ")": -1}.get(command[j], 0)
                if depth == 0:
                    break
                j += 1
            out.append("SUBST")
            i = j + 1
        elif command[i] == "`" and "`" in command[i + 1:]:
            out.append("SUBST")
            i = command.index("`", i + 1) + 1
        else:
            out.append(command[i])
            i += 1
    return "".join(out)


def simple_commands(number: int, command: str) -> list[Simple]:
    """The simple commands of one logical line, split at ; & && || | outside substitutions."""
    lexer = shlex.shlex(_masked(command), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        tokens = command.split()
    out, words = [], []
    for token in tokens + [";"]:
        if token not in SEPARATORS:
            words.append(token)
            continue
        if words:
            lead = 0
            while lead < len(words) - 1 and NAME_VALUE.match(words[lead]):
                lead += 1
            env = dict(w.split("=", 1) for w in words[:lead])
            out.append(Simple(number, words[lead:], env, token == "&"))
        words = []
    return out


def _directive(number: int, rest: str) -> list[Directive]:
    out = []
    try:
        words = shlex.split(rest, comments=True)
    except ValueError:
        words = rest.split()
    for w in words:
        if w.startswith("--"):
            key, _, value = w[2:].partition("=")
            out.append(Directive(number, key, value))
        elif w.startswith("-") and len(w) >= 2:
            out.append(Directive(number, SHORT.get(w[1], w[1]), w[2:].lstrip("=")))
        elif out and not out[-1].value:
            out[-1].value = w        # "--nodes 2" and "-N 2"
    return out


def parse(text: str) -> Script:
    s = Script(text)
    header = True
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            (s.directives.extend(_directive(number, stripped[7:])) if header
             else s.ignored.append((number, stripped)))
            continue
        if header and MISSPELT.match(stripped):
            s.misspelt.append((number, stripped))
        if not stripped or stripped.startswith("#"):
            continue
        header = False
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        command, pending = pending + stripped, ""
        s.commands.append((start, command))
        s.simple.extend(simple_commands(start, command))
        _assignments(s, start, command)
    return s


def _assignments(s: Script, number: int, command: str) -> None:
    m, names, plain = EXPORT.match(command), EXPORT_NAMES.match(command), ASSIGN.match(command)
    first = next((c for c in s.simple if c.line == number), None)
    if m:
        s.exports[m.group(1)] = s.values[m.group(1)] = (number, m.group(2))
    elif names:                          # NAME=...; export NAME: exported from here on, with the value set
        for name in names.group(1).split():
            s.exports[name] = s.values.get(name, (number, ""))
    elif plain and not (first is not None and first.words and plain.group(1) in first.env):
        # (``NAME=x srun ...`` gives NAME to that command only: not the script's variable)
        s.assigned.add(plain.group(1))
        s.values[plain.group(1)] = (number, plain.group(2))


def integer(value: str | None) -> int | None:
    """``"2"`` -> 2; a range (``1-2``) or anything else -> None."""
    return int(value) if value is not None and value.isdigit() else None


def gpu_count(value: str | None) -> int | None:
    """``--gres=gpu:2`` / ``gpu:a100:2`` / ``--gpus-per-node=a100:4`` -> the number (None when absent)."""
    if not value:
        return None
    last = value.split(",")[0].split(":")[-1]
    return int(last) if last.isdigit() else (1 if value.startswith("gpu") else None)
