"""Run a learner's training script as one rank, watching what it does from outside its code.

    python -m course_lib.ddp.probe SCRIPT [ARGS...]     (one per rank, via course_lib.runtime.launch)

Before the script runs (``runpy``, as ``python SCRIPT ARGS`` would), the probe wraps the parts of torch
that the six DDP steps touch (``hooks``, ``datahooks``) and writes what it saw to
``$COURSE_PROBE_DIR/rank-<N>.json`` (N: the launcher's rank; ``recorder``). A rank that waits in a collective
longer than ``$COURSE_PROBE_STALL`` seconds, or runs longer than ``$COURSE_PROBE_HANG`` seconds, dumps its stack
to ``stack-<N>.txt`` and exits. Rank 0's checkpoint is judged here (``hooks.note_checkpoint``): the checker then
needs no torch of its own.
"""
import faulthandler
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from course_lib.checking.deadlock import Stalls
from course_lib.core.rankkit import RankEnvError, exit_now, rank_env
from course_lib.ddp import datahooks, hooks, simulate
from course_lib.ddp.recorder import COLLECTIVES, Recorder, describe
from course_lib.runtime.job import read_json


def _where(e: BaseException, rec: Recorder) -> dict:
    """File, line and source line of the deepest frame of the learner's code in ``e``'s traceback."""
    if isinstance(e, SyntaxError):
        return {"file": e.filename, "line": e.lineno, "code": (e.text or "").strip()}
    return rec.place(traceback.extract_tb(e.__traceback__))


def _watch_collectives(rec: Recorder, stall: float, stack, folder: Path, world: int) -> None:
    """A daemon thread: a collective (or the rendezvous) that cannot finish is a deadlock.

    Two ways to know: every rank of the launch has waited in a collective (or has ended) for ``grace`` seconds
    with none finishing one (``checking.deadlock.Stalls``: each rank's ``waiting-<N>`` file in the probe
    folder), or this rank alone waited longer than ``stall``. Collectives release the GIL while they wait, so this
    thread runs; it dumps every thread's stack and ends the process, which spares the checker from waiting for its
    deadline.
    """
    # not stretched by the load: the stall and the launch's deadline bound a training run here, not a case
    # a rank whose record has its exit has ended, and will free no one
    ended = lambda r: read_json(folder / f"rank-{r}.json").get("exit") is not None   # noqa: E731
    stalls = Stalls(folder, rec.rank, world, ended=ended, by_load=False)
    # a matched collective of the small tensors a training script reduces ends in milliseconds, even on a loaded
    # machine: a few seconds of every rank waiting at once leave a wide margin
    grace = max(3.0, stall / 10)

    def watch():
        while True:
            time.sleep(0.25)
            name, since = rec.data["in_call"], rec.call_since
            now = time.monotonic()
            waiting = (name is not None and since is not None
                       and (name in COLLECTIVES or name == "init_process_group"))
            stalls.note(since if waiting else None)
            if not waiting:
                continue
            slow = 2 if name == "init_process_group" else 1   # peers may still be starting
            everyone = stalls.everyone_waiting(grace * slow)
            seen = stalls.announced()   # another rank saw every rank wait: so do I
            if now - since > stall * slow or seen or everyone:
                rec.data["stalled"] = {"call": name, "seconds": round(now - since, 1), "all_ranks": everyone}
                rec.write()
                faulthandler.dump_traceback(file=stack, all_threads=True)
                stack.flush()
                if everyone and not seen:
                    stalls.announce()
                    time.sleep(1.0)   # the others note where they wait before this rank's exit breaks their wait
                exit_now(3)

    threading.Thread(target=watch, name="course-probe-watchdog", daemon=True).start()


def _arm_deadlines(rec: Recorder, folder: Path, world: int) -> None:
    """A deadlock: dump every thread's stack, then exit; a SIGTERM from the launcher: dump, then die."""
    stack = open(folder / f"stack-{rec.rank}.txt", "w")   # open until the process ends
    hang = float(os.environ.get("COURSE_PROBE_HANG", "0") or 0)
    if hang > 0:
        faulthandler.dump_traceback_later(hang, exit=True, file=stack)
    faulthandler.register(signal.SIGTERM, file=stack, all_threads=True, chain=True)
    stall = float(os.environ.get("COURSE_PROBE_STALL", "0") or 0)
    if stall > 0:
        _watch_collectives(rec, stall, stack, folder, world)


def _run(rec: Recorder, script: Path, args: list) -> int:
    """Run the script as ``python SCRIPT ARGS`` would; note how it ended in the record. Returns the exit code."""
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))   # as `python SCRIPT` does
    code = 0
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        rec.data["exit"] = {"code": code, "message": None if isinstance(e.code, (int, type(None))) else str(e.code),
                            "phase": rec.data["phase"], "where": _where(e, rec)}
        if code and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - whatever the learner's code raised is reported, then exits 1
        code = 1
        rec.data["exit"] = {"code": 1, "error": describe(e), "type": type(e).__name__,
                            "phase": rec.data["phase"], "where": _where(e, rec), "in": rec.data.get("error_in")}
        tb = e.__traceback__   # from the learner's first frame on: the probe's and runpy's frames are noise
        while tb is not None and Path(tb.tb_frame.f_code.co_filename) != script:
            tb = tb.tb_next
        traceback.print_exception(type(e), e, None if isinstance(e, SyntaxError) else tb or e.__traceback__)
    else:
        rec.data["exit"] = {"code": 0, "phase": rec.data["phase"]}
    finally:
        faulthandler.cancel_dump_traceback_later()
        if code == 0:
            hooks.note_checkpoint(rec)
        rec.write_params()
        rec.write()
    return code


def main() -> int:
    argv = sys.argv[1:]
    if not argv:
        print("usage: python -m course_lib.ddp.probe SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script = Path(argv[0]).resolve()
    folder = Path(os.environ.get("COURSE_PROBE_DIR") or ".")
    folder.mkdir(parents=True, exist_ok=True)
    try:   # the rank and world size the launcher gave (torchrun's, else srun's)
        env = rank_env()
        rank, world = env.rank, env.world_size
    except RankEnvError:
        rank, world = 0, 1
    rec = Recorder(folder, rank, script)
    _arm_deadlines(rec, folder, world)
    simulate.install(rec, folder)   # first: the hooks below wrap what a simulated layout or GPU installs
    hooks.install(rec)
    datahooks.install(rec)
    rec.write()
    code = _run(rec, script, argv[1:])
    # a normal return, not exit_now: the interpreter's own shutdown is part of Step 6 (a clean exit)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
