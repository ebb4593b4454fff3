"""The script read, not run: its #SBATCH lines against the site profile, its launch line against its #SBATCH lines.

Each rule returns ``(item, ok, message)``; ``course_lib.sbatch.check`` turns them into verdicts. The facts behind
the rules: sbatch(1) and srun(1) (directives, --gpus-per-task binding), torchrun's documentation (one agent per
node, c10d rendezvous), and the course's own template (course_lib/jobs/templates/sbatch.sh.j2).
"""
import difflib
import re

from course_lib.core.site import Site
from course_lib.sbatch import shell, site_lines, values
from course_lib.sbatch.address import FIRST_NODE, LOOPBACK, launch_env, rank0_mistakes
from course_lib.sbatch.script import KNOWN, Script, gpu_count, integer
from course_lib.sbatch.training import PLAIN, PYTHONS, gpu_bind_none, judge, local_rank_gpu, torchrun_options, words_run

LAUNCHERS = {"srun", "torchrun", "python", "python3", "mpirun", "mpiexec"}


def tasks_per_node(s: Script) -> int | None:
    per_node = integer(s.get("ntasks-per-node"))
    if per_node is not None:
        return per_node
    ntasks, nodes = integer(s.get("ntasks")), integer(s.get("nodes", "1"))
    return ntasks // nodes if ntasks and nodes and ntasks % nodes == 0 else None


def gpus_per_node(s: Script) -> int:
    for key in ("gpus-per-node", "gres"):
        n = gpu_count(s.get(key))
        if n is not None:
            return n
    per_task, tasks = gpu_count(s.get("gpus-per-task")), tasks_per_node(s)
    if per_task and tasks:
        return per_task * tasks
    total, nodes = gpu_count(s.get("gpus")), integer(s.get("nodes", "1"))    # --gpus, -G: the job's total (sbatch(1))
    return total // nodes if total and nodes and total % nodes == 0 else 0


def launcher(s: Script) -> str:
    """"torchrun", "srun" (srun starts python, also through ``bash -c '...'`` or a wrapper script, which
    course_lib.sbatch.wrapper reads in as one; so does torchrun), "srun-without-script", "mpirun", "python" (no srun)
    or "none"."""
    if any("torchrun" in {w.rsplit("/", 1)[-1] for w in words_run(c)} for c in s.simple) or \
            any("torch.distributed.run" in c for _, c in s.commands):
        return "torchrun"
    runs = [(c.name, {w.rsplit("/", 1)[-1] for w in words_run(c)}) for c in s.simple]
    if any(name == "srun" for name, _ in runs):
        return "srun" if any(name == "srun" and PYTHONS & words for name, words in runs) else "srun-without-script"
    if any(name in ("mpirun", "mpiexec") and PYTHONS & words for name, words in runs):
        return "mpirun"
    return "python" if any(PYTHONS & words for _, words in runs) else "none"


def directives(s: Script) -> tuple:
    msgs = [f"line {n}: {text} comes after the first command, so sbatch ignores it; move it above `set`, "
            "`export`, ... (sbatch reads #SBATCH lines only before the first command)" for n, text in s.ignored]
    msgs += [f"line {n}: {text} is a comment to sbatch, which reads only lines that start with '#SBATCH ' exactly"
             for n, text in s.misspelt]
    for d in s.directives:
        if d.key not in KNOWN and len(d.key) > 1:
            hint = difflib.get_close_matches(d.key, sorted(KNOWN), n=1)
            guess = f" (did you mean --{hint[0]}?)" if hint else ""
            msgs.append(f"line {d.line}: sbatch has no option --{d.key}{guess}; sbatch stops: 'unrecognized option'")
    msgs += [m for m in [task_conflict(s)] if m]
    missing = [k for k in ("nodes", "time") if s.get(k) is None]
    if s.get("ntasks-per-node") is None and s.get("ntasks") is None:
        missing.append("ntasks-per-node")
    if missing:
        msgs.append("missing " + ", ".join(f"#SBATCH --{k}=..." for k in missing)
                    + ": say how many nodes, how many tasks on each, and for how long (Slurm's defaults are "
                      "the site's, often 1 task and a short or a very long time limit)")
    return "directives", not msgs, "\n".join(msgs) or "nodes, tasks and time limit given"


def task_conflict(s: Script) -> str | None:
    """--ntasks beside --ntasks-per-node that disagree on the given --nodes: sbatch(1) lets --ntasks win (the
    per-node count is then a maximum), so the job gets --ntasks tasks."""
    ntasks, per_node, nodes = (integer(s.get(k)) for k in ("ntasks", "ntasks-per-node", "nodes"))
    if not (ntasks and per_node and nodes) or ntasks == per_node * nodes:
        return None
    line = next(d.line for d in reversed(s.directives) if d.key == "ntasks")
    return (f"line {line}: #SBATCH --ntasks={ntasks} beside --ntasks-per-node={per_node} on {nodes} node(s): "
            f"--ntasks wins (sbatch(1): --ntasks-per-node is then a maximum), so the job has {ntasks} task(s), not "
            f"{per_node * nodes}; delete the --ntasks line")


def site_profile(s: Script, site: Site) -> tuple:
    msgs = []
    for key in ("partition", "account", "reservation", "qos"):
        want, have = getattr(site, key), s.get(key)
        if want and have != want:
            msgs.append(f"#SBATCH --{key}={want} (site '{site.name}'), " + (f"not {have}" if have else "missing"))
    if msgs:
        lines = "\n".join(site_lines.directives(site))
        was = site_lines.written_for(s.text)
        stale = f" (this file's site lines were written for site '{was}')" if was and was != site.name else ""
        msgs.append(f"the lines of site '{site.name}'{stale}, to copy in and keep as they are:\n{lines}")
    tasks, cpus = tasks_per_node(s), integer(s.get("cpus-per-task", "1"))
    if tasks and cpus and tasks * cpus > site.cpus_per_node:
        msgs.append(f"{tasks} task(s) x {cpus} CPU(s) per node is more than the {site.cpus_per_node} CPUs of a "
                    f"node of site '{site.name}': Slurm would never start it")
    gpus = gpus_per_node(s)
    if gpus > site.gpus_per_node:
        msgs.append(f"{gpus} GPU(s) per node asked for; a node of site '{site.name}' has {site.gpus_per_node}")
    fits = f"fits site '{site.name}' ({site.cpus_per_node} CPUs, {site.gpus_per_node} GPUs per node)"
    return "site profile", not msgs, "\n".join(msgs) or fits


def ranks_and_gpus(s: Script, site: Site, workdir) -> tuple:
    how, tasks, gpus = launcher(s), tasks_per_node(s), gpus_per_node(s)
    if s.get("gpus-per-task") and how == "srun" and not gpu_bind_none(s):
        bound = (f"--gpus-per-task={s.get('gpus-per-task')} binds each task to its own GPU (sbatch(1): it implies "
                 "--gpu-bind=per_task), so every rank sees one GPU, cuda:0; a script that picks cuda:LOCAL_RANK "
                 "fails on local rank 1 with 'invalid device ordinal'")
        picks = local_rank_gpu(s, workdir)
        if picks:
            return ("ranks and GPUs", False, f"{bound}, and the training script does:\n  " + "\n  ".join(picks[:3])
                    + "\nAsk --gpus-per-node instead, or add --gpu-bind=none (sbatch(1): none turns that binding "
                    "off), or pick cuda:0, the one GPU a rank sees")
        return ("ranks and GPUs", None, f"{bound}; one that picks cuda:0 works. "
                + ("The training script picks no GPU by the local rank that the check could find; which device "
                   "it uses is known only from a run on GPUs (not looked at)" if picks == [] else
                   "The check could not read the training script (not looked at)"))
    if not gpus and site.gpus_per_node:
        return ("ranks and GPUs", False, f"no GPUs asked for, on site '{site.name}' whose nodes have "
                f"{site.gpus_per_node}: the ranks would use the CPU (gloo) and the GPUs stay idle; ask for them "
                f"({site_lines.gpu_line(site, site.gpus_per_node)[8:]}) and start one task (rank) per GPU")
    if not gpus:
        return "ranks and GPUs", True, "no GPUs asked for: the ranks use the CPU (gloo)"
    if "CUDA_VISIBLE_DEVICES" in s.exports:
        line, value = s.exports["CUDA_VISIBLE_DEVICES"]
        return ("ranks and GPUs", False,
                f"line {line}: export CUDA_VISIBLE_DEVICES={value} replaces the list Slurm gives the job's tasks (the "
                "GPUs it allocated, which on a shared node need not be 0, 1, ...): the ranks may see too few GPUs "
                "('invalid device ordinal' for cuda:LOCAL_RANK) or GPUs that are not the job's. Delete the line")
    if how == "torchrun":
        nproc = torchrun_nproc(s)
        ok = nproc is None or nproc == gpus
        return ("ranks and GPUs", ok, f"torchrun starts {nproc} rank(s) per node on {gpus} GPU(s): "
                "give --nproc_per_node the number of GPUs per node" if not ok else "one rank per GPU")
    ok = tasks == gpus
    return ("ranks and GPUs", ok, "one task (rank) per GPU" if ok else
            f"{tasks} task(s) per node but {gpus} GPU(s) per node: with srun, one task per GPU "
            "(--ntasks-per-node equal to the GPUs per node)")


def torchrun_nproc(s: Script) -> int | None:
    return integer(torchrun_options(s).get("nproc_per_node"))


def backgrounded(s: Script) -> list[str]:
    """Launch lines run in the background (``srun ... &``) with no ``wait`` after them."""
    return [f"line {c.line}: `{' '.join(c.words[:3])} ... &` runs in the background and nothing waits for it: the "
            "batch script reaches its end at once, and when the batch script ends the job ends and Slurm stops its "
            "steps, so no rank trains. Remove the `&`, or add `wait` after the last background srun"
            for i, c in enumerate(s.simple) if c.background and LAUNCHERS & {w.rsplit("/", 1)[-1] for w in c.words}
            and not any(later.name == "wait" for later in s.simple[i + 1:])]


def srun_shrinks(s: Script, tasks, nodes) -> list[str]:
    """srun lines that start the training on fewer tasks or nodes than the job has (``srun -n 1 python ...``)."""
    names = {"-n": "ntasks", "--ntasks": "ntasks", "-N": "nodes", "--nodes": "nodes"}
    msgs = []
    for c in s.simple:
        base = [w.rsplit("/", 1)[-1] for w in c.words]
        starts = [i for i, w in enumerate(base) if w in ("python", "python3", "torchrun")]
        if c.name != "srun" or not starts:
            continue
        options = c.words[1:starts[0]]
        for i, w in enumerate(options):
            key, eq, value = w.partition("=")
            if key not in names and w[:2] in ("-n", "-N") and len(w) > 2:
                key, value = w[:2], w[2:]                              # -n1
            elif key in names and not eq:
                value = options[i + 1] if i + 1 < len(options) else ""  # -n 1, --ntasks 1
            what = names.get(key)
            want = {"ntasks": tasks * nodes if tasks else None, "nodes": nodes}.get(what)
            if want and integer(value) is not None and integer(value) < want:
                msgs.append(f"line {c.line}: srun {key} {value} starts {value} {'task' if what == 'ntasks' else 'node'}"
                            f"(s) of the job's {want}: the others never train; leave it out (srun takes the job's "
                            "tasks and nodes)")
    return msgs


def launch(s: Script) -> tuple:
    how, tasks = launcher(s), tasks_per_node(s)
    nodes = integer(s.get("nodes", "1")) or 1
    waits = backgrounded(s) + (srun_shrinks(s, tasks, nodes) if how in ("srun", "torchrun") else [])
    if waits:
        return "launch", False, "\n".join(waits)
    if s.unread:
        return unread_wrapper(*s.unread[0])
    if how == "none":
        return "launch", False, "no line starts the training: srun python SCRIPT (or srun torchrun ... SCRIPT)"
    if how == "srun-without-script":
        return "launch", False, ("srun runs a command on every task: give it the training script "
                                 "(srun python SCRIPT ...), not a bare srun")
    if how == "mpirun":
        return "launch", None, ("mpirun starts one process per task, as srun does, but numbers them in its own "
                                "variables (OMPI_COMM_WORLD_RANK, PMI_RANK), not in SLURM_PROCID or RANK, which the "
                                "course's DDP script and the check's probe read: whether your training script reads "
                                "mpirun's is in the Python (not looked at). The course teaches srun python SCRIPT")
    if how == "python" and ((tasks or 1) > 1 or nodes > 1):
        return "launch", False, (f"python runs once, in the batch step on the first node, not once per task: "
                                 f"the other {max(tasks or 1, 1) * nodes - 1} task(s) never start; "
                                 "start it with srun python SCRIPT")
    if how == "python" and tasks is None:
        return "launch", False, ("python runs once, and the script asks no tasks (Slurm then gives one): a single "
                                 "rank. Ask --ntasks-per-node=N and start one rank per task: srun python SCRIPT")
    if how == "torchrun":
        return _torchrun(s, tasks, nodes)
    return "launch", True, {"srun": "srun starts one rank per task", "python": "one process"}[how]


def unread_wrapper(line: int, written: str, folders) -> tuple:
    """srun runs a wrapper script (course_lib.sbatch.wrapper) that is not in ``folders``: the check cannot see
    what each task runs; a path it could not work out is not looked at, a file that is not there fails."""
    where = " and in ".join(str(f) for f in dict.fromkeys(folders))
    said = (f"line {line}: srun runs {written} on each task, and the check could not read it (it looked in {where}), "
            "so it could not see what each task runs")
    if "$" in written or "`" in written:
        return "launch", None, f"{said}: the path comes from a variable (not looked at)"
    return "launch", False, (f"{said}: no such file there, and bash would stop every task with 'No such file or "
                             "directory'; keep it in the folder you submit from (the job's working directory)")


def _torchrun(s: Script, tasks, nodes) -> tuple:
    line = " ".join(c for _, c in s.commands if "torchrun" in c or "torch.distributed.run" in c)
    per_node = re.search(r"\bsrun\b.*?--ntasks-per-node[= ](\d+).*?torch", line)
    tasks = int(per_node.group(1)) if per_node else tasks     # srun --ntasks-per-node=1 torchrun: the step's own
    if tasks != 1:
        return "launch", False, (f"torchrun with {tasks} tasks per node: srun starts one torchrun per task, and "
                                 "each starts all the ranks of a node; ask --ntasks-per-node=1 and let torchrun's "
                                 "--nproc_per_node start the ranks")
    if "srun" not in line and nodes > 1:
        return "launch", False, "torchrun without srun runs on the first node only: srun torchrun ..."
    if nodes > 1 and "--standalone" in line:
        return "launch", False, ("--standalone is a rendezvous on this node only; with several nodes use "
                                 "--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT")
    if nodes > 1 and not rendezvous(s):
        return "launch", False, NO_RENDEZVOUS
    once = node_rank_once(s) if nodes > 1 else None
    if once:
        return "launch", False, once
    nnodes = torchrun_options(s).get("nnodes", "")
    most = max((integer(n) or 0 for n in nnodes.split(":")), default=0)
    if most and most != nodes:
        fate = "it never completes" if most > nodes else "the torchruns of the other nodes wait and are left out"
        return "launch", False, (f"torchrun --nnodes={nnodes}, but the job has --nodes={nodes}: the rendezvous "
                                 f"waits for {most} node(s), so {fate}; give --nnodes=$SLURM_JOB_NUM_NODES")
    return "launch", True, "one torchrun per node, which starts the node's ranks"


NO_RENDEZVOUS = ("torchrun on several nodes with no rendezvous options: its defaults are --rdzv_backend=static, "
                 "--node_rank=0 and --master_addr=127.0.0.1 (torch.distributed.run), so the torchrun of every node "
                 "is node 0 on its own loopback and the job waits until its time limit; give the c10d rendezvous "
                 "on the job's first node (notebook 03): --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT")


def rendezvous(s: Script) -> bool:
    """torchrun is told where its nodes meet: a rendezvous backend other than static with an endpoint, or
    --master_addr/--master_port with --node_rank (torchrun also reads its options from PET_* variables)."""
    options = torchrun_options(s)

    def given(key):
        return options.get(key) or (s.exports.get("PET_" + key.upper(), (0, ""))[1])
    backend = given("rdzv_backend") or "static"
    return bool((backend != "static" and given("rdzv_endpoint"))
                or (given("master_addr") and given("master_port") and given("node_rank")))


def node_rank_written(s: Script, options: dict) -> tuple | None:
    """(line, as written, the text bash expands, where in it the value starts) of the node rank torchrun is given:
    its --node_rank, the script's variable that holds it (set in the batch step), or an exported PET_NODE_RANK;
    None where none is given."""
    value = options.get("node_rank")
    if value is None:
        n, text = s.exports.get("PET_NODE_RANK", (0, None))
        return (n, f"PET_NODE_RANK={text}", text, 0) if text else None
    name = PLAIN.match(value)
    if name and name.group(1) in s.values:
        n, text = s.values[name.group(1)]
        return n, f"{name.group(1)}={text}", text, 0
    line, command = next(((n, c) for n, c in s.commands if re.search(r"torchrun|torch\.distributed\.(run|launch)", c)),
                         (0, ""))
    at = re.search(r"--node[-_]rank\b", command)
    return (line, f"--node_rank={value}", command, at.end()) if at else None


def node_rank_once(s: Script) -> str | None:
    """A static rendezvous whose node rank reads $SLURM_NODEID, $SLURM_PROCID or $SLURM_LOCALID where the batch
    step's bash expands it: once, on the first node, where each is 0 (sbatch(1)). c10d ignores --node_rank
    (torch.distributed.run), and a value read on each node (srun bash -c '...', a wrapper script) is that node's."""
    options = torchrun_options(s)
    if (options.get("rdzv_backend") or s.exports.get("PET_RDZV_BACKEND", (0, "static"))[1]) != "static":
        return None
    found = node_rank_written(s, options)
    name = shell.per_task_in_batch(*found[2:]) if found else None
    if not name:
        return None
    return (f"line {found[0]}: {found[1]}: bash expands ${name} once, in the batch step, which runs on the first "
            f"node of the job, where {name} is 0 (sbatch(1)); so every node's torchrun gets --node_rank=0, the "
            "nodes all claim node 0 of the static rendezvous, and torchrun fails or waits there until the time "
            "limit. Read it on each node: srun bash -c 'torchrun ... --node_rank=$SLURM_NODEID ...' (single "
            "quotes: the bash that srun starts on each node expands it), or let the c10d rendezvous number the "
            "nodes, with no --node_rank: --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT "
            "--rdzv_id=$SLURM_JOB_ID")


def master(s: Script) -> tuple:
    """Where the ranks find rank 0: exported (or given on the launch line), and an address every node reaches."""
    wrong = rank0_mistakes(s) + shell.after_launch(s, ("MASTER_ADDR", "MASTER_PORT"))
    line = " ".join(c for _, c in s.commands if "torchrun" in c or "torch.distributed.run" in c)
    if launcher(s) == "torchrun" and ("--standalone" in line or "MASTER" not in line):
        wrong += values.torchrun_port(s)
        if (integer(s.get("nodes", "1")) or 1) > 1 and not rendezvous(s):
            wrong.append("torchrun gives its ranks the master address of its rendezvous, here its default "
                         "127.0.0.1 on every node (see launch)")
        return "MASTER_ADDR/PORT", not wrong, "\n".join(wrong) or "torchrun sets them for its ranks"
    msgs = [f"{name} is set but not exported: the ranks do not see it; export {name}=..." if name in s.assigned
            else f"no export {name}=...: the ranks must know where rank 0 waits; {name} is {hint}"
            for name, hint in (("MASTER_ADDR", 'the first node of the job: $(scontrol show hostnames '
                                               '"$SLURM_JOB_NODELIST" | head -n 1)'),
                               ("MASTER_PORT", "a port that no other job on the node uses, e.g. $(( 10000 + "
                                               "SLURM_JOB_ID % 20000 ))"))
            if name not in s.exports and launch_env(s, name) is None]
    port = launch_env(s, "MASTER_PORT")
    where = "MASTER_PORT on the launch line" if port is not None else f"line {s.exports.get('MASTER_PORT', (0,))[0]}"
    port = port if port is not None else s.exports.get("MASTER_PORT", (0, None))[1]
    msgs = wrong + msgs + (values.port_mistakes(s, port, where) if port is not None else []) + values.torchrun_port(s)
    note = f" ({values.port_note(s, port)})" if port is not None else ""
    addr = s.exports.get("MASTER_ADDR", (0, ""))[1] or ""
    where_ok = ("rank 0's node is one every node reaches" if not LOOPBACK.match(addr.strip("'\"")) else
                f"{addr} reaches rank 0 only on a one-node job; with several nodes: {FIRST_NODE}")
    return "MASTER_ADDR/PORT", not msgs, "\n".join(msgs) or f"both exported; {where_ok}{note}"


def threads(s: Script) -> tuple:
    """OMP_NUM_THREADS exported, against the CPUs a task gets (notebook 03: one thread per CPU Slurm gave the rank)."""
    if "OMP_NUM_THREADS" not in s.exports:
        return "OMP_NUM_THREADS", False, ("not exported: each rank's PyTorch starts one thread per core of the node, "
                                          "and the ranks fight for the cores; export "
                                          "OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK (torchrun: CPUs per task / ranks per "
                                          "node)")
    line, value = s.exports["OMP_NUM_THREADS"]
    late = shell.after_launch(s, ("OMP_NUM_THREADS",))
    if late:
        return "OMP_NUM_THREADS", False, late[0]
    if values.not_a_number(s, value):
        return "OMP_NUM_THREADS", False, (
            f"line {line}: OMP_NUM_THREADS={value} is text to bash, not a number: bash reads a name without $ (and "
            "works out arithmetic) only inside $(( )); OpenMP ignores a value it cannot read and starts a thread "
            "per core of the node in every rank; export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK")
    if "SLURM_CPUS_PER_TASK" in value and s.get("cpus-per-task") is None:
        return "OMP_NUM_THREADS", False, (
            f"line {line}: OMP_NUM_THREADS={value}, but the script asks no #SBATCH --cpus-per-task, and Slurm "
            "sets SLURM_CPUS_PER_TASK only when it is asked for (sbatch(1)), so OMP_NUM_THREADS is empty; "
            "ask --cpus-per-task=N")
    cpus = integer(s.get("cpus-per-task", "1")) or 1
    sharing = (torchrun_nproc(s) or 1) if launcher(s) == "torchrun" else 1
    ranks = f"{sharing} rank(s) sharing the task's" if sharing > 1 else "each rank's task has"
    n = values.threads(s, value, cpus, sharing)
    if values.NODE_CPUS.search(value) and ((tasks_per_node(s) or 1) > 1 or sharing > 1):
        return "OMP_NUM_THREADS", False, (
            f"line {line}: OMP_NUM_THREADS={value} counts the CPUs of every task of the job on the node, not the "
            f"{cpus} of one task: each rank starts that many threads and the ranks fight for the cores; export "
            "OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK" + (f" / {sharing}" if sharing > 1 else ""))
    if n is not None and (n < 1 or n * sharing > cpus):
        return "OMP_NUM_THREADS", False, (
            f"line {line}: OMP_NUM_THREADS={value} is {n} thread(s) per rank; {ranks} {cpus} CPU(s) "
            f"(--cpus-per-task={cpus}): " + ("no thread is not a setting OpenMP takes" if n < 1 else
                                             "more threads than CPUs, so they take turns on the cores")
            + "; one thread per CPU of the task: $SLURM_CPUS_PER_TASK" + (f" / {sharing}" if sharing > 1 else ""))
    told = (f"{n} thread(s) per rank, {ranks} {cpus} CPU(s)" if n is not None
            else "its value was not worked out (not looked at)")
    return "OMP_NUM_THREADS", True, f"exported (line {line}): {told}"


def lint(s: Script, site: Site, workdir) -> list[tuple]:
    """Every rule's (item, ok or None where not looked at, message), in the order a learner fixes them;
    ``workdir``: the folder the job is submitted from, where the training script must be."""
    return [directives(s), site_profile(s, site), launch(s), judge(s, workdir), ranks_and_gpus(s, site, workdir),
            master(s), threads(s)]
