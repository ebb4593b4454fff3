"""The checking harness's checker side, on records made by hand (unit tests; the checkers' own tests run it for real):
how markers become one record per case, and how records become a report."""
from types import SimpleNamespace

from course_lib.checking.runner import CaseRecord, Launch
from course_lib.checking.summary import describe, summarise
from course_lib.core.rankkit import PREFIX
from course_lib.core.report import Report


def marker(**fields) -> str:
    import json
    return PREFIX + json.dumps(fields)


def test_a_deadline_that_fired_makes_the_case_a_hang_even_when_every_rank_gave_a_verdict():
    # rank 1 returned a wrong answer and waited for rank 0 in the harness's agreement; its deadline fired first, and
    # rank 0, stuck in the learner's all-reduce, then saw the connection close (tp: only rank 0 reduces in backward)
    run = Launch(2, 10.0)
    for rank in (0, 1):
        run.on_line(rank, marker(ev="start", case="f@2", item="f", label="tp=2"))
    run.on_line(1, marker(ev="verdict", case="f@2", item="f", rank=1, ok=False, message="backward must all-reduce",
                          kind="fail"))
    run.on_line(0, marker(ev="verdict", case="f@2", item="f", rank=0, ok=False, kind="peer_gone",
                          message="RuntimeError: Connection closed by peer", where="tp.py:57 in backward: all_reduce"))
    run.on_line(1, marker(ev="stuck", case="f@2", where=""))
    run.close(SimpleNamespace(timed_out=False, ranks=[]))
    [rec] = run.records.values()
    assert rec.ended == "hung" and rec.failed
    msg = describe(rec, "HINT")
    head = "tp=2: did not finish (deadlock or hang): ranks [0] did not return within 10 s (ranks [1] did)"
    assert msg.startswith(head), msg
    assert "rank 0 was waiting at tp.py:57 in backward: all_reduce (until its partner's connection closed)" in msg
    assert msg.endswith("hint: HINT\nrank 1: backward must all-reduce"), msg


def test_a_rank_that_died_in_a_case_is_not_called_a_hang():
    run = Launch(2, 10.0)
    run.on_line(0, marker(ev="start", case="c@2", item="c", label=""))
    run.on_line(0, "Segmentation fault")
    run.close(SimpleNamespace(timed_out=False, ranks=[SimpleNamespace(rank=0, returncode=-11)]))
    [rec] = run.records.values()
    assert rec.ended.startswith("a rank exited during the case (rank 0: -11)")
    assert "rank 0: Segmentation fault" in rec.ended


def test_ranks_that_all_died_in_a_case_are_named_at_their_lines():
    # ring_float32_scratch at W=3: every rank receives more bytes than its buffer holds, and gloo aborts all three
    # before any returns a verdict (about 1 run in 10 under load); the message still names them and their lines
    run = Launch(3, 10.0)
    for r in range(3):
        run.on_line(r, marker(ev="start", case="ring@3", item="ring", label="W=3"))
        run.on_line(r, "  what():  ... Received data size doesn't match expected size.")
    run.crashes = {r: f"allreduce.py:78 in sendrecv: req.wait() [{r}]" for r in range(3)}
    run.close(SimpleNamespace(timed_out=False, ranks=[SimpleNamespace(rank=r, returncode=-6) for r in range(3)]))
    [rec] = run.records.values()
    msg = describe(rec, "HINT")
    assert msg.startswith("W=3: ranks [0, 1, 2] ended during the call (a rank exited during the case (rank 0: -6"), msg
    for r in range(3):
        assert f"rank {r} died at allreduce.py:78 in sendrecv: req.wait() [{r}]" in msg, msg
        assert f"rank {r}:   what():  ... Received data size doesn't match" in msg, msg


def test_summarise_one_verdict_per_item_in_order():
    from course_lib.checking.protocol import Plugin
    spec = Plugin(FILE="f.py", LOAD_ITEM="f.py", ITEMS=("a", "b", "c", "d"), WORLDS=(2,), GUARD=((), "count"),
                  cases=lambda world: [], BUILT_ON={"c": ("a",)}, HANG_HINTS={})
    ok = {"ok": True, "message": "fine"}

    def rec(item, world, **verdicts):
        return CaseRecord(f"{item}@{world}", item, f"W={world}", world,
                          verdicts={int(r[1:]): v for r, v in verdicts.items()})
    records = [rec("c", 2, r0=ok, r1={"ok": False, "message": "wrong", "kind": "fail"}),
               rec("a", 2, r0={"ok": False, "message": "no a", "missing": True}, r1=ok),
               rec("b", 2, r0=ok, r1=ok), rec("b", 4, r0=ok, r1=ok, r2=ok, r3=ok)]
    report = summarise(Report("x", "x.py"), spec, records, ["the worker crashed"])
    got = [(v.item, v.result, v.message) for v in report.verdicts]
    assert got == [("a", "missing", "no a"), ("b", "pass", "fine"),
                   ("c", "fail", "W=2: rank 1: wrong\n(c is built on a: fix that first)"),
                   ("check run", "fail", "the worker crashed")]
