"""Faulty job scripts that `course check sbatch` must catch, at the right item and with the right reason
(tests/faulty.py says how a case is declared; tests/test_sbatch_check.py reads them, and runs the ones marked
``slurm`` on the local Slurm, where the verdicts come from what the ranks saw).

Each is the reference (solutions/03_jobs/ddp.sbatch) with a mistake learners make typed in.
"""
from faulty import Faulty

PASS = ("pass", "")
SRUN = 'srun --label python "${SCRIPT:-exercises/02_ddp/mnist_classify_ddp.py}"'
PORT = "export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))\n"
OMP = "export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK\n"
GPU_SITE = {"site": "example-gpu-cluster"}
TORCHRUN = ('srun --label torchrun --nnodes=$SLURM_JOB_NUM_NODES --nproc_per_node=2 --rdzv_backend=c10d '
            '--rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT "${SCRIPT:-exercises/02_ddp/mnist_classify_ddp.py}"')

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
           edits=[("#SBATCH --nodes=1\n", "#SBATCH --nodes=1\n#SBATCH --gpus-per-task=1\n")], options=GPU_SITE,
           expect={"ranks and GPUs": ("fail", "invalid device ordinal")}),
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
]
