"""The warm-fork-cuda item: ranks forked by the warm fork server (``course_lib.runtime.warm``) must be able to
use CUDA, and a child forked after CUDA was initialised must be recognised (the control run)."""
import re

from course_lib.selftest.runs import FAIL, PASS, Context, Outcome, python, run_command, run_ranks

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


def warm_fork_cuda(ctx: Context) -> Outcome:
    """RANKS ranks of ``ranks fork_rank``, forked by the warm server, then the control run cold. The ranks, and
    the server, get this course_lib on their path (``child_env``): the device's own python has no course installed."""
    half = Context(ctx.probe, ctx.folder.resolve(), ctx.timeout / 2)
    res = run_ranks(half, ["-m", "course_lib.selftest.ranks", "fork_rank"], RANKS, warm=True)
    ran = run_command(python("-m", "course_lib.selftest.ranks", "fork_rank", "--control"), half.folder / "control.log",
                      half.timeout, cwd=half.folder)
    return judge([res.output(r) for r in range(RANKS)], ran.text)
