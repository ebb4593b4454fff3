"""`course check sbatch`: what bash and sbatch make of the script's text (names without $, arithmetic outside
$(( )), --gpus for the job, torchrun's defaults on several nodes, options left without a value), and the run's
verdicts on values the ranks saw that are not numbers. No Slurm needed."""
from conftest import ROOT

from course_lib.instructor.release import solution_view
from course_lib.jobs import load_site
from course_lib.sbatch import check as sbatch_check
from course_lib.sbatch import lint, shell, site_lines, training, values, wrapper
from course_lib.sbatch.run import Outcome
from course_lib.sbatch.script import parse

REFERENCE = ROOT / "solutions" / "03_jobs" / "ddp.sbatch"
SCRIPT = "exercises/02_ddp/mnist_classify_ddp.py"


def test_values_bash_gives_as_text_not_numbers():
    s = parse("#!/bin/bash\n#SBATCH -N 1\nX=4+1\nY=4\n")
    text = ["SLURM_CPUS_PER_TASK", "10000+SLURM_JOB_ID%20000", "'$SLURM_CPUS_PER_TASK'", "$SLURM_CPUS_PER_TASK/2",
            "$X", '"$X"', "SLURM_CPUS_PER_TASK  # one per CPU"]
    numbers = ["$SLURM_CPUS_PER_TASK", '"$SLURM_CPUS_PER_TASK"', "$(( SLURM_CPUS_PER_TASK / 2 ))", "4", "'4'",
               "$Y", "${SLURM_CPUS_PER_TASK:-1}", "$(nproc)", "-1",
               "$SLURM_CPUS_PER_TASK   # one per CPU", '"$SLURM_CPUS_PER_TASK"  # one per CPU']
    assert [v for v in text if not values.not_a_number(s, v)] == []
    assert [v for v in numbers if values.not_a_number(s, v)] == []
    # a name outside $(( )) is not worked out as arithmetic (bash leaves it as text)
    assert values.expression(s, "SLURM_CPUS_PER_TASK") is None
    assert values.threads(s, '"$SLURM_CPUS_PER_TASK"  # one per CPU', 2, 1) == 2
    assert values.evaluate(values.expression(s, "$(( X * 2 ))"), {}) == 10    # inside $(( )), X's value is too


def test_the_ranks_saw_values_that_are_not_numbers():
    """What the probe reports for w01 (OMP_NUM_THREADS=SLURM_CPUS_PER_TASK) and w02 (no $(( )) in MASTER_PORT)."""
    def seen(omp, port):
        ranks = [{"kind": "rank", "rank": r, "world": 2, "local_rank": r, "launcher": "srun", "host": "n1",
                  "env": {"MASTER_ADDR": "n1", "MASTER_PORT": port, "OMP_NUM_THREADS": omp,
                          "SLURM_CPUS_PER_TASK": "2"}} for r in range(2)]
        groups = [{"kind": "group", "rank": r, "ok": True} for r in range(2)]
        return sbatch_check.behaviour(parse(REFERENCE.read_text()), Outcome(
            accepted=True, job_id="1", state="COMPLETED", records=ranks + groups))
    bad = seen("SLURM_CPUS_PER_TASK", "10000+SLURM_JOB_ID%20000")
    assert bad["OMP_NUM_THREADS"][0] is False and "not a number" in bad["OMP_NUM_THREADS"][1], bad
    assert bad["MASTER_ADDR/PORT"][0] is False and "not a port number" in bad["MASTER_ADDR/PORT"][1], bad
    good = seen("2", "20001")
    assert good["OMP_NUM_THREADS"][0] is True and good["MASTER_ADDR/PORT"][0] is True, good


def test_gpus_for_the_whole_job_count_on_one_node(tmp_path, monkeypatch):
    """r03: --gpus=4 (or -G 4), the job's total (sbatch(1)), on one node of the GPU site: that node's 4 GPUs."""
    monkeypatch.setenv("COURSE_ENGINE", "local")
    gpu = load_site("example-gpu-cluster")
    reference = site_lines.reference(solution_view(REFERENCE.read_text()), gpu)
    for written in ("--gpus=4", "-G 4"):
        path = tmp_path / f"{written[:3]}.sbatch"
        path.write_text(reference.replace("#SBATCH --gpus-per-node=4\n", f"#SBATCH {written}\n"))
        report = sbatch_check.check(path, site=gpu)
        assert report.passed, report.text()


def test_torchrun_on_several_nodes_needs_a_rendezvous():
    """torchrun's defaults (rdzv backend static, node rank 0, master 127.0.0.1) make every node node 0 of its own."""
    head = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --time=5\n"
    run = f"srun torchrun --nnodes=2 --nproc_per_node=2 {{}} {SCRIPT}\n"
    bare = parse(head + run.format(""))
    assert lint.launch(bare)[1] is False and "no rendezvous options" in lint.launch(bare)[2]
    for given in ("--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT",
                  "--rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:$MASTER_PORT"):
        assert lint.launch(parse(head + run.format(given)))[1] is True, given
    one_node = parse(head.replace("--nodes=2", "--nodes=1") + run.format("").replace("--nnodes=2", "--nnodes=1"))
    assert lint.launch(one_node)[1] is True


def test_a_training_option_without_its_value():
    full = ROOT / SCRIPT
    options = training.argparse_options(full)
    valued, known = {o for o, v in options if v}, [o for o, _ in options]
    assert "--epochs" in valued and "--save-model" not in valued and "--dry-run" not in valued

    def empty(*args):
        return training.missing_values(9, SCRIPT, list(args), valued, known)
    assert "--epochs takes a value, and the word after it is the option --lr" in empty("--epochs", "--lr", "1")[0]
    assert "is nothing" in empty("--dataset", "auto", "--epoch")[0]      # a prefix argparse takes
    assert empty("--save-model", "--epochs", "1", "--lr", "-0.5", "--epochs=2", "$@") == []


def test_a_two_node_job_not_run_is_not_approved():
    """w08/w13 on the one-node test Slurm: NOT RUN says what the text showed, never that the job would run."""
    script = parse(REFERENCE.read_text().replace("--nodes=1", "--nodes=2"))
    got = sbatch_check.behaviour(script, Outcome(accepted=False, refusal="Node count specification invalid",
                                                 nodes=1))["sbatch accepts it"]
    assert got[0] is None and "would run" not in got[1] and "come only from the script's text" in got[1], got


def test_a_per_task_variable_is_expanded_where_bash_reads_it():
    """$SLURM_NODEID: the batch step's bash expands it unquoted or in double quotes; in single quotes (srun bash -c
    '...') or escaped it is the bash srun starts on each node. A wrapper script reads it on each node too."""
    batch = ["--node_rank=$SLURM_NODEID", 'bash -c "torchrun --node_rank=${SLURM_PROCID}"', "x='a' $SLURM_LOCALID"]
    node = ["bash -c 'torchrun --node_rank=$SLURM_NODEID'", 'bash -c "torchrun --node_rank=\\$SLURM_NODEID"',
            "--node_rank=$NODE_RANK"]
    assert [c for c in batch if shell.per_task_in_batch(c) is None] == []
    assert [c for c in node if shell.per_task_in_batch(c) is not None] == []
    head = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --time=5\n"
    assert lint.node_rank_once(parse(head + "srun bash run_node.sh\n")) is None
    assert lint.node_rank_once(parse(head + f"srun torchrun --nnodes=2 --node_rank=$SLURM_NODEID {SCRIPT}\n"))


def test_the_wrapper_scripts_srun_runs_are_found():
    """srun's command is a wrapper script in the forms people write; bash -c '...' and a program are not one."""
    def found(line):
        got = wrapper.wrapper_of(parse(f"#!/bin/bash\n{line}\n").simple[0])
        return got and got[1]
    assert [found(f"srun {w}") for w in ("bash run_node.sh", "--label -n 2 sh -x run_node.sh", "./run_node.sh",
                                          "--ntasks-per-node=2 scripts/node.sh", 'bash "$DIR/run.sh"')] == \
        ["run_node.sh", "run_node.sh", "./run_node.sh", "scripts/node.sh", "$DIR/run.sh"]
    assert [found(w) for w in ("srun bash -c 'torchrun x.py'", "srun bash -lc 'python x.py'", "srun python x.sh",
                               "srun --label hostname", "bash run_node.sh")] == [None] * 5
