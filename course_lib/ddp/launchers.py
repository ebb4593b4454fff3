"""Step 6: which launch styles work (srun's SLURM_* variables, torchrun's RANK/...), with more ranks too,
and a clean shutdown (every rank leaves the process group; no process aborts after the script ends)."""
from __future__ import annotations

from pathlib import Path

from course_lib.ddp.failures import describe_failure
from course_lib.ddp.messages import ENV_HELP, first
from course_lib.ddp.runs import Run, works
from course_lib.ddp.steps import step1


def _why_not(run: Run, script: Path, primary: Run | None, failure) -> str:
    """One line on why a launch style did not work."""
    if run is primary and failure is not None:
        return first(failure.message, 300)
    f = describe_failure(run, script)
    if f is not None:
        return first(f.message, 300)
    ok1 = step1(run)
    why = first(ok1[1], 300) if ok1 and not ok1[0] else "the ranks did not form one group"
    return f"{why}" + (" (see Step 1)" if run is primary else "")


def step6(runs: dict, primary: Run, more: Run | None, script: Path, failure=None, failure_step=None):
    good = [s for s, run in runs.items() if works(run)]
    bad = [(s, _why_not(run, script, primary, failure)) for s, run in runs.items() if not works(run)]
    if not good and failure is not None:
        if failure_step == 6:
            return False, f"did not run to the end under {' or '.join(runs)}: {failure.message}"
        return False, f"did not run to the end under {' or '.join(runs)} (see Step {failure_step})"
    if bad:
        return False, _works_under(runs, good, bad)
    # every launch style tried works: now the shutdown, and more ranks
    unclean = _unclean_shutdown(runs, primary, good)
    if unclean:
        return False, unclean
    n = primary.nprocs
    msg = f"works under {' and '.join(good)}"
    if more is not None:
        if not works(more):
            why = _why_not(more, script, None, None)
            return False, f"works with {n} ranks but not with {more.nprocs} ({more.style}): {why}"
        msg += f", with {n} and {more.nprocs} ranks"
    msg += "; every rank leaves the process group"
    if any(d.get("ddp_alive") for r in range(n) for d in primary.rec(r).get("destroy", [])):
        msg += (" (note: the DDP model was still alive at destroy_process_group(); with Gloo that aborts now and then "
                "at exit: `del model; gc.collect()` first)")
    return True, msg


def _works_under(runs: dict, good: list, bad: list) -> str:
    """'works under srun only; under torchrun: why', and which launcher variables the script reads."""
    reads = sorted({k for run in runs.values() for r in range(run.nprocs) for k in run.rec(r).get("env_reads", [])})
    if len(bad) > 1 and len({why.replace(" (see Step 1)", "") for _, why in bad}) == 1:
        bad = [(" and ".join(s for s, _ in bad), bad[0][1])]   # the same reason everywhere: say it once
    text = (f"works under {' and '.join(good)} only" if good else "works under no launcher") + "; " + "; ".join(
        f"under {s}: {why}" for s, why in bad)
    if good and reads:
        text += f"\nThe script reads {', '.join(reads)}. {ENV_HELP}: support both."
    return text


def _unclean_shutdown(runs: dict, primary: Run, good: list) -> str | None:
    """A rank that never left the group, or a process that failed after the script ended."""
    never = [r for r in range(primary.nprocs) if not primary.rec(r).get("destroy")]
    if never:
        return (f"works under {' and '.join(good)}, but rank{'s' if len(never) > 1 else ''} "
                f"{', '.join(map(str, never))} never called dist.destroy_process_group(): leave the group at "
                "the end (after `del model` and gc.collect()).")
    aborted = [(run.style, r.rank, r.returncode) for run in runs.values() for r in run.result.ranks if r.returncode]
    if aborted:
        s, r, c = aborted[0]
        return (f"under {s}, rank {r} finished the script, but then the process exited with code {c}: an "
                "unclean shutdown. Drop the DDP model (del model; gc.collect()) before dist.destroy_process_group().")
    return None
