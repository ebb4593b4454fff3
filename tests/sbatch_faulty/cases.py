"""Faulty job scripts that `course check sbatch` must catch, at the right item and with the right reason
(tests/faulty.py says how a case is declared; tests/test_sbatch_check.py reads them, and runs the ones marked
``slurm`` on the local Slurm, where the verdicts come from what the ranks saw).

Each is the reference (solutions/03_jobs/ddp.sbatch) with a mistake learners make typed in.
"""
from dataclasses import dataclass, field

from faulty import Faulty

PASS = ("pass", "")
SRUN = 'srun --label python "${SCRIPT:-exercises/02_ddp/mnist_classify_ddp.py}"'
PORT = "export MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 20000 ))\n"
OMP = "export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK\n"
GPU_SITE = {"site": "example-gpu-cluster"}
# the reference as written for the example GPU site (course_lib.sbatch.site_lines.reference), then the edits
GPU_REFERENCE = {"site": "example-gpu-cluster", "render": True}
MASTER = 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
TWO_NODES = ("#SBATCH --nodes=1\n", "#SBATCH --nodes=2\n")
TORCHRUN = ('srun --label torchrun --nnodes=$SLURM_JOB_NUM_NODES --nproc_per_node=2 --rdzv_backend=c10d '
            '--rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT "${SCRIPT:-exercises/02_ddp/mnist_classify_ddp.py}"')
# torchrun's static rendezvous on two nodes, one torchrun (task) per node: the node rank is the script's to give
STATIC = TORCHRUN.replace("--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT",
                          "--node_rank=$SLURM_NODEID --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT")
ONE_TORCHRUN_PER_NODE = [TWO_NODES, ("--ntasks-per-node=2\n#SBATCH --cpus-per-task=2",
                                     "--ntasks-per-node=1\n#SBATCH --cpus-per-task=4"),
                         (OMP, "export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / 2 ))\n")]
IN_BATCH_STEP = ("bash expands \\$SLURM_{} once, in the batch step, which runs on the first node of the job, where "
                 "SLURM_{} is 0.*--node_rank=0.*srun bash -c 'torchrun ... --node_rank=\\$SLURM_NODEID ...' \\(single "
                 "quotes.*--rdzv_backend=c10d --rdzv_endpoint=\\$MASTER_ADDR:\\$MASTER_PORT --rdzv_id=\\$SLURM_JOB_ID")

# the whole launch line, for the edits that hand it to a wrapper script srun runs on each task
LAUNCH = SRUN + ' --dataset auto --epochs 1 "$@"'


@dataclass
class Beside(Faulty):
    """A case whose job script runs a second file (``srun bash run_node.sh``), written next to it."""
    beside: dict = field(default_factory=dict)      # file name -> text

    def write(self, solution, folder, dest):
        path = super().write(solution, folder, dest)
        for name, text in self.beside.items():
            (path.parent / name).write_text(text)
        return path


def wrapper(command: str) -> dict:
    """run_node.sh that runs ``command`` (srun's words left out) with the reference's arguments."""
    return {"run_node.sh": "#!/bin/bash\n# srun runs this on each task\nset -e\n"
                           + command.removeprefix("srun --label ") + " --dataset auto --epochs 1\n"}


def per_node(torchrun: str) -> list:
    """The edits that start ``torchrun`` (its words as one string) through srun bash -c '...' (single quotes)."""
    return [(SRUN, "srun --label bash -c '" + torchrun.removeprefix("srun --label ")),
            ('--epochs 1 "$@"', "--epochs 1'")]


CASES = [
    Faulty("no_master_port", why="MASTER_PORT is never set: the ranks cannot meet (the DDP script's default "
                                 "29500 hides it on one node, and collides with any other job there)",
           edits=[(PORT, "")], options={"slurm": True},
           expect={"MASTER_ADDR/PORT": ("fail", "MASTER_PORT"), "launch": PASS, "OMP_NUM_THREADS": PASS}),
    Faulty("master_not_exported", why="MASTER_ADDR=... without export: srun's tasks do not inherit it",
           edits=[("export MASTER_ADDR=", "MASTER_ADDR=")],
           expect={"MASTER_ADDR/PORT": ("fail", "MASTER_ADDR")}),
    Faulty("no_omp_threads", why="OMP_NUM_THREADS not set: every rank starts a thread per core of the node",
           edits=[(OMP, "")],
           expect={"OMP_NUM_THREADS": ("fail", "OMP_NUM_THREADS"), "MASTER_ADDR/PORT": PASS}),
    Faulty("python_without_srun", why="python instead of srun python: one process in the batch step, not two ranks",
           edits=[(SRUN, 'python "${SCRIPT:-exercises/02_ddp/mnist_classify_ddp.py}"')], options={"slurm": True},
           expect={"launch": ("fail", "python runs once.*srun python"), "ranks": ("fail", "1 rank\\(s\\) started.*for 2")}),
    Faulty("srun_without_script", why="srun runs something else; the training runs once, outside it",
           edits=[(SRUN, 'srun --label hostname\npython "${SCRIPT:-exercises/02_ddp/mnist_classify_ddp.py}"')],
           expect={"launch": ("fail", "give it the training script")}),
    Faulty("ntasks_vs_gpus", why="4 GPUs per node, 2 tasks: two GPUs idle",
           edits=[("#SBATCH --nodes=1\n", "#SBATCH --nodes=1\n#SBATCH --gpus-per-node=4\n")], options=GPU_SITE,
           expect={"ranks and GPUs": ("fail", "2 task\\(s\\) per node but 4 GPU"),
                   "site profile": ("fail", "--partition=gpu")}),
    Faulty("gpus_per_task", why="--gpus-per-task binds each rank to one GPU: cuda:LOCAL_RANK fails on rank 1",
           edits=[("#SBATCH --nodes=1\n", "#SBATCH --nodes=1\n#SBATCH --gpus-per-task=1\n"),
                  ("${SCRIPT:-exercises/02_ddp", "${SCRIPT:-solutions/02_ddp")], options=GPU_SITE,
           expect={"ranks and GPUs": ("fail", "invalid device ordinal.*and the training script does:\n  "
                                              "solutions/02_ddp/mnist_classify_ddp.py:\\d+: .*local_rank")}),
    Faulty("torchrun_per_task", why="srun torchrun with 2 tasks per node: two torchruns, each starting 2 ranks",
           edits=[(SRUN, TORCHRUN)], options={"slurm": True},
           expect={"launch": ("fail", "torchrun with 2 tasks per node.*--ntasks-per-node=1"),
                   "process group": ("fail", "")}),
    Faulty("directive_after_command", why="an #SBATCH line below the first command is a comment to sbatch",
           edits=[("#SBATCH --time=00:10:00\n", ""), ("set -eo pipefail\n", "set -eo pipefail\n#SBATCH --time=00:10:00\n")],
           expect={"directives": ("fail", "line \\d+: #SBATCH --time=00:10:00 comes after the first command")}),
    Faulty("typo_in_directive", why="--ntask-per-node: sbatch stops at an option it does not know",
           edits=[("--ntasks-per-node=2", "--ntask-per-node=2")],
           expect={"directives": ("fail", "no option --ntask-per-node \\(did you mean --ntasks-per-node\\?\\)")}),
    Faulty("space_in_directive", why="'# SBATCH' is a comment: the job gets one task, the site's default",
           edits=[("#SBATCH --ntasks-per-node=2", "# SBATCH --ntasks-per-node=2")],
           expect={"directives": ("fail", "# SBATCH --ntasks-per-node=2 is a comment to sbatch")}),
    Faulty("too_many_cpus", why="2 tasks x 8 CPUs on a 4-CPU node: Slurm never starts it",
           edits=[("--cpus-per-task=2", "--cpus-per-task=8")],
           expect={"site profile": ("fail", "more than the 4 CPUs")}),
    # where rank 0 is: mistakes that one node hides (they fail read only and on the one-node Slurm alike)
    Faulty("localhost_on_two_nodes", why="MASTER_ADDR=localhost with --nodes=2: each node dials its own loopback; "
                                         "the one-node test Slurm refuses 2 nodes, the verdict still comes",
           edits=[TWO_NODES, (MASTER, "export MASTER_ADDR=localhost")], options={"slurm": True},
           expect={"MASTER_ADDR/PORT": ("fail", "line \\d+: MASTER_ADDR=localhost is a loopback address, and the job "
                                                "has --nodes=2.*head -n 1"),
                   "launch": PASS,
                   "sbatch accepts it": ("skipped", "this Slurm has 1 node\\(s\\) and the script asks for --nodes=2"),
                   "ranks": ("skipped", "not run")}),
    Faulty("loopback_tasks_spread", why="127.0.0.1, no --nodes, --ntasks=4: Slurm may put the tasks on 2+ nodes",
           edits=[("#SBATCH --nodes=1\n", ""), ("--ntasks-per-node=2", "--ntasks=4"),
                  (MASTER, "export MASTER_ADDR=127.0.0.1")],
           expect={"MASTER_ADDR/PORT": ("fail", "127.0.0.1 is a loopback address, and the job has --ntasks=4 and no "
                                                "--nodes.*may spread"),
                   "directives": ("fail", "missing #SBATCH --nodes")}),
    Faulty("nodelist_as_master", why="MASTER_ADDR=$SLURM_JOB_NODELIST: node[1-2] on two nodes, not a host",
           edits=[(MASTER, "export MASTER_ADDR=$SLURM_JOB_NODELIST")], options={"slurm": True},
           expect={"MASTER_ADDR/PORT": ("fail", "compressed form \\(node\\[1-2\\] on two nodes\\), not a host name"),
                   "ranks": PASS}),
    Faulty("nodelist_cut_on_commas", why="cut -d, -f1 of node[1-2] keeps it whole",
           edits=[(MASTER, 'export MASTER_ADDR=$(echo "$SLURM_JOB_NODELIST" | cut -d, -f1)')],
           expect={"MASTER_ADDR/PORT": ("fail", "compressed form")}),
    Faulty("every_hostname_as_master", why="scontrol show hostnames without head: one name per node",
           edits=[(MASTER, 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST")')],
           expect={"MASTER_ADDR/PORT": ("fail", "one per line.*head -n 1")}),
    Faulty("submit_host_as_master", why="the login node the job came from: no rank runs there",
           edits=[(MASTER, "export MASTER_ADDR=$SLURM_SUBMIT_HOST")],
           expect={"MASTER_ADDR/PORT": ("fail", "login node")}),
    Faulty("fixed_host_as_master", why="a host name typed in from an earlier job: Slurm picks the nodes",
           edits=[(MASTER, "export MASTER_ADDR=node001")],
           expect={"MASTER_ADDR/PORT": ("fail", "MASTER_ADDR=node001 is a fixed host")}),
    Faulty("torchrun_rdzv_localhost", why="torchrun's endpoint on localhost with 2 nodes: a rendezvous per node",
           edits=[TWO_NODES, ("--ntasks-per-node=2\n#SBATCH --cpus-per-task=2", "--ntasks-per-node=1\n#SBATCH "
                                                                              "--cpus-per-task=4"),
                  (SRUN, TORCHRUN.replace("$MASTER_ADDR:$MASTER_PORT", "localhost:29500"))],
           expect={"MASTER_ADDR/PORT": ("fail", "torchrun --rdzv_endpoint=localhost:29500 is a loopback address.*"
                                                "--rdzv-endpoint=\\$MASTER_ADDR:\\$MASTER_PORT.*c10d"),
                   "launch": PASS}),
    # the job ends at once
    Faulty("srun_in_background", why="srun ... & with no wait: the batch script ends, the job ends, no rank runs",
           edits=[('--epochs 1 "$@"', '--epochs 1 "$@" &')], options={"slurm": True},
           expect={"launch": ("fail", "line \\d+: `srun --label python ... &` runs in the background and nothing "
                                      "waits for it.*add `wait`"),
                   "ranks": ("fail", "2 rank\\(s\\) expected, no rank seen: the job COMPLETED \\d+ s after it was "
                                     "submitted")}),
    Faulty("torchrun_nnodes_one", why="--nnodes=1 copied from a one-node example into a two-node job",
           edits=[TWO_NODES, ("--ntasks-per-node=2\n#SBATCH --cpus-per-task=2", "--ntasks-per-node=1\n#SBATCH "
                                                                              "--cpus-per-task=4"),
                  (SRUN, TORCHRUN.replace("--nnodes=$SLURM_JOB_NUM_NODES", "--nnodes=1"))],
           expect={"launch": ("fail", "torchrun --nnodes=1, but the job has --nodes=2.*--nnodes=\\$SLURM_JOB_NUM_NODES"),
                   "MASTER_ADDR/PORT": PASS}),
    Faulty("omp_without_cpus_per_task", why="$SLURM_CPUS_PER_TASK is unset without --cpus-per-task: OMP is empty",
           edits=[("#SBATCH --cpus-per-task=2\n", "")],
           expect={"OMP_NUM_THREADS": ("fail", "no #SBATCH --cpus-per-task.*SLURM_CPUS_PER_TASK only when")}),
    Faulty("srun_one_task", why="srun -n 1 copied from a serial job: one rank of the job's two",
           edits=[("srun --label python", "srun -n 1 --label python")],
           expect={"launch": ("fail", "line \\d+: srun -n 1 starts 1 task\\(s\\) of the job's 2: the others never "
                                      "train")}),
    # graded by the site's rules (example GPU profile: partition, account, reservation, 4 GPUs per node)
    Faulty("gpu_site_no_gpus", why="a GPU site, and the script asks for no GPU: the ranks would train on the CPU",
           edits=[("#SBATCH --gpus-per-node=4\n", "")], options=GPU_REFERENCE,
           expect={"ranks and GPUs": ("fail", "no GPUs asked for, on site 'example-gpu-cluster' whose nodes have 4: "
                                              "the ranks would use the CPU \\(gloo\\).*--gpus-per-node=4"),
                   "site profile": PASS}),
    Faulty("gpu_site_two_of_four", why="4 GPUs asked for, 2 tasks: half the GPUs idle",
           edits=[("--ntasks-per-node=4", "--ntasks-per-node=2")], options=GPU_REFERENCE,
           expect={"ranks and GPUs": ("fail", "2 task\\(s\\) per node but 4 GPU")}),
    Faulty("gpu_site_wrong_partition", why="the site block edited: another partition",
           edits=[("--partition=gpu", "--partition=cpu")], options=GPU_REFERENCE,
           expect={"site profile": ("fail", "#SBATCH --partition=gpu \\(site 'example-gpu-cluster'\\), not cpu"),
                   "ranks and GPUs": PASS}),
    Faulty("gpu_site_lines_deleted", why="the site block deleted: no reservation, no account",
           edits=[("#SBATCH --account=my-project\n#SBATCH --reservation=workshop\n", "")], options=GPU_REFERENCE,
           expect={"site profile": ("fail", "--account=my-project \\(site 'example-gpu-cluster'\\), missing.*"
                                            "--reservation=workshop.*to copy in.*#SBATCH --partition=gpu\n"
                                            "#SBATCH --account=my-project\n#SBATCH --reservation=workshop")}),
    Faulty("gpu_site_fixed_visible_devices", why="CUDA_VISIBLE_DEVICES=0 typed in: all 4 ranks on the one GPU",
           edits=[(OMP, OMP + "export CUDA_VISIBLE_DEVICES=0\n")], options=GPU_REFERENCE,
           expect={"ranks and GPUs": ("fail", "line \\d+: export CUDA_VISIBLE_DEVICES=0 replaces the list Slurm gives.*"
                                              "Delete the line")}),
    Faulty("generic_file_on_gpu_site", why="the repository's file (site lines for 'generic') checked on the GPU site",
           options=GPU_SITE,
           expect={"site profile": ("fail", "written for site 'generic'.*#SBATCH --partition=gpu"),
                   "ranks and GPUs": ("fail", "CPU \\(gloo\\)")}),
    # what the probe stands in for: the command line it replaced (the file, in the job's folder, and its options)
    Faulty("training_script_missing", why="a path typed wrong: every rank stops with python's can't open file",
           edits=[("exercises/02_ddp/mnist_classify_ddp.py", "exercises/02_ddp/mnist_ddp.py")], options={"slurm": True},
           expect={"training script": ("fail", "no such file in the job's working directory"),
                   "ranks": PASS}),
    Faulty("training_script_other_file", why="the serial script of notebook 01: no process group, each rank alone",
           edits=[("exercises/02_ddp/mnist_classify_ddp.py", "solutions/01_serial/mnist_classify.py")],
           expect={"training script": ("fail", "not the exercise's training file")}),
    Faulty("training_option_unknown", why="--num-epochs: argparse stops every rank with unrecognized arguments",
           edits=[("--epochs 1", "--num-epochs 1")],
           expect={"training script": ("fail", "has no option --num-epochs.*unrecognized arguments")}),
    # rules notebook 03 teaches: the port from the job id, below the ephemeral range; threads that fit the task
    Faulty("fixed_master_port", why="MASTER_PORT=29500: a second job on the node collides",
           edits=[(PORT, "export MASTER_PORT=29500\n")], options={"slurm": True},
           expect={"MASTER_ADDR/PORT": ("fail", "MASTER_PORT=29500 is not derived from the job id"),
                   "ranks": PASS}),
    Faulty("random_master_port", why="a random port: two jobs can still draw the same one",
           edits=[(PORT, "export MASTER_PORT=$(( 10000 + RANDOM % 20000 ))\n")],
           expect={"MASTER_ADDR/PORT": ("fail", "not derived from the job id")}),
    Faulty("port_in_ephemeral_range", why="20000 + id % 20000 reaches 39999, into Linux's 32768-60999",
           edits=[(PORT, "export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))\n")],
           expect={"MASTER_ADDR/PORT": ("fail", "reaches 32768-39999, inside Linux's ephemeral range")}),
    Faulty("port_is_the_job_id", why="the job id itself: past 65535 on a cluster with many jobs",
           edits=[(PORT, "export MASTER_PORT=$SLURM_JOB_ID\n")],
           expect={"MASTER_ADDR/PORT": ("fail", "can be \\d+ for some job ids, not a port")}),
    Faulty("torchrun_fixed_port", why="torchrun's endpoint on a fixed port",
           edits=[TWO_NODES, ("--ntasks-per-node=2\n#SBATCH --cpus-per-task=2", "--ntasks-per-node=1\n#SBATCH "
                                                                              "--cpus-per-task=4"),
                  (OMP, "export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / 2 ))\n"),
                  (SRUN, TORCHRUN.replace("$MASTER_ADDR:$MASTER_PORT", "$MASTER_ADDR:29500"))],
           expect={"MASTER_ADDR/PORT": ("fail", "torchrun's rendezvous port: MASTER_PORT=29500 is not derived")}),
    Faulty("omp_more_than_cpus", why="8 threads per rank on 2 CPUs per task",
           edits=[(OMP, "export OMP_NUM_THREADS=8\n")], options={"slurm": True},
           expect={"OMP_NUM_THREADS": ("fail", "is 8 thread\\(s\\) per rank; each rank's task has 2 CPU\\(s\\).*more "
                                               "threads than CPUs")}),
    Faulty("omp_from_nproc", why="$(nproc) in the batch script: the CPUs of every task on the node",
           edits=[(OMP, "export OMP_NUM_THREADS=$(nproc)\n")],
           expect={"OMP_NUM_THREADS": ("fail", "counts the CPUs of every task of the job on the node")}),
    Faulty("omp_torchrun_not_shared", why="torchrun's 2 ranks share one task's CPUs: each may have half",
           edits=[("--ntasks-per-node=2\n#SBATCH --cpus-per-task=2", "--ntasks-per-node=1\n#SBATCH --cpus-per-task=4"),
                  (SRUN, TORCHRUN)],
           expect={"OMP_NUM_THREADS": ("fail", "2 rank\\(s\\) sharing the task's 4 CPU\\(s\\).*/ 2")}),
    # what bash and sbatch make of the text (audit of the check: each passed before, on another Slurm or none)
    Faulty("omp_missing_dollar", why="OMP_NUM_THREADS=SLURM_CPUS_PER_TASK: no $, so the ranks get that text, which "
                                     "OpenMP ignores (a thread per core)",
           edits=[(OMP, "export OMP_NUM_THREADS=SLURM_CPUS_PER_TASK\n")], options={"slurm": True},
           expect={"OMP_NUM_THREADS": ("fail", "line {line:OMP_NUM_THREADS=SLURM}: OMP_NUM_THREADS=SLURM_CPUS_PER_TASK "
                                               "is text to bash, not a number.*=\\$SLURM_CPUS_PER_TASK"),
                   "ranks": PASS}),
    Faulty("port_without_arithmetic", why="MASTER_PORT=10000+SLURM_JOB_ID%20000: no $(( )), so text, not a port",
           edits=[(PORT, "export MASTER_PORT=10000+SLURM_JOB_ID%20000\n")], options={"slurm": True},
           expect={"MASTER_ADDR/PORT": ("fail", "MASTER_PORT=10000\\+SLURM_JOB_ID%20000 is text to bash, not a port")}),
    Faulty("port_exported_after_srun", why="the export below the srun line: bash runs it after the ranks started",
           edits=[(PORT, ""), ('--epochs 1 "$@"\n', '--epochs 1 "$@"\n' + PORT)],
           expect={"MASTER_ADDR/PORT": ("fail", "line {line:export MASTER_PORT}: export MASTER_PORT=... comes after "
                                                "the line that starts the training \\(line {line:srun --label}\\)")}),
    Faulty("leftover_ntasks_one", why="#SBATCH --ntasks=1 left from a serial job: --ntasks wins, one rank",
           edits=[("#SBATCH --ntasks-per-node=2\n", "#SBATCH --ntasks-per-node=2\n#SBATCH --ntasks=1\n")],
           options={"slurm": True},
           expect={"directives": ("fail", "line {line:--ntasks=1}: #SBATCH --ntasks=1 beside --ntasks-per-node=2 on "
                                          "1 node\\(s\\): --ntasks wins.*delete the --ntasks line"),
                   "ranks": ("fail", "1 rank\\(s\\) started.*\\(line {line:--ntasks=1}: #SBATCH --ntasks=1 sets "
                                     "the job's tasks, see directives\\)$")}),
    Faulty("two_nodes_leftover_ntasks", why="--ntasks=2 on 2 nodes beside --ntasks-per-node=2: 2 ranks, not 4",
           edits=[TWO_NODES, ("#SBATCH --ntasks-per-node=2\n", "#SBATCH --ntasks=2\n#SBATCH --ntasks-per-node=2\n")],
           expect={"directives": ("fail", "#SBATCH --ntasks=2 beside --ntasks-per-node=2 on 2 node\\(s\\).*2 "
                                          "task\\(s\\), not 4")}),
    Faulty("master_single_quoted", why="MASTER_ADDR='$(scontrol ...)': single quotes, so the text, not the host",
           edits=[(MASTER, "export MASTER_ADDR='" + MASTER.split("=", 1)[1] + "'")],
           expect={"MASTER_ADDR/PORT": ("fail", "the single quotes stop bash from running or expanding what is "
                                                "inside.*head -n 1")}),
    Faulty("master_tail_two_nodes", why="tail -n 1: the job's last node, where rank 0 does not run",
           edits=[TWO_NODES, (MASTER, MASTER.replace("head", "tail"))],
           expect={"MASTER_ADDR/PORT": ("fail", "tail -n 1 keeps the last name.*the job's last node; rank 0 runs "
                                                "on the first node.*head -n 1")}),
    Faulty("epochs_without_value", why='--epochs "$@": the value left out; argparse stops every rank',
           edits=[('--epochs 1 "$@"', '--epochs "$@"')],
           expect={"training script": ("fail", "option --epochs takes a value, and the word after it is "
                                               "\"\\$@\", the job's own arguments.*expected one argument")}),
    Faulty("torchrun_two_nodes_no_rendezvous", why="srun torchrun on 2 nodes, no rendezvous options: each node's "
                                                   "torchrun is node 0 of its own on 127.0.0.1",
           edits=[TWO_NODES, ("--ntasks-per-node=2\n#SBATCH --cpus-per-task=2", "--ntasks-per-node=1\n#SBATCH "
                                                                              "--cpus-per-task=4"),
                  (OMP, "export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / 2 ))\n"),
                  (SRUN, TORCHRUN.replace(" --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT", ""))],
           expect={"launch": ("fail", "torchrun on several nodes with no rendezvous options.*--master_addr=127.0.0.1.*"
                                      "notebook 03.*--rdzv_backend=c10d --rdzv_endpoint=\\$MASTER_ADDR:\\$MASTER_PORT"),
                   "MASTER_ADDR/PORT": ("fail", "127.0.0.1 on every node"),
                   "OMP_NUM_THREADS": PASS}),
    # a node rank bash works out once, in the batch step (sbatch(1)), not on each node
    Faulty("torchrun_node_rank_in_batch_step", why="srun torchrun --node_rank=$SLURM_NODEID: the batch step's bash "
                                                   "expands it to 0 for every node's torchrun",
           edits=ONE_TORCHRUN_PER_NODE + [(SRUN, STATIC)],
           expect={"launch": ("fail", "line {line:srun --label torchrun}: --node_rank=\\$SLURM_NODEID: "
                              + IN_BATCH_STEP.format("NODEID", "NODEID")),
                   "MASTER_ADDR/PORT": PASS}),
    Faulty("torchrun_node_rank_double_quoted", why='srun bash -c "torchrun --node_rank=$SLURM_PROCID": double quotes '
                                                   "let the batch step's bash expand it first",
           edits=ONE_TORCHRUN_PER_NODE + [(SRUN, 'srun --label bash -c "' + STATIC.removeprefix("srun --label ")
                                           .replace("NODEID", "PROCID")), ('--epochs 1 "$@"', '--epochs 1"')],
           expect={"launch": ("fail", "--node_rank=\\$SLURM_PROCID: " + IN_BATCH_STEP.format("PROCID", "PROCID"))}),
    Faulty("torchrun_node_rank_variable", why="NODE_RANK=$SLURM_NODEID set in the batch script: 0, then given to "
                                              "every node (single quotes later do not help)",
           edits=ONE_TORCHRUN_PER_NODE + [(MASTER, MASTER + "\nexport NODE_RANK=$SLURM_NODEID")]
           + per_node(STATIC.replace("$SLURM_NODEID", "$NODE_RANK")),
           expect={"launch": ("fail", "line {line:NODE_RANK=}: NODE_RANK=\\$SLURM_NODEID: "
                              + IN_BATCH_STEP.format("NODEID", "NODEID"))}),
    Faulty("torchrun_node_rank_arithmetic", why="NODE_RANK=$(( SLURM_NODEID )) in the batch script: bash reads the "
                                                "name inside $(( )) there too, on the first node: 0 for every node",
           edits=ONE_TORCHRUN_PER_NODE + [(MASTER, MASTER + "\nNODE_RANK=$(( SLURM_NODEID ))")]
           + per_node(STATIC.replace("$SLURM_NODEID", "$NODE_RANK")),
           expect={"launch": ("fail", "line {line:NODE_RANK=}: NODE_RANK=\\$\\(\\( SLURM_NODEID \\)\\): "
                              + IN_BATCH_STEP.format("NODEID", "NODEID"))}),
    # srun runs a wrapper script (run_node.sh): its lines are what each task runs
    Beside("wrapper_torchrun_no_rendezvous", why="run_node.sh's torchrun on 2 nodes, no rendezvous options: each "
                                                 "node's torchrun is node 0 of its own on 127.0.0.1",
           edits=ONE_TORCHRUN_PER_NODE + [(LAUNCH, "srun --label sh run_node.sh")],
           beside=wrapper(TORCHRUN.replace(" --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT", "")),
           expect={"launch": ("fail", "torchrun on several nodes with no rendezvous options"),
                   "MASTER_ADDR/PORT": ("fail", "127.0.0.1 on every node")}),
    Faulty("wrapper_missing", why="srun bash run_node.sh, and no run_node.sh: bash stops every task",
           edits=[(LAUNCH, "srun --label bash run_node.sh")],
           expect={"launch": ("fail", "line {line:bash run_node.sh}: srun runs run_node.sh on each task, and the check "
                                      "could not read it \\(it looked in .+ and in .+\\), so it could not see what "
                                      "each task runs: no such file there"),
                   "training script": ("skipped", "nothing to look at"), "OMP_NUM_THREADS": PASS}),
]

# Right ways that must pass (read only): the rules may not fail what works on a cluster.
CORRECT = [
    Faulty("hostname_one_node", {}, [(MASTER, "export MASTER_ADDR=$(hostname)")]),
    Faulty("hostname_two_nodes", {}, [TWO_NODES, (MASTER, "export MASTER_ADDR=`hostname -s`")]),
    Faulty("localhost_one_node", {}, [(MASTER, "export MASTER_ADDR=localhost")]),
    Faulty("head_dash_one", {}, [TWO_NODES, (MASTER, "export MASTER_ADDR=$(scontrol show hostname $SLURM_NODELIST "
                                                     "| head -1)")]),
    Faulty("array_first", {}, [TWO_NODES, (MASTER, "nodes=( $(scontrol show hostnames $SLURM_JOB_NODELIST) )\n"
                                                   "export MASTER_ADDR=${nodes[0]}")]),
    Faulty("set_then_export", {}, [TWO_NODES, (MASTER, 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" '
                                                       '| head -n 1)\nMASTER_ADDR=$head_node\nexport MASTER_ADDR')]),
    Faulty("srun_one_torchrun_per_node", {}, [
        TWO_NODES, (OMP, "export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / 2 ))\n"),
        (SRUN, TORCHRUN.replace("srun --label torchrun", "srun --label --ntasks-per-node=1 torchrun"))]),
    Faulty("background_then_wait", {}, [('--epochs 1 "$@"', '--epochs 1 "$@" &\nwait')]),
    Faulty("srun_bash_c", {}, [(SRUN, "srun --label bash -c 'python exercises/02_ddp/mnist_classify_ddp.py")
                               , ('--epochs 1 "$@"', "--epochs 1'")]),
    Faulty("port_variable", {}, [(PORT, "BASE=10000\nexport MASTER_PORT=$(( BASE + SLURM_JOB_ID % 20000 ))\n")]),
    Faulty("omp_prefix_option", {}, [("--epochs 1", "--epoch 1")]),
    # what the text rules on bash's reading must not take for a mistake
    Faulty("omp_with_comment", {}, [(OMP, "export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK   # one thread per CPU\n")]),
    Faulty("python_c_before_exports", {}, [("set -eo pipefail\n", "set -eo pipefail\npython -c 'import torch'\n")]),
    Faulty("epochs_then_flag", {}, [("--epochs 1", "--dry-run --epochs 1")]),
    # a node rank read on each node, or none needed (c10d numbers the nodes and ignores --node_rank)
    Faulty("node_rank_single_quoted", {}, ONE_TORCHRUN_PER_NODE + per_node(STATIC)),
    Faulty("node_rank_escaped", {}, ONE_TORCHRUN_PER_NODE + per_node(STATIC.replace("$SLURM", "\\$SLURM"))),
    Faulty("node_rank_set_on_each_node", {}, ONE_TORCHRUN_PER_NODE + per_node(
        STATIC.replace("torchrun", "NODE_RANK=$SLURM_NODEID; torchrun").replace("$SLURM_NODEID --", "$NODE_RANK --"))),
    Faulty("node_rank_with_c10d", {}, ONE_TORCHRUN_PER_NODE + [
        (SRUN, TORCHRUN.replace("--rdzv_backend", "--node_rank=$SLURM_NODEID --rdzv_id=$SLURM_JOB_ID --rdzv_backend"))]),
    # a wrapper script that srun runs on each task: $SLURM_NODEID there is each node's own
    Beside("wrapper_torchrun_static", {}, ONE_TORCHRUN_PER_NODE + [(LAUNCH, "srun --label bash run_node.sh")],
           beside=wrapper(STATIC)),
    Beside("wrapper_python_per_task", {}, [(LAUNCH, "srun --label --ntasks-per-node=2 ./run_node.sh")],
           beside=wrapper("exec python exercises/02_ddp/mnist_classify_ddp.py")),
]
