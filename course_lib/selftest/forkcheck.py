"""The warm-fork-cuda item: ranks forked by the warm fork server (``course_lib.core.warm``) must be able to
use CUDA, and a child forked after CUDA was initialised must be recognised (the control run)."""
from __future__ import annotations

import re
from pathlib import Path

from course_lib.selftest.runs import FAIL, PASS, Context, Outcome, child_env, python, run_command

RANKS = 2
RANK_LINE = re.compile(r"fork_rank rank=(\S+) warm=(\w+) bad_fork=(\w+) cuda=(.*)")
CONTROL_LINE = re.compile(r"fork_control parent_cuda=(.*?) child: bad_fork=(\w+) cuda=(.*)")


def judge(rank_text: list[str], control_text: str) -> Outcome:
    """The verdict from each rank's output and the control's: PASS when every rank was forked warm, is not
    in a bad fork and ran a CUDA op, and the control's child was seen as a bad fork (the detection works)."""
    ranks = [RANK_LINE.search(t) for t in rank_text]
    if not all(ranks):
        return Outcome(FAIL, f"rank(s) {[r for r, m in enumerate(ranks) if not m]} printed no fork_rank line")
    cold = [m.group(1) for m in ranks if m.group(2) != "yes"]
    forked_bad = [f"rank {m.group(1)}: {m.group(4)}" for m in ranks if m.group(3) != "no"]
    if forked_bad:
        return Outcome(FAIL, "a rank forked by the warm server is a bad fork (the server initialised CUDA before "
                             "it forked): " + "; ".join(forked_bad))
    failed = [f"rank {m.group(1)}: {m.group(4)}" for m in ranks if m.group(4) != "ok"]
    if failed:
        return Outcome(FAIL, "a CUDA op failed in a warm-forked rank (not marked a bad fork): " + "; ".join(failed))
    if cold:
        return Outcome(FAIL, f"rank(s) {', '.join(cold)} started cold: the warm fork path was not tested")
    c = CONTROL_LINE.search(control_text)
    if not c:
        return Outcome(FAIL, f"the control printed no fork_control line: {control_text[-300:]}")
    if c.group(1) != "ok" or c.group(2) != "yes" or c.group(3) == "ok":
        return Outcome(FAIL, f"control (CUDA initialised, then fork): parent cuda={c.group(1)}, child "
                             f"bad_fork={c.group(2)} cuda={c.group(3)}; expected the child to be refused")
    return Outcome(PASS, f"{len(ranks)} warm-forked ranks ran CUDA ops (no bad fork); control: a child forked "
                         f"after CUDA init is marked bad and refused ({c.group(3)[:90]})")


def fork_ranks(folder: Path, timeout: float) -> list[str]:
    """What each of RANKS ranks of fork_rank, forked by the warm server, printed. ``folder`` is made absolute
    first: the server runs in a folder of its own and would resolve a relative cwd there (the rank could not
    start, its error lost in ``os._exit``). The ranks, and the server, get this course_lib on their path
    (``child_env``): the device's own python has no course installed."""
    from course_lib.core.launch import launch

    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    res = launch(["-m", "course_lib.selftest.fork_rank"], nprocs=RANKS, timeout=timeout, cwd=folder,
                 env=child_env(), on_line=None, warm=True)
    (folder / "ranks.log").write_text(res.summary() + "\n")
    return [res.output(r) for r in range(RANKS)]


def warm_fork_cuda(ctx: Context) -> Outcome:
    folder = ctx.folder.resolve()
    texts = fork_ranks(folder, ctx.timeout / 2)
    ran = run_command(python("-m", "course_lib.selftest.fork_rank", "--control"), folder / "control.log",
                      ctx.timeout / 2, cwd=folder)
    return judge(texts, ran.text)
