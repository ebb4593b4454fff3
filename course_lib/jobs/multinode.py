"""Jobs on more than one node: does this Slurm have the nodes, run one, and which node did each rank run on.

    from course_lib.jobs import multinode
    job = multinode.two_node_job(SCRIPT, ARGS)   # None, after saying why, where Slurm has fewer than 2 nodes
    multinode.ranks_by_node(job)                 # {"node1": [0], "node2": [1]}

The course's test cluster has two nodes with ``scripts/local-slurm/start.sh --nodes 2 DIR`` (network
namespaces; docs/two-node-slurm.md); a real cluster has them anyway.
"""
import os
import re

from course_lib import jobs
from course_lib.runtime import slurm
from course_lib.runtime.job import Job
from course_lib.runtime.progress import in_notebook

TASK_HOST = re.compile(r"^\s*(\d+): ([A-Za-z0-9][A-Za-z0-9.-]*)\s*$")
# the one-node test profile has gloo on loopback; its two-node twin names the nodes' interface
TWO_NODE_SITE = {"local": "local-2nodes"}


def slurm_nodes(engine_name: str | None = None) -> tuple[int, str]:
    """(how many nodes the Slurm here has, why that many); (0, why not) without Slurm."""
    name, why = jobs.engine(engine_name)
    if name != "slurm":
        return 0, f"no Slurm here ({why}): the local engine runs every node's ranks on this one machine"
    r = slurm.command(["sinfo", "-h", "-N", "-o", "%N"])
    names = sorted(set(r.stdout.split()))
    if r.returncode != 0:
        return 0, f"sinfo failed: {(r.stderr or r.stdout).strip()}"
    if len(names) < 2:
        return len(names), (f"this Slurm has one node ({', '.join(names) or 'none'}): a two-node job would wait "
                            "forever; the test cluster gets two with scripts/local-slurm/start.sh --nodes 2 DIR")
    return len(names), f"this Slurm has {len(names)} nodes: {', '.join(names)}"


def ranks_by_node(job: Job) -> dict[str, list[int]]:
    """{host: [global ranks]} from the job's ``srun --label hostname`` lines (task N: host)."""
    spec = job.spec
    per_task = spec.ntasks_per_node if spec.launcher == "torchrun" else 1   # torchrun: one task per node
    tasks = spec.nodes * (1 if spec.launcher == "torchrun" else spec.ntasks_per_node)
    seen: dict[int, str] = {}
    for line in job.log().splitlines():
        m = TASK_HOST.match(line)
        if m and int(m.group(1)) < tasks:
            seen.setdefault(int(m.group(1)), m.group(2))
        if len(seen) == tasks:
            break
    out: dict[str, list[int]] = {}
    for task, host in sorted(seen.items()):
        out.setdefault(host, []).extend(range(task * per_task, (task + 1) * per_task))
    return out


def two_node_job(script, args=(), ranks_per_node: int = 1, launcher: str = "srun", engine_name: str | None = None,
                 site: str | None = None, time: str = "00:10:00", wait: float = 600, **extra) -> Job | None:
    """Run ``script`` on two nodes and show where each rank ran; None (after printing why) without two nodes."""
    nodes, why = slurm_nodes(engine_name)
    print(why)
    if nodes < 2:
        return None
    name = site or os.environ.get("COURSE_SITE")
    profile = jobs.load_site(TWO_NODE_SITE.get(name, name))
    # sized like the notebooks' one-node jobs: one rank per GPU where the site has GPUs, else one core per rank
    spec = jobs.training_spec(f"two-nodes-{launcher}", script, args, ranks=ranks_per_node, launcher=launcher,
                              site=profile, nodes=2, time=time, **extra)
    job = jobs.submit(spec, "slurm", site=profile).wait(timeout=wait)
    if in_notebook():   # the terminal display prints the summary itself when the job ends
        print(job.summary())
    for host, ranks in ranks_by_node(job).items():
        print(f"  {host}: rank(s) {', '.join(map(str, ranks))}")
    return job
