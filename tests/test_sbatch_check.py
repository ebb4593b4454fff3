"""`course check sbatch`: the reference passes, the starter and each faulty script fail at the right item with
the right reason (tests/sbatch_faulty/cases.py). Read-only checks run everywhere; the reference and the faulty
cases marked ``slurm`` also run as real jobs on the session's local Slurm (tests/conftest.py), where the
verdicts come from what each rank saw, and nothing may be left in the queue.
"""
import re
import subprocess
import sys

import pytest
from conftest import ROOT, nodes_take_jobs_within
from faulty import ids

from course_lib import registry
from course_lib.instructor.release import solution_view
from course_lib.jobs import load_site
from course_lib.sbatch import check as sbatch_check
from course_lib.sbatch import site_lines
from course_lib.sbatch.script import parse

sys.path.insert(0, str(ROOT / "tests" / "sbatch_faulty"))
from cases import CASES, CORRECT  # noqa: E402

REFERENCE = ROOT / "solutions" / "03_jobs" / "ddp.sbatch"
STARTER = ROOT / "exercises" / "03_jobs" / "ddp.sbatch"
SLURM_CASES = [c for c in CASES if c.options.get("slurm")]
RUN_ONLY = ("ranks", "process group", "sbatch accepts it")     # verdicts only a run gives


def verdicts(report) -> dict:
    return {v.item: v for v in report.verdicts}


@pytest.fixture
def read_only(monkeypatch):
    monkeypatch.setenv("COURSE_ENGINE", "local")     # no Slurm: the script is read, not run


def test_reference_passes_read_only(read_only):
    report = sbatch_check.check(REFERENCE, site="generic")
    assert report.passed, report.text()
    ranks = verdicts(report)["ranks"]
    assert ranks.result == "skipped" and "not run (no Slurm here" in ranks.message, report.text()
    assert re.search(r"(?m)^  NOT RUN +ranks ", report.text()), report.text()
    assert report.tally() == "7/7 passed, 2 not run", report.text()
    assert verdicts(report)["in the Python"].result == "skipped", report.text()     # said, never judged


def test_starter_fails_with_its_todos(read_only):
    report = sbatch_check.check(STARTER, site="generic")
    got = verdicts(report)
    assert not report.passed
    assert got["directives"].result == "fail" and "--nodes" in got["directives"].message
    assert got["MASTER_ADDR/PORT"].result == "fail" and got["OMP_NUM_THREADS"].result == "fail"
    assert got["launch"].result == "fail" and "srun python SCRIPT" in got["launch"].message
    # site profile, training script (the starter's python line), ranks and GPUs: right as given
    assert report.tally() == "3/7 passed, 2 not run", report.text()


def write(case, tmp_path):
    """The case's script; ``render``: the edits apply to the reference as written for the case's site."""
    if not case.options.get("render"):
        return case.write(REFERENCE, ROOT / "tests" / "sbatch_faulty", tmp_path)
    rendered = tmp_path / "reference" / REFERENCE.name
    rendered.parent.mkdir()
    rendered.write_text(site_lines.reference(solution_view(REFERENCE.read_text()), load_site(case.options["site"])))
    return case.write(rendered, ROOT / "tests" / "sbatch_faulty", tmp_path)


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_faulty_read_only(case, tmp_path, read_only):
    path = write(case, tmp_path)
    report = sbatch_check.check(path, site=case.options.get("site", "generic"))
    expect = {k: v for k, v in case.expect.items() if k not in RUN_ONLY}
    type(case)(case.name, expect, case.edits).assert_reported(report, path.read_text(), re.S)


@pytest.mark.parametrize("case", CORRECT, ids=ids(CORRECT))
def test_right_variants_pass_read_only(case, tmp_path, read_only):
    path = case.write(REFERENCE, ROOT / "tests" / "sbatch_faulty", tmp_path)
    report = sbatch_check.check(path, site="generic")
    assert report.passed, f"{case.name}\n{report.text()}"


def test_the_reference_written_for_the_gpu_site_passes(tmp_path, read_only):
    """Example GPU profile: the model answer written for it passes, and the starter written for it fails only
    where its TODOs are (never for partition, account or reservation, which the site block carries)."""
    gpu = load_site("example-gpu-cluster")
    ref, starter = tmp_path / "ref.sbatch", tmp_path / "starter.sbatch"
    ref.write_text(site_lines.reference(REFERENCE.read_text(), gpu))
    starter.write_text(site_lines.render(STARTER.read_text(), gpu))
    report = sbatch_check.check(ref, site=gpu)
    got = verdicts(report)
    assert report.passed and got["ranks and GPUs"].message == "one task (rank) per GPU", report.text()
    assert "--ntasks-per-node=4" in ref.read_text() and "--gpus-per-node=4" in ref.read_text()
    mine = verdicts(sbatch_check.check(starter, site=gpu))
    assert mine["site profile"].result == "pass", mine
    todo = ("directives", "launch", "ranks and GPUs", "MASTER_ADDR/PORT", "OMP_NUM_THREADS")
    assert {mine[k].result for k in todo} == {"fail"}, mine


def test_site_lines_of_the_repository_are_the_generic_profile():
    """The files in the repository carry the block written for 'generic'; writing it again changes nothing."""
    for path in (REFERENCE, STARTER):
        text = path.read_text()
        assert site_lines.written_for(text) == "generic" and site_lines.render(text, load_site("generic")) == text
    with pytest.raises(ValueError, match="no site block"):
        site_lines.render("#!/bin/bash\n#SBATCH --nodes=1\n", load_site("generic"))


def test_a_fresh_copy_gets_the_site_lines(monkeypatch):
    """What a workspace does with its copy of the starter (instructor.workspace.site_text): the block only, for
    $COURSE_SITE; a script without a block is left as it is, and writing a copy again changes nothing."""
    from course_lib.instructor.workspace import site_text

    other = "#!/bin/bash\n#SBATCH --nodes=1\n"
    monkeypatch.setenv("COURSE_SITE", "example-gpu-cluster")
    text = site_text(STARTER.read_text())
    assert text != STARTER.read_text() and site_text(other) == other and site_text(text) == text
    assert "#SBATCH --partition=gpu\n#SBATCH --account=my-project\n#SBATCH --reservation=workshop\n" in text
    assert text.replace(site_lines.block(load_site("example-gpu-cluster")), site_lines.block(load_site("generic"))) \
        == STARTER.read_text()


def test_directives_are_read_as_sbatch_reads_them():
    s = parse("#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node 4\n#SBATCH --time=1:00:00 # a comment\n\n"
              "export A=1\nB=2\nsrun python \\\n  x.py\n#SBATCH --nodes=3\n")
    assert (s.get("nodes"), s.get("ntasks-per-node"), s.get("time")) == ("2", "4", "1:00:00")
    assert s.ignored == [(9, "#SBATCH --nodes=3")] and "A" in s.exports and "B" in s.assigned
    assert s.commands[-1] == (7, "srun python x.py")     # the continuation joined into one command


def test_simple_commands_as_bash_runs_them():
    s = parse('#!/bin/bash\n#SBATCH -N 2\nHEAD=$(scontrol show hostnames "$X" | head -n 1)\nexport HEAD\n'
              "MASTER_ADDR=localhost srun python x.py & pid=$!\nwait $pid\n")
    assert s.exports["HEAD"] == (3, '$(scontrol show hostnames "$X" | head -n 1)')
    launch, assign, wait = s.simple[-3:]
    assert (launch.words, launch.env, launch.background) == (["srun", "python", "x.py"], {"MASTER_ADDR": "localhost"},
                                                             True)
    assert assign.words == ["pid=$!"] and wait.name == "wait" and "MASTER_ADDR" not in s.assigned


def test_two_nodes_and_localhost_as_the_ranks_saw_it():
    """What a --nodes=2 job with MASTER_ADDR=localhost gave on the two-node test Slurm (docs/two-node-slurm.md):
    rank 0 timed out waiting, rank 1 never said; each is named."""
    from course_lib.sbatch.run import Outcome

    env = {"MASTER_ADDR": "localhost", "MASTER_PORT": "20005", "OMP_NUM_THREADS": "2", "SLURM_CPUS_PER_TASK": "2"}
    ranks = [{"kind": "rank", "rank": r, "world": 2, "local_rank": 0, "launcher": "srun", "host": f"node{r + 1}",
              "env": env} for r in (0, 1)]
    group = {"kind": "group", "rank": 0, "ok": False,
             "error": "DistStoreError: Timed out after 31 seconds waiting for clients. 1/2 clients joined."}
    script = parse(REFERENCE.read_text().replace("--nodes=1", "--nodes=2"))
    got = sbatch_check.behaviour(script, Outcome(accepted=True, job_id="5", state="FAILED", records=ranks + [group]))
    assert got["MASTER_ADDR/PORT"][0] is False and "ran on 2 nodes (node1, node2)" in got["MASTER_ADDR/PORT"][1]
    assert got["process group"] == (False, "rank 0 could not join the process group: " + group["error"]
                                    + "\nrank(s) [1] never finished joining the group (job FAILED)")


def test_registry_knows_the_job_script():
    assert registry.guess("ddp.sbatch", "#!/bin/bash\n#SBATCH --nodes=1\n")[0] == "sbatch"
    assert registry.guess("job.sh", "#!/bin/bash\n#SBATCH --nodes=1\n") == ("sbatch", "what it defines")


def test_cli_exit_codes(tmp_path):
    env = {"COURSE_ENGINE": "local", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "course_lib", "check", "sbatch"]
    ok = subprocess.run(run + [str(REFERENCE)], env=env, capture_output=True, text=True, timeout=120)
    bad = subprocess.run(run + [str(STARTER)], env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert bad.returncode == 1 and "FAIL    MASTER_ADDR/PORT" in bad.stdout, bad.stdout + bad.stderr


# ------------------------------------------------------------------------------------------- real Slurm
def _queue_is_empty():
    r = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=60)
    return r.stdout.strip() == "", r.stdout


@pytest.mark.slurm
@pytest.mark.slow
def test_reference_runs_on_slurm(slurm):
    report = sbatch_check.check(REFERENCE, timeout=240)
    got = verdicts(report)
    assert report.passed, report.text()
    assert "ended COMPLETED" in got["sbatch accepts it"].message
    assert "2 rank(s), ranks [0, 1], world size 2" in got["ranks"].message
    assert "OMP_NUM_THREADS=2" in got["OMP_NUM_THREADS"].message
    print(f"\n[sbatch check on Slurm] reference: {report.seconds:.1f} s")
    empty, queue = _queue_is_empty()
    assert empty, queue


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("case", SLURM_CASES, ids=ids(SLURM_CASES))
def test_faulty_on_slurm(case, slurm, tmp_path):
    path = write(case, tmp_path)
    report = sbatch_check.check(path, timeout=120)
    case.assert_reported(report, path.read_text(), re.S)
    print(f"\n[sbatch check on Slurm] {case.name}: {report.seconds:.1f} s\n{report.text()}")
    empty, queue = _queue_is_empty()
    assert empty, queue


@pytest.mark.slurm
def test_a_drained_node_is_not_the_scripts_fault(slurm, tmp_path, monkeypatch):
    """With the only node drained, sbatch --test-only refuses the reference ("Requested node configuration is not
    available", as for a job no node could hold): NOT RUN, naming the node, its state and the reason; a job of
    course_lib.jobs (a notebook's run, a check as a job) is refused with the same node named."""
    from course_lib import jobs
    from course_lib.runtime import runner
    from course_lib.runtime.slurm import node_states

    monkeypatch.setenv("COURSE_RUNS_DIR", str(tmp_path / "runs"))
    node = list(node_states())
    assert len(node) == 1, node
    drain = ["scontrol", "update", f"nodename={node[0]}"]
    subprocess.run([*drain, "state=drain", "reason=course test drain"], check=True, timeout=60)
    try:
        report = sbatch_check.check(REFERENCE, timeout=60)
        test_only = sbatch_check.check(REFERENCE, timeout=60, run=False)   # as on a site's own Slurm
        with pytest.raises(jobs.SubmitError) as refused:
            jobs.submit(jobs.JobSpec("drained", str(ROOT / "solutions" / "02_ddp" / "mnist_classify_ddp.py")))
    finally:
        subprocess.run([*drain, "state=resume"], check=True, timeout=60)
        nodes_take_jobs_within(60)   # resumed, a node is "idle*" until it answers the controller (a second or two)
    got = verdicts(report)
    print(f"\n[sbatch check on Slurm] node drained: {report.seconds:.1f} s\n{report.text()}")
    assert got["sbatch accepts it"].result == got["ranks"].result == "skipped", report.text()   # NOT RUN
    assert f"1 of the 1 node(s) of this Slurm take no job now ({node[0]}: drained (course test drain))" \
        in got["sbatch accepts it"].message, report.text()
    assert "Requested node configuration is not available" in got["sbatch accepts it"].message
    assert verdicts(test_only)["sbatch accepts it"].message == got["sbatch accepts it"].message, test_only.text()
    assert f"Requested node configuration is not available; {node[0]} takes no job now: drained (course test " \
        "drain)" in str(refused.value), refused.value
    told = runner.not_taken("check", refused.value, "the check here")   # what `course check --engine slurm` says
    assert told.splitlines()[-1] == "Wait until `sinfo` shows those nodes up, or run the check here", told


TORCHRUN_EDITS = [
    ("--ntasks-per-node=2\n#SBATCH --cpus-per-task=2", "--ntasks-per-node=1\n#SBATCH --cpus-per-task=4"),
    ("export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK", "export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / 2 ))"),
    ('srun --label python "${SCRIPT', 'srun --label torchrun --nnodes=$SLURM_JOB_NUM_NODES --nproc_per_node=2 '
     '--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT "${SCRIPT'),
]


@pytest.mark.slurm
@pytest.mark.slow
def test_torchrun_variant_runs_on_slurm(slurm, tmp_path):
    """The same job with one torchrun per node: the probe runs under the real torchrun, which starts 2 ranks."""
    case = type(CASES[0])("torchrun_ok", {}, TORCHRUN_EDITS)
    path = case.write(REFERENCE, ROOT / "tests" / "sbatch_faulty", tmp_path)
    report = sbatch_check.check(path, timeout=240)
    got = verdicts(report)
    print(f"\n[sbatch check on Slurm] torchrun variant: {report.seconds:.1f} s\n{report.text()}")
    assert report.passed, report.text()
    assert "2 rank(s), ranks [0, 1], world size 2" in got["ranks"].message
    empty, queue = _queue_is_empty()
    assert empty, queue


def test_course_grade_takes_job_scripts(tmp_path):
    """`course grade --exercise sbatch`: the reference at its place passes, a renamed, edited starter fails (no
    Slurm)."""
    import csv

    subs = tmp_path / "subs"
    (subs / "alice" / "exercises" / "03_jobs").mkdir(parents=True)
    (subs / "bob").mkdir()
    (subs / "alice" / "exercises" / "03_jobs" / "ddp.sbatch").write_text(REFERENCE.read_text())
    (subs / "bob" / "ddp (1).sbatch").write_text(STARTER.read_text() + "# started\n")   # an unchanged one: 0
    env = {"COURSE_ENGINE": "local", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "course_lib", "grade", str(subs), "--exercise", "sbatch",
                        "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(tmp_path / "out" / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    result = {(r["learner"], r["item"]): r["result"] for r in rows}
    unjudged = ("ranks", "in the Python")     # read only: NOT RUN, as the Python is
    assert {r for (learner, item), r in result.items() if learner == "alice" and item not in unjudged} == {"pass"}, rows
    assert result["alice", "ranks"] == result["bob", "ranks"] == "skipped", rows     # read only: NOT RUN, never pass
    assert result["bob", "MASTER_ADDR/PORT"] == result["bob", "directives"] == "fail", rows


def test_gpus_seen_by_the_ranks_are_judged():
    """What the probe reports under --gpus-per-task=1 (each task sees one GPU) and under --gpus-per-node=2."""
    from course_lib.sbatch.run import Outcome

    def outcome(visible):
        ranks = [{"kind": "rank", "rank": r, "world": 2, "local_rank": r, "launcher": "srun", "host": "n1",
                  "env": {"MASTER_ADDR": "n1", "MASTER_PORT": "20001", "OMP_NUM_THREADS": "2",
                          "SLURM_CPUS_PER_TASK": "2", "CUDA_VISIBLE_DEVICES": v}} for r, v in enumerate(visible)]
        groups = [{"kind": "group", "rank": r, "ok": True} for r in range(2)]
        return Outcome(accepted=True, job_id="1", state="COMPLETED", records=ranks + groups)

    script = parse(REFERENCE.read_text())
    per_task = sbatch_check.behaviour(script, outcome(["0", "0"]))["ranks and GPUs"]
    per_node = sbatch_check.behaviour(script, outcome(["0,1", "0,1"]))["ranks and GPUs"]
    assert per_task[0] is False and "rank 1 (local rank 1) sees 1 GPU(s)" in per_task[1]
    assert per_node[0] is True


@pytest.mark.parametrize("path", sorted((ROOT / "jobs").glob("*.sbatch")), ids=lambda p: p.name)
def test_the_course_own_job_scripts_pass(path, read_only):
    """jobs/*.sbatch, written from the course's template, pass the rules a learner's script is held to."""
    report = sbatch_check.check(path, site="generic")
    assert report.passed, report.text()


def test_a_job_whose_ranks_were_not_observed():
    """Ranks expected and none seen is a FAIL that says what the job did (never a PASS with a guessed cause)."""
    from course_lib.sbatch.run import Outcome

    script = parse(REFERENCE.read_text())
    done = sbatch_check.behaviour(script, Outcome(accepted=True, job_id="7", state="COMPLETED", seconds=1.4,
                                                  log="job 7 on node1"))
    failed = sbatch_check.behaviour(script, Outcome(accepted=True, job_id="8", state="FAILED", log="0: Traceback"))
    assert done["ranks"][0] is False and "2 rank(s) expected, no rank seen: the job COMPLETED 1 s after" \
        in done["ranks"][1] and "job 7 on node1" in done["ranks"][1], done
    assert done["process group"][0] is None and "MASTER_ADDR/PORT" not in done
    assert failed["ranks"][0] is False and "0: Traceback" in failed["ranks"][1]


def test_a_job_larger_than_this_slurm_is_not_run():
    """--nodes=2 refused by a one-node Slurm: NOT RUN (the test cluster is small, the script is not wrong)."""
    from course_lib.sbatch.run import Outcome

    script = parse(REFERENCE.read_text().replace("--nodes=1", "--nodes=2"))
    small = Outcome(accepted=False, refusal="sbatch: error: Batch job submission failed: Node count specification "
                                            "invalid", nodes=1)
    got = sbatch_check.behaviour(script, small)
    assert got["sbatch accepts it"][0] is None and "this Slurm has 1 node(s) and the script asks for --nodes=2" \
        in got["sbatch accepts it"][1] and got["ranks"][0] is None
    other = sbatch_check.behaviour(script, Outcome(accepted=False, refusal="Invalid account or account/partition"))
    assert other["sbatch accepts it"] == (False, "sbatch refused it: Invalid account or account/partition")
    # nodes down or drained now: not the script's fault when too few are left for it; its own when enough are
    busy = "allocation failure: Requested node configuration is not available"
    down = Outcome(accepted=False, refusal=busy, nodes=2, unusable={"node2": "drained (Kill task failed)"})
    got = sbatch_check.behaviour(script, down)
    assert got["sbatch accepts it"][0] is None and "1 of the 2 node(s) of this Slurm take no job now (node2: " \
        "drained (Kill task failed)) and the script asks for --nodes=2" in got["sbatch accepts it"][1], got
    one = sbatch_check.behaviour(parse(REFERENCE.read_text()), down)
    assert one["sbatch accepts it"] == (False, f"sbatch refused it: {busy}"), one


def test_probe_records_survive_interleaved_output():
    from course_lib.sbatch.probe import MARK
    from course_lib.sbatch.run import records

    log = (f'0: {MARK}{{"kind": "rank", "rank": 0}}1: [default1]:{MARK}{{"kind": "rank", "rank": 1}}\n'
           f'0: {MARK}{{"kind": "gro\n1: noise\n')
    assert records(log) == [{"kind": "rank", "rank": 0}, {"kind": "rank", "rank": 1}]


GPU_EDITS = [("#SBATCH --nodes=1\n", "#SBATCH --nodes=1\n#SBATCH --gpus-per-task=1\n"),
             ("${SCRIPT:-exercises/02_ddp", "${SCRIPT:-solutions/02_ddp")]


def test_gpus_per_task_fixed_either_way_is_no_fail(tmp_path, read_only):
    """Bug 5's fixes (notebook 07): --gpu-bind=none passes; --gpus-per-task kept with a script that picks cuda:0
    is NOT RUN (the device is known only from a run on GPUs), never a FAIL; the course's DDP file, which picks
    cuda:LOCAL_RANK, fails (tests/sbatch_faulty: gpus_per_task)."""
    unbound = type(CASES[0])("gpu_bind_none", {}, GPU_EDITS + [("--gpus-per-task=1\n",
                                                                  "--gpus-per-task=1\n#SBATCH --gpu-bind=none\n")])
    own = tmp_path / "own"
    (own / "train").mkdir(parents=True)
    (own / "train" / "mnist_classify_ddp.py").write_text('import torch\ndevice = torch.device("cuda:0")\n')
    cuda0 = type(CASES[0])("cuda0", {}, GPU_EDITS[:1] + [
        ("${SCRIPT:-exercises/02_ddp/mnist_classify_ddp.py}", "train/mnist_classify_ddp.py"),
        ("#SBATCH --nodes=1\n", f"#SBATCH --nodes=1\n#SBATCH --chdir={own}\n")])
    got = {}
    for case in (unbound, cuda0):
        path = case.write(REFERENCE, ROOT / "tests" / "sbatch_faulty", tmp_path / case.name)
        got[case.name] = verdicts(sbatch_check.check(path, site="example-gpu-cluster"))["ranks and GPUs"]
    assert got["gpu_bind_none"].result == "pass", got
    assert got["cuda0"].result == "skipped" and "picks no GPU by the local rank" in got["cuda0"].message, got


def test_launchers_the_check_does_not_judge_are_not_run(tmp_path, read_only):
    """mpirun starts one process per task: NOT RUN with why (its rank variables are the Python's business), never
    the message for python without srun."""
    case = type(CASES[0])("mpirun", {}, [("srun --label python", "mpirun python")])
    path = case.write(REFERENCE, ROOT / "tests" / "sbatch_faulty", tmp_path)
    launch = verdicts(sbatch_check.check(path, site="generic"))["launch"]
    assert launch.result == "skipped" and "OMPI_COMM_WORLD_RANK" in launch.message, launch


def test_what_the_ranks_were_given_is_judged():
    """The probe's record says which script a rank was given and whether it was a file there."""
    from course_lib.sbatch import training

    rank = {"kind": "rank", "rank": 1, "script": "x.py", "cwd": "/w", "found": False, "args": []}
    ok, msg = training.seen([dict(rank, rank=0, found=True), rank])
    assert ok is False and "rank 1 was given x.py, which is not a file in its working directory /w" in msg


@pytest.mark.slurm
def test_the_course_test_slurm_runs_the_job_and_a_larger_job_is_not_run(slurm, tmp_path):
    """On the course's test Slurm the job runs whatever COURSE_SITE says (notebook 03 cell 9's promise); asked
    only for sbatch --test-only (as on a site's own Slurm), a job larger than this Slurm is NOT RUN, as when it is
    run (the README's rule: a refusal caused by the cluster is not the script's fault)."""
    assert sbatch_check.on_test_slurm()
    assert sbatch_check._mode(load_site("generic"), None) == ("run", "")
    two = tmp_path / "ddp.sbatch"
    two.write_text(REFERENCE.read_text().replace("#SBATCH --nodes=1\n", "#SBATCH --nodes=2\n"))
    got = verdicts(sbatch_check.check(two, timeout=60, run=False, site="generic"))["sbatch accepts it"]
    assert got.result == "skipped" and "this Slurm has 1 node(s) and the script asks for --nodes=2" in got.message, \
        got


def test_the_command_line_the_probe_replaces_is_read_as_python_and_torchrun_read_it():
    from course_lib.sbatch.training import command_line

    def line(text):
        return command_line(parse("#!/bin/bash\n#SBATCH -N 1\n" + text + "\n"))[1:]
    assert line("srun python -u -W ignore x.py --a 1") == ("x.py", ["--a", "1"])       # -W takes a value
    assert line("srun bash -c 'python y.py --b'") == ("y.py", ["--b"])
    assert line("srun torchrun --nnodes 2 --standalone --rdzv-id=7 z.py --c") == ("z.py", ["--c"])
    assert line("python -m torch.distributed.run --nproc_per_node=2 w.py") == ("w.py", [])


def test_localhost_on_one_node_passes_saying_it_holds_there_only(tmp_path, read_only):
    """MASTER_ADDR=localhost is right on one node; the PASS must not claim that every node reaches it."""
    case = next(c for c in CORRECT if c.name == "localhost_one_node")
    report = sbatch_check.check(case.write(REFERENCE, ROOT / "tests" / "sbatch_faulty", tmp_path), site="generic")
    master = verdicts(report)["MASTER_ADDR/PORT"]
    assert master.result == "pass", report.text()
    assert "every node reaches" not in master.message, master.message
    assert re.search(r"localhost reaches rank 0 only on a one-node job.*head -n 1", master.message), master.message


def test_a_script_variable_that_defaults_to_itself_is_read():
    """``SCRIPT=${SCRIPT:-snapshot.py}`` (notebook 08's requeue.sbatch): its default, not an endless lookup."""
    from course_lib.sbatch.training import command_line, resolve

    s = parse('#!/bin/bash\n#SBATCH -N 1\nSCRIPT=${SCRIPT:-snapshot.py}\npython "$SCRIPT" --x\n')
    assert resolve(s, command_line(s)[1]) == ("snapshot.py", "$SCRIPT, set in the script")
