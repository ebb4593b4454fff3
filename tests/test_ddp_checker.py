"""The DDP checker on the reference solution, the starter exercise and the faulty scripts of
tests/ddp_faulty/cases.py: each fails at the step it names, with a message that matches its regex
(tests/ddp_faulty/README.md says how an instructor adds one).
"""
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, live_processes
from ddp_faulty.cases import CASES, DEFAULT
from faulty import ids

from course_lib.core.report import Report
from course_lib.ddp import check as ddp
from course_lib.ddp import cluster

FAULTY = ROOT / "tests" / "ddp_faulty"
SOLUTION = ROOT / "solutions" / "02_ddp" / "mnist_classify_ddp.py"
EXERCISE = ROOT / "exercises" / "02_ddp" / "mnist_classify_ddp.py"
STEPS = [f"Step {n}" for n in range(1, 7)]


def _gpus():
    import torch
    return torch.cuda.device_count()


def test_every_case_applies_and_every_file_is_used():
    for case in CASES:
        text = case.source(SOLUTION, FAULTY)   # each edit's old text occurs exactly once in the solution
        assert case.expect and set(case.expect) <= set(STEPS), case.name
        for item in case.expect:
            case.pattern(item, text)           # every {line:TEXT} names a line of the submission
    assert {c.file for c in CASES if c.file} == {p.name for p in FAULTY.glob("*.py")} - {"cases.py"}
    assert len(set(ids(CASES))) == len(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_checker_names_the_step_and_the_reason(tmp_path, case):
    opts = {**DEFAULT, **case.options}
    if opts.pop("cpu_only", False) and _gpus() >= 2:
        pytest.skip("this mistake only shows without GPUs")
    path = case.write(SOLUTION, FAULTY, tmp_path)
    source = path.read_text()
    report = ddp.check(str(path), cache=False, **opts)
    if "stall" in opts:   # a deadlock is reported once a rank waited `stall` seconds, not at the deadline
        assert report.seconds < 6 * opts["stall"], f"took {report.seconds:.0f} s:\n{report.text()}"
    text = report.text()
    verdicts = {v.item: v for v in report.verdicts}
    assert sorted(verdicts) == STEPS, text
    for step, (result, _) in case.expect.items():
        rule = case.pattern(step, source)
        assert verdicts[step].result == result, f"{step} should {result}:\n{text}"
        assert re.search(rule, verdicts[step].message, re.S), f"{step} should say /{rule}/:\n{text}"
    if any(result != "pass" for result, _ in case.expect.values()) or set(case.expect) != set(STEPS):
        assert not report.passed, text
    assert not live_processes(str(path)), live_processes(str(path))


@pytest.mark.slow
def test_solution_passes_every_step_under_both_launchers_and_3_ranks():
    # checked in a process of its own, which must not import torch: the ranks judge what needs it (Step 5's checkpoint)
    # or leave it readable without (Step 2's parameters), so a check imports torch once, in its fork server
    code = ("import json, sys\nfrom course_lib.ddp import check\n"
            f"report = check.check({str(SOLUTION)!r}, cache=False)\n"
            "print(json.dumps({'report': report.to_dict(), 'torch': 'torch' in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    seen = json.loads(out.stdout.splitlines()[-1])
    report = Report.from_dict(seen["report"])
    assert not seen["torch"], f"the checker's own process imported torch:\n{report.text()}"
    assert report.passed, report.text()
    assert [v.item for v in report.verdicts] == [f"Step {n}" for n in range(1, 7)]
    assert "works under srun, torchrun and `srun torchrun`, with 2 and 3 ranks (3 nodes of one rank each)" \
        in report.verdicts[5].message, report.text()
    if _gpus() < 2:   # the device each rank picks on 2 simulated nodes of 2 GPUs
        assert "each rank put its model on cuda:<local rank> (cuda:0, cuda:1, cuda:0, cuda:1)" \
            in report.verdicts[3].message, report.text()
        # a pass that a bare torch.device("cuda") would get too says so (issue 53 item 4)
        assert "so this step can pass before you reach it" in report.verdicts[3].message, report.text()
    print(f"\nsolution checked in {report.seconds:.1f} s")   # the goal is under 30 s on an idle 2-core machine


@pytest.mark.slow
def test_starter_exercise_fails_every_step_with_a_message(monkeypatch):
    launched = []

    def launch_one(sim, style, nprocs, *args, **kwargs):   # the real launch, noted
        launched.append(sim.name)
        return real_launch_one(sim, style, nprocs, *args, **kwargs)
    real_launch_one = cluster.launch_one
    monkeypatch.setattr(cluster, "launch_one", launch_one)
    report = ddp.check(str(EXERCISE), cache=False, more_ranks=None)
    text = report.text()
    # no rank joins a group: the launches that only a group makes worth running (srun torchrun, torchrun on 2 nodes)
    # are not started
    assert sorted(launched) == ["", "", "gpus"], launched
    expected = {
        1: "no rank called torch.distributed.init_process_group",
        2: "identical on all ranks only because every rank trained on the same data",
        3: r"every rank trained on all \d+ images",
        4: (r"rank 1 \(local rank 1 on node 0\) put its model on cuda:0; ranks 0, 1 share it on node 0"
            if _gpus() < 2 else "each rank must use its own GPU"),
        5: r"ranks \[0, 1\] all wrote mnist_cnn.pt",
        6: "works under no launcher",
    }
    for v in report.verdicts:
        n = int(v.item.split()[1])
        assert v.result == "fail", text
        assert re.search(expected[n], v.message), f"Step {n} should say /{expected[n]}/:\n{text}"


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_cli_exit_codes(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "course_lib.cli", "check", "ddp", str(tmp_path / "nope.py")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such file" in missing.stderr   # errors go to stderr
    bad = tmp_path / "broken.py"
    bad.write_text("def main(:\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "course_lib.cli", "check", "ddp", str(bad)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(r"FAIL\s+Step 1\s+the script does not compile: SyntaxError", out.stdout), out.stdout


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_steps_reuse_one_run_until_the_file_changes(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("def main(:\n    pass\n")
    first = ddp.check(str(bad), styles=("srun",), more_ranks=None)
    again = ddp.check(str(bad), styles=("srun",), more_ranks=None, steps=[1])
    assert [v.item for v in again.verdicts] == ["Step 1"] and again.seconds == first.seconds
    # a reused verdict says so, instead of its old time as if it had run again
    assert "reused: the file has not changed" in again.text() and "reused" not in first.text(), again.text()
    assert "reused" in again._repr_html_()
    bad.write_text("import sys\nsys.exit('nothing here')\n")
    changed = ddp.check(str(bad), styles=("srun",), more_ranks=None, steps=[1])
    assert "does not compile" not in changed.verdicts[0].message, changed.text()


def test_strict_launchers_flag_reaches_the_ddp_checker_only(tmp_path, monkeypatch, capsys):
    import argparse

    from course_lib import check as check_cli
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    p = argparse.ArgumentParser()
    check_cli.add_arguments(p)
    seen = {}

    def fake_check(exercise, path, engine=None, **kwargs):   # the command line's job only: what reaches the checker
        assert engine == "local", engine                       # the default profile runs checks here
        seen.update(kwargs, exercise=exercise)
        from course_lib.core.report import Report
        report = Report(exercise, str(path))
        report.add("Step 1", True, "ok")
        return report
    monkeypatch.setattr(check_cli, "check", fake_check)
    assert check_cli.run(p.parse_args(["ddp", str(script), "--strict-launchers"])) == 0
    assert seen == {"exercise": "ddp", "strict_launchers": True}
    seen.clear()
    assert check_cli.run(p.parse_args(["ddp", str(script)])) == 0 and seen == {"exercise": "ddp"}
    assert check_cli.run(p.parse_args(["allreduce", str(script), "--strict-launchers"])) == 2
    assert "--strict-launchers is for `course check ddp` only" in capsys.readouterr().err


def test_step5_takes_the_ranks_verdict_only_on_the_file_it_read(tmp_path):
    import torch

    from course_lib.ddp.hooks import stat_of
    from course_lib.ddp.runs import Run
    from course_lib.ddp.steps import step5
    from course_lib.model import Net
    path = tmp_path / "mnist_cnn.pt"
    torch.save(Net().state_dict(), path)
    said = (False, "what rank 0 said of the file it read")

    def judged(stat):
        save = {"rank": 0, "launch_rank": 0, "type": "OrderedDict", "path": str(path),
                "loads": {"verdict": list(said), "stat": stat}}
        records = [{"exit": {"code": 0}, "saves": [save] if r == 0 else []} for r in range(2)]
        return step5(Run("srun", 2, None, tmp_path, False, records))

    assert judged(stat_of(path)) == said   # the very file the rank read: its verdict, without torch here
    rewritten = stat_of(path)
    rewritten[2] -= 1                      # the file changed after the rank read it: judged again, here
    assert judged(rewritten) == (True, "only rank 0 wrote mnist_cnn.pt; it loads into Net() with strict=True")


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_a_simulated_layout_gives_the_variables_of_a_multi_node_step(monkeypatch, launcher):
    from course_lib.ddp import simulate
    monkeypatch.setattr(os, "environ", os.environ.copy())   # what apply_layout sets stays in this test
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "GROUP_RANK"):
        os.environ.pop(name, None)
    os.environ.update({"RANK" if launcher == "torchrun" else "SLURM_PROCID": "3", "MASTER_ADDR": "127.0.0.1"})
    lay = simulate.apply_layout(2, 2)   # rank 3 of 2 nodes x 2 ranks: the second rank of node 1
    assert (lay["node"], lay["local_rank"]) == (1, 1)
    if launcher == "torchrun":
        assert (os.environ["LOCAL_RANK"], os.environ["GROUP_RANK"], os.environ["LOCAL_WORLD_SIZE"]) == ("1", "1", "2")
        assert os.environ["MASTER_ADDR"] == "127.0.0.1"   # torchrun's own: its workers reach the agent's store there
    else:
        assert (os.environ["SLURM_LOCALID"], os.environ["SLURM_NODEID"], os.environ["SLURM_NNODES"]) == ("1", "1", "2")
        assert os.environ["MASTER_ADDR"] == simulate.NODE0_ADDR != "127.0.0.1"
