"""Why did this job fail or hang? Hints that name a cause, read from the job's log and script.

The causes are the ones the workshop warns about for jobs on more than one node: ``MASTER_ADDR`` left at
``localhost`` (each node's loopback is its own, so the ranks of node 2 look for rank 0 on node 2, find no one,
and wait until the time limit), and a torchrun rendezvous bound to ``127.0.0.1`` or ``--standalone`` (every
node's torchrun hosts a rendezvous of its own and waits for nodes that never join it).

    from course_lib.jobs.diagnose import hints
    hints(job)        # -> ["MASTER_ADDR=localhost on 2 nodes (node[1-2]): ..."], [] when nothing is known

From a shell, for a job's folder or its output file:  course diagnose jobs/runs/ddp-42
"""
import re
import sys
from pathlib import Path

# the line every course job script prints before it launches anything (templates/sbatch.sh.j2)
HEADER = re.compile(r"^job (?P<id>\S+) on (?P<nodes>\S+): MASTER_ADDR=(?P<addr>\S*) MASTER_PORT=(?P<port>\d+)", re.M)
RDZV_LOOPBACK = re.compile(r"--rdzv[_-]endpoint[= ]\s*['\"]?(localhost|127\.[0-9.]+|\[?::1\]?)")
LOOPBACK = re.compile(r"^(localhost(\.localdomain)?|ip6-localhost|127(\.\d{1,3}){3}|::1|\[::1\]|0\.0\.0\.0)$", re.I)
EPOCH_LINE = re.compile(r"\bepoch=\d+ ")
STUCK = ("TIMEOUT", "CANCELLED", "DEADLINE")


def count_hosts(nodelist: str) -> int:
    """How many hosts a Slurm node list names: ``node[1-2]`` -> 2, ``a,b[1,3-5]`` -> 5 (no scontrol needed)."""
    total = 0
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", nodelist):
        ranges = re.search(r"\[([^\]]*)\]", part)
        if not ranges:
            total += 1
            continue
        for r in ranges.group(1).split(","):
            lo, _, hi = r.partition("-")
            total += int(hi) - int(lo) + 1 if hi else 1
    return total


def nodes_of(log: str) -> int:
    """The job's node count from its header line (the allocation's node list); 0 when the log has none."""
    m = HEADER.search(log)
    return count_hosts(m.group("nodes")) if m else 0


def diagnose(log: str, script: str = "", state: str = "", nodes: int | None = None) -> list[str]:
    """The hints for a job whose output is ``log`` (and whose script is ``script``); [] when none applies."""
    nodes = nodes or nodes_of(log)
    out = []
    m = HEADER.search(log)
    if nodes > 1 and m and LOOPBACK.match(m.group("addr")):
        out.append(f"MASTER_ADDR={m.group('addr')} on {nodes} nodes ({m.group('nodes')}): every node has a loopback "
                   "of its own, so the ranks on the other nodes look for rank 0 on their own node and wait (or fail) "
                   "until the time limit. Set MASTER_ADDR to the first node of the allocation: "
                   "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"
                   + (". torchrun's --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT is on the loopback too: each node's "
                      "agent hosts a rendezvous of its own and waits for nodes that never join it"
                      if re.search(r"--rdzv[_-]endpoint[= ]\$\{?MASTER_ADDR", script) else ""))
    rdzv = RDZV_LOOPBACK.search(script)
    if nodes > 1 and rdzv:
        out.append(f"the torchrun rendezvous is bound to {rdzv.group(1)} on {nodes} nodes: each node's torchrun "
                   "hosts a rendezvous of its own and waits for nodes that never join it. Use "
                   "--rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT with MASTER_ADDR the first node of the allocation")
    if nodes > 1 and re.search(r"torch(run|\.distributed\.run)\b[^\n]*--standalone", script):
        out.append(f"torchrun --standalone on {nodes} nodes: --standalone is a rendezvous on this node only "
                   "(127.0.0.1); every node trains alone. Use --nnodes=$SLURM_JOB_NUM_NODES and a c10d rendezvous "
                   "on the first node")
    if not out and state in STUCK and nodes > 1 and not EPOCH_LINE.search(log):
        out.append(f"{state} on {nodes} nodes before the first epoch line: a hypothesis to check first is that the "
                   "ranks never met (MASTER_ADDR, MASTER_PORT, the rendezvous endpoint, GLOO_SOCKET_IFNAME / "
                   "NCCL_SOCKET_IFNAME naming an interface every node has)")
    return out


def hints(job) -> list[str]:
    """The hints for a Job (its log, its script in the run folder, its state and node count)."""
    try:
        script = job.script_path.read_text(errors="replace")
    except OSError:
        script = ""
    return diagnose(job.log(), script, job.state, max(job.spec.nodes, nodes_of(job.log())))


def add_arguments(p) -> None:
    p.add_argument("run", type=Path, metavar="RUN",
                   help="the job's run folder (jobs/runs/NAME-ID) or its output file")
    p.add_argument("script", type=Path, nargs="?", metavar="SCRIPT",
                   help="the job's script (default: job.sbatch of the run folder)")


def run(args) -> int:
    """``course diagnose RUN [SCRIPT]``: print the hints; exit 1 if there are some."""
    path = args.run
    log_path = path / "output.log" if path.is_dir() else path
    script_path = args.script or (path / "job.sbatch" if path.is_dir() else None)
    try:
        log = log_path.read_text(errors="replace")
    except OSError as e:
        print(f"course diagnose: cannot read the job's output: {e}", file=sys.stderr)
        return 2
    script = script_path.read_text(errors="replace") if script_path and script_path.is_file() else ""
    found = diagnose(log, script, state="TIMEOUT" if "DUE TO TIME LIMIT" in log else "")
    print("\n".join(f"hint: {h}" for h in found) or "no known cause found in the log")
    return 1 if found else 0
