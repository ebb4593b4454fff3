"""`course check allreduce`: the solution passes, the starter fails per function, and each faulty
submission in tests/allreduce_faulty/cases.py fails at the right function for the right reason (real gloo ranks)."""
import re
import subprocess
import sys

import pytest
from allreduce_faulty.cases import CASES
from conftest import ROOT, live_processes
from faulty import ids

from course_lib.allreduce import cases as worker
from course_lib.allreduce.cases import FUNCTIONS, check
from course_lib.checking import worker as rank_worker

FAULTY = ROOT / "tests" / "allreduce_faulty"
SOLUTION = ROOT / "solutions" / "05_allreduce" / "allreduce.py"
STARTER = ROOT / "exercises" / "05_allreduce" / "allreduce.py"
# a case expecting "import" is a file that does not load: one verdict, not one per function
PER_FUNCTION = [c for c in CASES if "import" not in c.expect]
SYNTAX_ERROR = next(c for c in CASES if c.name == "syntax_error")


def test_every_case_applies_and_every_file_is_used():
    for case in CASES:
        case.source(SOLUTION, FAULTY)   # each edit's old text occurs exactly once in the solution
    assert {c.file for c in CASES if c.file} == {p.name for p in FAULTY.glob("*.py")} - {"cases.py"}
    assert len(set(ids(CASES))) == len(CASES)


def test_cases_cover_the_edges():
    for world in (1, 2, 3, 5):
        cases = worker.shapes(world)
        counts = {c["shape"][0] for c in cases if len(c["shape"]) == 1}
        assert {0, 1, max(world - 1, 0), world + 1, worker.PRIME, worker.BIG} <= counts
        assert {c["dtype"] for c in cases} == {"float32", "float64", "int64"}
        assert len({(tuple(c["shape"]), c["dtype"]) for c in cases}) == len(cases)


def test_diagnose_names_the_mistake():
    import torch
    x = [torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), torch.tensor([4.0, 5.0, 6.0], dtype=torch.float64)]
    total = x[0] + x[1]
    assert "the mean" in worker.diagnose(total / 2, total, x[0], 2)
    assert "still holds this rank's input" in worker.diagnose(x[0].clone(), total, x[0], 2)
    tail = total.clone()
    tail[2] = 0
    msg = worker.diagnose(tail, total, x[0], 2)
    assert "1 of 3 elements wrong (indices 2..2)" in msg and "chunk boundaries" in msg


@pytest.mark.slow
def test_a_closed_connection_after_a_hang_is_reported_as_the_hang():
    """On a loaded machine the stuck ranks' watchdogs can end them before the last rank's fires; that rank then
    sees a closed connection (CI: tree_pow2_only at W=3). The verdict is the deadlock, with where each waited."""
    from course_lib.checking.runner import CaseRecord
    from course_lib.checking.summary import describe

    gone = "raised DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. (at allreduce.py:122)"
    assert rank_worker.peer_gone(RuntimeError(gone))
    assert not rank_worker.peer_gone(ValueError("Invalid destination rank"))
    rec = CaseRecord("tree_allreduce:0@3", "tree_allreduce", "W=3, 1,009 elements, float32", 3, started={0, 1, 2},
                     verdicts={2: {"ok": False, "kind": "peer_gone", "message": gone, "where": "allreduce.py:122"}},
                     stuck={0: "allreduce.py:124", 1: "allreduce.py:124"}, seconds=10, ended="hung")
    msg = describe(rec, "hint")
    assert re.search(r"W=3.*deadlock.*ranks \[0, 1, 2\]", msg) and "rank 1 was waiting at allreduce.py:124" in msg
    assert "rank 2 was waiting at allreduce.py:122 (until its partner's connection closed)" in msg, msg
    # a rank's own error stays the reason, and so does a closed connection where no partner was stuck
    rec.verdicts[2]["kind"] = "error"
    assert describe(rec, "hint").startswith("W=3, 1,009 elements, float32: rank 2: raised")
    rec.verdicts[2]["kind"], rec.stuck, rec.ended = "peer_gone", {}, "a rank exited during the case"
    assert "deadlock" not in describe(rec, "hint")


def test_solution_passes():
    report = check(str(SOLUTION))
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == list(FUNCTIONS)
    print(report.text())


@pytest.mark.slow
def test_starter_fails_fast_with_a_message_per_function():
    proc = subprocess.run([sys.executable, "-m", "course_lib.cli", "check", "allreduce", str(STARTER)],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    print(proc.stdout)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for fn in FUNCTIONS:
        assert re.search(rf"FAIL\s+{fn}\s+W=\d.*not written yet \(NotImplementedError: {fn}: ", proc.stdout), fn
    seconds = float(re.search(r"passed in ([\d.]+) s", proc.stdout).group(1))
    assert seconds < 120, "the starter must fail at once, not run into deadlines"


def test_syntax_error_is_one_verdict(tmp_path):
    path = SYNTAX_ERROR.write(SOLUTION, FAULTY, tmp_path)
    report = check(str(path), **SYNTAX_ERROR.options)
    assert [(v.item, v.result) for v in report.verdicts] == [("import", "fail")]
    assert re.search(SYNTAX_ERROR.pattern("import", path.read_text()), report.verdicts[0].message), report.text()


@pytest.mark.slow
@pytest.mark.parametrize("case", PER_FUNCTION, ids=ids(PER_FUNCTION))
def test_faulty_submission_is_caught(tmp_path, case):
    path = case.write(SOLUTION, FAULTY, tmp_path)
    text = path.read_text()
    report = check(str(path), case_timeout=6, **case.options)
    print(report.text())
    got = {v.item: v for v in report.verdicts}
    assert list(got) == list(FUNCTIONS), report.text()
    for fn in FUNCTIONS:
        result = case.expect.get(fn, ("pass", ""))[0]
        pattern = case.pattern(fn, text) if fn in case.expect else ""
        assert got[fn].result == result, f"{fn}: {report.text()}"
        assert re.search(pattern, got[fn].message, re.S), f"{fn}: {got[fn].message}"
    assert not live_processes(rank_worker.__name__, str(path)), "a worker process survived the check"


def test_a_hang_states_the_real_wait():
    """The watchdog's deadline runs on a core's fair share: on a loaded machine a 10 s deadline fires later. The
    message says how long the case really waited (start marker to the last stuck marker), not the deadline."""
    import json
    import time
    from types import SimpleNamespace

    from course_lib.checking.runner import Launch
    from course_lib.checking.summary import describe
    from course_lib.core.rankkit import PREFIX
    run = Launch(2, 10.0)
    for rank in (0, 1):
        run.on_line(rank, PREFIX + json.dumps({"ev": "start", "case": "ring_allreduce:0@2", "item": "ring_allreduce",
                                               "label": "W=2, 1,009 elements, float32"}))
    run.records[(0, "ring_allreduce:0@2")].began = time.monotonic() - 37
    for rank in (0, 1):
        run.on_line(rank, PREFIX + json.dumps({"ev": "stuck", "case": "ring_allreduce:0@2",
                                               "where": f"allreduce.py:9{rank}"}))
    run.close(SimpleNamespace(timed_out=False, ranks=[], ok=False))
    rec = run.records[(0, "ring_allreduce:0@2")]
    assert rec.ended == "hung" and rec.seconds == 10 and 36 < rec.waited < 60
    assert "did not return within 37 s" in describe(rec, "hint")


def test_which_phase_names_whose_contributions_a_chunk_holds():
    import torch
    inputs = [torch.arange(6, dtype=torch.float64) * (r + 1) for r in range(3)]
    total = sum(inputs)
    got = total.clone()
    got[4:] = inputs[0][4:] + inputs[2][4:]     # chunk 2 lacks rank 1's part: the all-gather
    msg = worker.which_phase(got, inputs, ring=True)
    assert "chunks 0, 1 hold the full sum, but chunk 2 (elements 4..5) holds the sum of ranks [0, 2] only" in msg
    assert "all-gather" in msg
    assert "reduce-scatter" in worker.which_phase(inputs[1].clone(), inputs, ring=True)
    assert "holds the sum of rank 1 only" in worker.which_phase(inputs[1].clone(), inputs, ring=False)
    got[0] = 1000.0                              # no set of inputs adds up to chunk 0: the cut itself is wrong
    assert worker.which_phase(got, inputs, ring=True) == ""


def test_a_rank_stopped_before_its_deadline_fired_is_named():
    from course_lib.checking.runner import CaseRecord
    rec = CaseRecord("ring_allreduce:0@4", "ring_allreduce", "W=4, 1,009 elements, float32", 4, started={0, 1, 2, 3},
                     stuck={0: "allreduce.py:100", 1: "allreduce.py:100", 3: "allreduce.py:100"}, ended="hung")
    assert worker.where_ranks_were(rec) == ["rank 2 gave no location: stopped before its own deadline fired "
                                            "(it waited as long as its partners)"]
    rec.stuck[2] = "allreduce.py:100"
    assert worker.where_ranks_were(rec) == []


def test_a_deadlock_is_every_rank_waiting_with_none_finishing_a_call(tmp_path):
    """The harness's early trigger (checking.deadlock), on the files the ranks write: it calls a deadlock only when
    every rank's own word, confirmed just now, says it has waited in one call for longer than the grace."""
    import time

    from course_lib.checking.deadlock import Deadlock, Stalls, Waits

    def says(rank, waited, confirmed=0.0):
        now = time.monotonic()
        (tmp_path / f"waiting-{rank}").write_text(f"{now - waited} {now - confirmed} {now - waited}")

    stalls = Stalls(tmp_path, 0, 2)
    says(0, 30)
    assert not stalls.everyone_waiting(2.0)           # rank 1 has said nothing: it may be computing
    says(1, 0.2)
    assert not stalls.everyone_waiting(2.0)           # rank 1 just began its call: it may yet be matched
    says(1, 30, confirmed=60)
    assert not stalls.everyone_waiting(2.0)           # rank 1's word is old: its rank may have gone on since
    says(1, 30)
    assert stalls.everyone_waiting(2.0)
    (tmp_path / "waiting-1").unlink()
    assert Stalls(tmp_path, 0, 2, ended=lambda r: r == 1).everyone_waiting(2.0)   # an ended rank frees nobody
    assert not Stalls(tmp_path, 0, 1).everyone_waiting(2.0)

    waits = Waits()
    seen = []
    inner = waits.wrap(lambda: seen.append(waits.since))
    outer = waits.wrap(lambda: (seen.append(waits.since), inner()))
    outer()
    assert seen[0] is not None and seen[0] == seen[1] and waits.since is None   # a call inside a call: the outer

    # another rank announced the deadlock: this rank reports too once it waits itself, not while it works
    stalls.announce()
    early = Deadlock(Stalls(tmp_path, 1, 2), waits)
    assert not early()
    waits.since = time.monotonic() - 1.0
    assert early() and (tmp_path / "waiting-1").exists()


def test_a_peer_outside_the_group_is_refused_before_gloo_sees_it():
    """gloo reads past its table of peers for a rank >= W (a wait for a rank that never comes, or a crash): the
    harness's wrapped send/recv refuse it with the rank and the group's size."""
    from types import SimpleNamespace

    from course_lib.checking.deadlock import peer_checked
    sent = []
    send = peer_checked("send", lambda group, tensors, peer, tag: sent.append(peer))
    group = SimpleNamespace(size=lambda: 3)
    send(group, [], 2, 0)
    assert sent == [2]
    for bad in (3, -1):
        with pytest.raises(ValueError, match=rf"Invalid peer rank {bad} for isend/send: the group has ranks 0\.\.2"):
            send(group, [], bad, 0)
