"""``course check sbatch PATH``: a learner's job script, read against the site profile, then run on Slurm.

The text is always judged (lint): mistakes one node hides, such as MASTER_ADDR=localhost on two nodes, fail
whatever a run here shows. On the course's test Slurm (or ``COURSE_SBATCH_RUN=1``) the job runs and what each rank
saw is judged too; on another Slurm only ``sbatch --test-only`` runs. What a run did not establish is NOT RUN.
"""
import os
import re
import time
from pathlib import Path

from course_lib import jobs
from course_lib.core.paths import workspace
from course_lib.core.report import Report
from course_lib.core.site import load_site
from course_lib.runtime.job import SubmitError
from course_lib.runtime.slurm import UNPLACEABLE
from course_lib.sbatch import lint as rules
from course_lib.sbatch import training, wrapper
from course_lib.sbatch.address import FIRST_NODE, LOOPBACK
from course_lib.sbatch.run import refused, submit_and_wait, test_only
from course_lib.sbatch.script import integer, parse

# what notebook 03 teaches that lives in the training script, not the job script: said, never judged
UNSEEN = ("not looked at (the check reads the job script, not the Python): that the training script saves and "
          "logs from global rank 0 (not local rank 0) to shared storage, and logs offline where nodes have no "
          "internet (notebook 03); where GPUs are, that each rank picks the GPU Slurm gave it")
TIMEOUT = 180.0     # seconds for the whole job (a busy CI machine starts Slurm steps slowly)


def check(path, timeout: float = TIMEOUT, run: bool | None = None, site=None, read_only: bool = False) -> Report:
    """Verdicts on the job script ``path``; ``run``: submit it (None: on the local test Slurm only);
    ``read_only``: never ask Slurm (a script for another cluster, e.g. notebook 07's GPU job)."""
    start = time.monotonic()
    report = Report("sbatch", str(path))
    site = load_site(site) if not hasattr(site, "cpus_per_node") else site
    script = parse(Path(path).read_text(errors="replace"))
    script = wrapper.inline(script, [training.job_folder(script, workspace()), Path(path).resolve().parent])
    verdicts = {item: (ok, msg) for item, ok, msg in rules.lint(script, site, workspace())}
    mode, why = ("read", "read only, as asked") if read_only else _mode(site, run)
    if mode == "run":
        outcome = submit_and_wait(Path(path).resolve(), workspace(), site.env, timeout)
        verdicts.update(_merged(verdicts, behaviour(script, outcome)))
    else:
        if mode == "test-only":
            ok, msg = test_only(Path(path).resolve(), workspace())
            # a job larger than this Slurm, or nodes down: NOT RUN, as when the job is run (_refused)
            verdicts["sbatch accepts it"] = ((True, f"sbatch --test-only: {msg}") if ok
                                             else _refused(script, refused(msg))["sbatch accepts it"])
        where = "; run the check where Slurm is" if mode == "read" else ""
        verdicts["ranks"] = (None, f"not run ({why}): whether the ranks start and form one process group is known "
                                   "only from a run; MASTER_ADDR/PORT and OMP_NUM_THREADS were judged from the "
                                   f"script's text{where}")
    verdicts["in the Python"] = (None, UNSEEN)
    for item, (ok, msg) in verdicts.items():
        report.skip(item, msg) if ok is None else report.add(item, ok, msg)
    report.seconds = time.monotonic() - start
    return report


def _merged(static: dict, seen: dict) -> dict:
    """The run's verdicts, except where the script's text is wrong in a way this run hides (a loopback or a node
    list as MASTER_ADDR on one node, a fixed port with no other job beside it, more threads than CPUs on a machine
    that does not bind them, a wrong file or option: the probe runs whatever it is given): the text's FAIL stands,
    with what the run saw; where the run could not tell (NOT RUN), the text's verdict stands."""
    for item, (ok, msg) in static.items():
        if item in seen and ok is False:
            run_ok, said = seen[item]
            seen[item] = (False, msg + ("\n" + said if run_ok is False else f"\n(this run: {said})" if said else ""))
        elif item in seen and seen[item][0] is None:
            seen[item] = (ok, msg)
    return seen


def _mode(site, run: bool | None) -> tuple[str, str]:
    """("run" | "test-only" | "read", why) for this machine."""
    try:
        engine, why = jobs.engine(site=site)
    except (SubmitError, ValueError) as e:
        engine, why = "local", str(e)
    if engine != "slurm":
        return "read", f"no Slurm here: {why}"
    if run is None:
        run = (site.name in ("local", "local-2nodes") or os.environ.get("COURSE_SBATCH_RUN") == "1"
               or on_test_slurm())
    return ("run", "") if run else ("test-only", "a Slurm that is not the course's test Slurm: only sbatch "
                                                 "--test-only, nothing queued; COURSE_SBATCH_RUN=1 runs it there")


def on_test_slurm() -> bool:
    """This Slurm is the course's own test cluster (scripts/local-slurm writes ClusterName=localslurm), where the
    job is run whatever COURSE_SITE says."""
    conf = os.environ.get("SLURM_CONF")
    try:
        return bool(conf) and bool(re.search(r"(?mi)^\s*ClusterName\s*=\s*localslurm\s*$", Path(conf).read_text()))
    except OSError:
        return False


def expected_ranks(script) -> int | None:
    per_node = rules.torchrun_nproc(script) if rules.launcher(script) == "torchrun" else rules.tasks_per_node(script)
    return (integer(script.get("nodes", "1")) or 1) * per_node if per_node else None


def behaviour(script, out) -> dict:
    """Verdicts from the job's run: accepted, ranks, process group, and what the ranks saw
    (``(None, why)``: not established by this run, shown NOT RUN)."""
    if not out.accepted:
        return _refused(script, out)
    found = {"sbatch accepts it": (True, f"accepted; job {out.job_id} ended {out.state}")}
    ranks, groups = out.of("rank"), out.of("group")
    if not ranks:
        want = expected_ranks(script)
        tail = "\n".join(out.log.strip().splitlines()[-6:]) or "(no output)"
        found["ranks"] = (False, f"{want or 'the'} rank(s) expected, no rank seen: the job {out.state} "
                                 f"{out.seconds:.0f} s after it was submitted, and no rank reported to the check (it "
                                 "puts a probe named python and torchrun first on PATH, and every rank the probe "
                                 f"starts reports itself). The job's last lines:\n{tail}")
        found["process group"] = (None, "no rank seen, so no process group")
        return found
    found["ranks"] = _ranks(script, ranks)
    found[training.ITEM] = training.seen(ranks)
    found["process group"] = _group(ranks, groups, out)
    found["MASTER_ADDR/PORT"] = _seen_master(ranks)
    found["OMP_NUM_THREADS"] = _seen_threads(ranks, out.of("torchrun"))
    seen_gpus = _seen_gpus(ranks)
    if seen_gpus:
        found["ranks and GPUs"] = seen_gpus
    return found


def _refused(script, out) -> dict:
    """sbatch refused the job: the script's fault, or (NOT RUN) a test Slurm smaller than the job, or nodes that
    take no job now (down, drained: sbatch --test-only then says what it says of a job no node could hold)."""
    nodes = integer(re.split(r"[-,:]", script.get("nodes", "1"))[0]) or 1      # the least a range asks for
    why = f"--nodes={script.get('nodes')}" if script.get("nodes") else "one node"
    if nodes > out.nodes if out.nodes else "node count" in out.refusal.lower():
        here = f"this Slurm has {out.nodes} node(s)" if out.nodes else "this Slurm has fewer nodes"
        return {"sbatch accepts it": (None, f"not run: {here} and the script asks for {why} (sbatch: "
                                            f"{out.refusal}). The verdicts above come only from the script's text; "
                                            f"what the ranks do is known from a run on {nodes} nodes (a cluster, or "
                                            "the course's two-node Slurm: docs/two-node-slurm.md)"),
                "ranks": (None, "not run: the job could not start on this Slurm")}
    if UNPLACEABLE in out.refusal and out.unusable and nodes > out.nodes - len(out.unusable):
        down = ", ".join(f"{n}: {state}" for n, state in sorted(out.unusable.items()))
        return {"sbatch accepts it": (None, f"not run: {len(out.unusable)} of the {out.nodes} node(s) of this Slurm "
                                            f"take no job now ({down}) and the script asks for {why} (sbatch: "
                                            f"{out.refusal}). That is the cluster's state, not the script's: check "
                                            "again when `sinfo` shows the nodes up (an admin resumes a drained one)"),
                "ranks": (None, "not run: the job could not be placed on this Slurm now")}
    return {"sbatch accepts it": (False, f"sbatch refused it: {out.refusal}"),
            "ranks": (None, "not run: sbatch refused the job")}


def _seen_gpus(ranks) -> tuple | None:
    """Where Slurm set CUDA_VISIBLE_DEVICES: does each rank see the GPU cuda:LOCAL_RANK that it will pick?"""
    seen = [(r, r["env"].get("CUDA_VISIBLE_DEVICES")) for r in ranks if r["env"].get("CUDA_VISIBLE_DEVICES")]
    if not seen:
        return None
    for r, visible in seen:
        n = len(visible.split(","))
        if r["local_rank"] >= n:
            return False, (f"rank {r['rank']} (local rank {r['local_rank']}) sees {n} GPU(s) "
                           f"(CUDA_VISIBLE_DEVICES={visible}): cuda:{r['local_rank']} does not exist for it "
                           "('invalid device ordinal'); --gpus-per-node lets every rank of a node see all its GPUs")
    return True, "each rank sees the GPU of its local rank: " + ", ".join(f"rank {r['rank']}: {v}" for r, v in seen)


def _ranks(script, ranks) -> tuple:
    want = expected_ranks(script)
    seen = sorted(r["rank"] for r in ranks)
    worlds = sorted({r["world"] for r in ranks})
    dup = sorted({r for r in seen if seen.count(r) > 1})
    if dup:
        return False, (f"rank(s) {dup} started more than once ({len(seen)} processes, ranks {seen}): two launchers "
                       "each numbered their own ranks (torchrun once per task? srun around a script that srun "
                       "starts again?)")
    if want is not None and len(seen) != want:
        conflict = rules.task_conflict(script)
        why = (f" ({conflict.split(': ', 1)[0]}: #SBATCH --ntasks={script.get('ntasks')} sets the job's tasks, see "
               "directives)" if conflict else " (python without srun?)" if rules.launcher(script) == "python" else "")
        return False, (f"{len(seen)} rank(s) started (ranks {seen}, each told world size {worlds}), the script asks "
                       f"for {want}: the others were never started{why}")
    return True, f"{len(seen)} rank(s), ranks {seen}, world size {worlds[0]}"


def _group(ranks, groups, out) -> tuple:
    """Did the ranks form one process group? Each rank that did not, in its own words (or its silence)."""
    bad = [f"rank {g['rank']} could not join the process group: {g.get('error') or g}"
           for g in sorted(groups, key=lambda g: g["rank"]) if not g.get("ok")]
    missing = sorted({r["rank"] for r in ranks} - {g["rank"] for g in groups})
    if missing:
        bad.append(f"rank(s) {missing} never finished joining the group (job {out.state})")
    errors = out.of("torchrun-error")
    if errors:
        bad.append(f"torchrun failed: {errors[0]['error']}")
    return not bad, "\n".join(bad) or f"all {len(groups)} rank(s) joined one gloo group and all-reduced"


def _seen_master(ranks) -> tuple:
    for r in ranks:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not r["env"].get(k)]
        if missing:
            return False, (f"rank {r['rank']} ({r['launcher']}) saw no {' and no '.join(missing)}: export "
                           "MASTER_ADDR (the job's first node) and MASTER_PORT (e.g. 10000 + SLURM_JOB_ID % 20000) "
                           "before srun")
    addr = ranks[0]["env"]["MASTER_ADDR"]
    if any(c in addr for c in "[], \n"):
        return False, (f"the ranks saw MASTER_ADDR={addr!r}: a list of nodes, not one host; take the first: "
                       f"{FIRST_NODE}")
    hosts = sorted({r["host"] for r in ranks})
    if LOOPBACK.match(addr) and len(hosts) > 1:
        return False, (f"the ranks ran on {len(hosts)} nodes ({', '.join(hosts)}) and saw MASTER_ADDR={addr}, each "
                       f"node's own loopback: the ranks away from rank 0's node cannot reach it; {FIRST_NODE}")
    port = ranks[0]["env"]["MASTER_PORT"]
    if not port.isdigit():
        return False, (f"the ranks saw MASTER_PORT={port!r}: not a port number (bash works out arithmetic only inside "
                       "$(( ))); export MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 20000 ))")
    return True, f"the ranks saw MASTER_ADDR={addr} MASTER_PORT={port}"


def _seen_threads(ranks, agents) -> tuple:
    for a in agents:      # torchrun sets OMP_NUM_THREADS=1 when it is unset: judge what torchrun was given
        if not a["env"].get("OMP_NUM_THREADS"):
            return False, ("torchrun was started without OMP_NUM_THREADS (it then sets 1 and warns): export "
                           "OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / ranks per node ))")
    for r in ranks:
        omp, cpus = r["env"].get("OMP_NUM_THREADS"), integer(r["env"].get("SLURM_CPUS_PER_TASK"))
        if not omp:
            return False, (f"rank {r['rank']} saw no OMP_NUM_THREADS: PyTorch then starts a thread per core of the "
                           "node in every rank; export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK")
        if not omp.isdigit():
            return False, (f"rank {r['rank']} saw OMP_NUM_THREADS={omp!r}, not a number: OpenMP ignores it and starts "
                           "a thread per core of the node in every rank; export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK")
        # srun: each task has its own CPUs; torchrun: the node's ranks share the one task's CPUs
        sharing = sum(x["host"] == r["host"] for x in ranks) if agents else 1
        if cpus and omp.isdigit() and int(omp) * sharing > cpus:
            return False, (f"rank {r['rank']}: OMP_NUM_THREADS={omp} x {sharing} rank(s) sharing {cpus} CPU(s) "
                           "of the task: more threads than CPUs")
    return True, f"the ranks saw OMP_NUM_THREADS={ranks[0]['env'].get('OMP_NUM_THREADS')}"
