"""Step 6: which launch styles work (srun's SLURM_* variables, torchrun's RANK/...), with more ranks too,
and a clean shutdown (every rank leaves the process group; no process aborts after the script ends).

A script written for one launcher (the ENCCS slides show a separate srun script and torchrun script) passes
when it runs cleanly under the launcher whose variables it reads; the verdict names the other launcher and
how to support it. A launcher whose own variables the script reads must work. ``strict=True`` (an
instructor who teaches one script for both) requires every launcher tried to work."""
import signal
from pathlib import Path

from course_lib.ddp.cluster import layout_text
from course_lib.ddp.failures import describe_failure
from course_lib.ddp.messages import ENV_HELP, cut, first, ranks_text, tail
from course_lib.ddp.runs import Run, ended, works
from course_lib.ddp.steps import step1

# the variables each launcher sets for its ranks: a script that reads them means to run under that launcher
OWN_VARS = {"srun": {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NODEID"},
            "torchrun": {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}}
SUPPORT = {"srun": "read SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS when RANK is not set",
           "torchrun": "read RANK, LOCAL_RANK and WORLD_SIZE when they are set (first: torchrun inside a Slurm job "
                       "sees both)"}


def _why_not(run: Run, script: Path, primary: Run | None, failure) -> str:
    """One line on why a launch style did not work."""
    f = failure if run is primary and failure is not None else describe_failure(run, script)
    if f is not None:   # its first line: who, what (first sentence) and where
        return cut(f.message.splitlines()[0], 300)
    if ended(run):   # the script ended well on every rank: what failed came after its end
        return _exit_after_end(run)[1]
    ok1 = step1(run)
    why = first(ok1[1], 300) if ok1 and not ok1[0] else "the ranks did not form one group"
    return why + (" (see Step 1)" if run is primary else "")


def reads_own_vars(run: Run) -> list[str]:
    """The variables of the launcher ``run`` was started by that the script read: it means to support it."""
    reads = {k for r in range(run.nprocs) for k in run.rec(r).get("env_reads", [])}
    return sorted(reads & OWN_VARS.get(run.style, set()))


def step6(runs: dict, primary: Run, more: Run | None, script: Path, failure=None, failure_step=None,
          strict: bool = False, also: tuple = ()):
    """``also``: more launches it works under, named after the styles ("`srun torchrun`")."""
    good = [s for s, run in runs.items() if works(run)]
    bad = [(s, _why_not(run, script, primary, failure)) for s, run in runs.items() if not works(run)]
    if not good and failure is not None:
        if failure_step == 6:
            return False, f"did not run to the end under {' or '.join(runs)}: {failure.message}"
        return False, (f"did not run to the end under {' or '.join(runs)} (Step {failure_step}): "
                       f"{failure.message.splitlines()[0]}")
    done = {s: run for s, run in runs.items() if ended(run)}
    unclean = _unclean_shutdown(done, primary, [s for s in good if s in done]) if len(done) > len(good) else None
    if unclean:   # a process that failed after the script's end, where it runs as meant: that, not the launcher
        return False, unclean
    tried = [s for s, _ in bad if reads_own_vars(runs[s])]
    if bad and (strict or not good or tried):
        return False, _works_under(runs, good, bad, strict, tried)
    # every launch style the script means to support works: now the shutdown, and more ranks
    unclean = _unclean_shutdown({s: runs[s] for s in good}, primary, good)
    if unclean:
        return False, unclean
    n = primary.nprocs
    if bad:
        msg = f"works under {' and '.join(good)} only (the launcher the script reads)" + (
            f", and under {' and '.join(also)}" if also else "")
    else:
        names = [*good, *also]
        msg = f"works under {', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else f"works under {names[0]}"
    if more is not None:
        if not works(more):
            why = _why_not(more, script, None, None)
            return False, f"works with {n} ranks but not with {more.nprocs} ({more.style}): {why}"
        msg += f", with {n} and {more.nprocs} ranks" + (f" ({layout_text(more)})" if more.rec(0).get("layout") else "")
    msg += "; every rank leaves the process group"
    alive = [d for r in range(n) for d in primary.rec(r).get("destroy", []) if d.get("ddp_alive")]
    if alive:
        msg += _alive_note(alive[0].get("held_by") or [])
    if bad:
        msg += "\n" + _other_launchers(runs, good, bad)
    return True, msg


def _alive_note(held: list) -> str:
    """The DDP model outlived destroy_process_group(): by which names, and how to drop them."""
    if not held:
        return (" (note: the DDP model was still alive at destroy_process_group(); with Gloo that aborts now and then "
                "at exit: `del model; gc.collect()` first)")
    names = [h.split("`")[1] for h in held if h.startswith("`")]
    drop = f"`del {', '.join(names)}`" if names else "drop it"
    return (f" (note: the DDP model was still alive at destroy_process_group(), held by {', '.join(held)}; with Gloo "
            f"that aborts now and then at exit: {drop} (every name that refers to it), then gc.collect(), first)")


def _other_launchers(runs: dict, good: list, bad: list) -> str:
    """The launchers a one-launcher script does not support: why, and how to support them too."""
    reads = sorted({k for s in good for k in reads_own_vars(runs[s])})
    text = "; ".join(f"under {s}: {why}" for s, why in bad)
    how = "; ".join(f"to run under {s} too, {SUPPORT[s]}" for s, _ in bad)
    read = f"reads {', '.join(reads)}" if reads else "runs"
    return (f"{text[0].upper()}{text[1:]}. The script {read} under {' and '.join(good)}: a script for one launcher "
            f"is fine here. {how[0].upper()}{how[1:]} ({ENV_HELP}). "
            "An instructor may require both launchers (course check ddp --strict-launchers).")


def _works_under(runs: dict, good: list, bad: list, strict: bool, tried: list) -> str:
    """'works under srun only; under torchrun: why', and which launcher variables the script reads."""
    reads = sorted({k for run in runs.values() for r in range(run.nprocs) for k in run.rec(r).get("env_reads", [])})
    if len(bad) > 1 and len({why.replace(" (see Step 1)", "") for _, why in bad}) == 1:
        bad = [(" and ".join(s for s, _ in bad), bad[0][1])]   # the same reason everywhere: say it once
    text = (f"works under {' and '.join(good)} only" if good else "works under no launcher") + "; " + "; ".join(
        f"under {s}: {why}" for s, why in bad)
    if good and tried:
        own = ", ".join(k for s in tried for k in reads_own_vars(runs[s]))
        text += (f"\nThe script reads {own}, so it means to run under {' and '.join(tried)} too, but it fails "
                 "there: fix that launcher's branch (or drop it, if the script is meant for one launcher only).")
    elif good and reads:
        text += f"\nThe script reads {', '.join(reads)}. {ENV_HELP}: support both"
        text += (" (required here: --strict-launchers)." if strict else ".")
    return text


def _unclean_shutdown(runs: dict, primary: Run, good: list) -> str | None:
    """A rank that never left the group, or a process that failed after the script ended."""
    never = [r for r in range(primary.nprocs) if not primary.rec(r).get("destroy")]
    if never:
        return (f"works under {' and '.join(good)}, but {ranks_text(never)} never called "
                "dist.destroy_process_group(): leave the group at the end (after `del model` and gc.collect()).")
    for style, run in runs.items():
        rank, what, advice = _exit_after_end(run)
        if rank is not None:
            return f"under {style}, {what}. {advice}\n{tail(run, rank)}"
    return None


def _exit_after_end(run: Run) -> tuple[int | None, str, str]:
    """(rank, 'rank 1 finished the script, but then its process ...', what to do) for the first rank whose process
    failed after the script's last line (an exit abort, an atexit handler's exit code, an exit that never came);
    (None, "", "") when none did."""
    for r in run.result.ranks:
        if r.returncode is None and run.result.timed_out:   # python waits for non-daemon threads before it exits
            return r.rank, (f"rank {r.rank} finished the script, but its process had not exited when the launch's "
                            f"deadline ({run.result.elapsed:.0f} s) stopped it"), (
                "A non-daemon thread still running, or an atexit handler that waits, keeps `python script.py` from "
                "exiting too: join or stop what the script started before its end.")
        if r.returncode:
            how = (f"was killed by {signal.Signals(-r.returncode).name}" if r.returncode < 0
                   else f"exited with code {r.returncode}")
            return r.rank, f"rank {r.rank} finished the script, but then its process {how}", (
                "An unclean shutdown, which `python script.py` shows too. With Gloo the usual cause is the DDP model "
                "still alive at exit: `del model; gc.collect()` before dist.destroy_process_group(). Anything the "
                "script does at exit (atexit, __del__, threads) counts.")
    return None, "", ""
