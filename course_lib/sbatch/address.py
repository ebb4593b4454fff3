"""Where the ranks look for rank 0: MASTER_ADDR (srun) or torchrun's rendezvous endpoint, read from the script.

Wrong on a cluster though one node hides it: a loopback address, the node list instead of one host, the login node
($SLURM_SUBMIT_HOST) or a fixed host. Right: the first line of ``scontrol show hostnames`` (or an array's ``[0]``),
or ``$(hostname)`` in the batch script, which runs on the job's first node (sbatch(1)), where rank 0 starts.
"""
import re

from course_lib.jobs.diagnose import LOOPBACK
from course_lib.sbatch.script import Script, integer
from course_lib.sbatch.shell import single_quoted
from course_lib.sbatch.training import torchrun_options

NODELIST = re.compile(r"\$\{?SLURM_(?:JOB_)?NODELIST\b")
EXPANDED = re.compile(r"scontrol\s+show\s+hostnames?\b|\bhostlist\b|\bnodeset\s+-e")
FIRST = re.compile(r"\bhead\s+(?:-n\s*\+?1|-1)\b|\bsed\s+(?:-n\s+)?['\"]?1[pq]|NR\s*==\s*1|FIRST_OF\(|\|\s*head\s*\)")
LAST = re.compile(r"\btail\s+(?:-n\s*)?-?1\b|\bsed\s+(?:-n\s+)?['\"]?\$p")     # the last name
THIS_NODE = re.compile(r"\bhostname\b|\$\{?(?:HOSTNAME|SLURMD_NODENAME|SLURM_TOPOLOGY_ADDR)\b")
REFERENCE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(\[0\])?(?::-[^}]*)?\}?")
FIRST_NODE = 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'


def node_span(s: Script) -> tuple[int, str]:
    """The most nodes Slurm may give the job, and the directive that says so."""
    value = s.get("nodes")
    if value:
        most = max((integer(n) or 0 for n in re.split(r"[-,:]", value)), default=0)
        if most:
            return most, f"--nodes={value}"
    ntasks, per_node = integer(s.get("ntasks")), integer(s.get("ntasks-per-node"))
    if ntasks and per_node:
        return -(-ntasks // per_node), f"--ntasks={ntasks} at --ntasks-per-node={per_node}"
    if ntasks and ntasks > 1:
        return ntasks, (f"--ntasks={ntasks} and no --nodes (sbatch(1): Slurm then allocates as many nodes as the "
                        "tasks need, so it may spread them)")
    return 1, "one node"


def resolve(s: Script, value: str, depth: int = 3) -> str:
    """``value`` with the script's own variables replaced by what they were set to (``$HEAD`` where
    ``HEAD=$(scontrol ...)``); ``${NODES[0]}`` becomes ``FIRST_OF(...)``."""
    if depth == 0:
        return value

    def sub(m):
        name, first = m.group(1), m.group(2)
        if name not in s.values:
            return m.group(0)
        inner = resolve(s, s.values[name][1], depth - 1)
        return f"FIRST_OF({inner})" if first else f"({inner})"
    return REFERENCE.sub(sub, value)


def mistakes(s: Script, value: str, what: str, fix: str = FIRST_NODE) -> list[str]:
    """What is wrong with ``value`` as the address of rank 0 (``what``: how the script gives it; ``fix``: the
    right line)."""
    text = resolve(s, value.strip())
    bare = text.strip("\"'() ")
    nodes, why = node_span(s)
    default = re.fullmatch(r"\$\{\w+:-([^}]*)\}", bare)            # ${MASTER_ADDR:-localhost}
    if LOOPBACK.match(default.group(1) if default else bare):
        if nodes > 1:
            return [f"{what} is a loopback address, and the job has {why}: every node has a loopback of its own, "
                    "so the ranks on the other nodes look for rank 0 on their own node and wait until the time "
                    f"limit (one node hides it). Use the job's first node: {fix}"]
        return []
    if NODELIST.search(text) and not EXPANDED.search(text):
        return [f"{what}: the job's node list ($SLURM_JOB_NODELIST) is in Slurm's compressed form (node[1-2] on "
                "two nodes), not a host name; it only looks right while the job has one node. Take the first host "
                f"of the list: {fix}"]
    if EXPANDED.search(text) and LAST.search(text) and not FIRST.search(text):
        return [f"{what}: tail -n 1 keeps the last name that scontrol show hostnames prints, the job's last node; "
                f"rank 0 runs on the first node, so on two or more nodes the ranks look for it where it is not; "
                f"keep the first: ... | head -n 1 ({fix})"]
    if EXPANDED.search(text) and not FIRST.search(text) and not THIS_NODE.search(text):
        return [f"{what}: scontrol show hostnames prints every node of the job, one per line, so on two nodes this "
                f"is two names, not a host; keep the first: ... | head -n 1 ({fix})"]
    if "SLURM_SUBMIT_HOST" in text:
        return [f"{what}: $SLURM_SUBMIT_HOST is the login node the job was submitted from, where no rank runs; "
                f"use the job's first node: {fix}"]
    if bare and not re.search(r"[$`]|SUBST", text) and bare not in (s.get("nodelist") or ""):
        return [f"{what} is a fixed host, but Slurm chooses the job's nodes when it starts the job, so rank 0 is "
                f"rarely there; use the job's first node: {fix}"]
    return []


def launch_env(s: Script, name: str) -> str | None:
    """``name`` given on a launch command itself (``MASTER_ADDR=x srun ...``)."""
    for c in s.simple:
        if name in c.env and {"srun", "torchrun", "python", "python3"} & {w.rsplit("/", 1)[-1] for w in c.words}:
            return c.env[name]
    return None


def rank0_mistakes(s: Script) -> list[str]:
    """Every mistake in where the ranks look for rank 0 (MASTER_ADDR, torchrun's endpoint)."""
    given, (line, value) = launch_env(s, "MASTER_ADDR"), s.exports.get("MASTER_ADDR", (0, None))
    msgs = (mistakes(s, given, f"MASTER_ADDR={given} (on the launch line)") if given is not None else
            single_quoted(s, "MASTER_ADDR", FIRST_NODE) or mistakes(s, value, f"line {line}: MASTER_ADDR={value}")
            if value is not None else [])
    options = torchrun_options(s)
    for key in ("rdzv_endpoint", "master_addr"):
        if options.get(key):
            host = options[key].rsplit(":", 1)[0] if key == "rdzv_endpoint" else options[key]
            if "MASTER_ADDR" not in host:       # $MASTER_ADDR:$MASTER_PORT is judged above
                fix = (f"{FIRST_NODE}, then torchrun --{key.replace('_', '-')}=$MASTER_ADDR"
                       + (":$MASTER_PORT" if key == "rdzv_endpoint" else ""))
                msgs += [m + (" (torch's c10d rendezvous even treats a loopback endpoint as this machine, so the "
                              "torchrun of every node hosts a rendezvous of its own)" if "loopback" in m else "")
                         for m in mistakes(s, host, f"torchrun --{key}={options[key]}", fix)]
    return msgs
