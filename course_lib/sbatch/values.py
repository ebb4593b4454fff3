"""What a port or a thread count in the script works out to, as bash's ``$(( ))`` computes it (notebook 03's rules:
MASTER_PORT from the job id, in 1024-65535 and below Linux's ephemeral range; OMP_NUM_THREADS no more than a
task's CPUs). A value the check cannot work out is said to be "not worked out", never judged.
"""
import ast
import operator
import re

from course_lib.sbatch.script import Script
from course_lib.sbatch.training import torchrun_options

EPHEMERAL = (32768, 60999)
JOB_ID = re.compile(r"\$?\{?SLURM_JOB_?ID\}?")
NODE_CPUS = re.compile(r"\bnproc\b|SLURM_CPUS_ON_NODE|SLURM_JOB_CPUS_PER_NODE")    # every CPU of the node, not a task's
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
       ast.Mod: operator.mod}
ONE_VALUE = re.compile(r"\d+|\$\{?[A-Za-z_]\w*\}?")       # what bash leaves a number outside $(( ))
# what bash gives as text, not a number: bare names or operators outside $(( )) (10000+SLURM_JOB_ID%20000)
BARE_TEXT = re.compile(r"[A-Za-z_+\-*/%]")
# job ids to try a formula with: small and large, across the moduli people write
JOB_IDS = list(range(0, 70000, 7)) + [10 ** 6 + i for i in range(0, 70000, 13)] + [2 ** 31 - 1]


def word(value: str) -> str:
    """``value`` as bash's one word: up to its closing quote, or up to a `` #`` comment."""
    text = value.strip()
    if text[:1] in ("'", '"') and text.find(text[0], 1) > 0:
        return text[:text.find(text[0], 1) + 1]
    return re.split(r"\s+#", text)[0]


def expression(s: Script, value: str, depth: int = 3, arithmetic: bool = False) -> str | None:
    """``value`` as an arithmetic expression in the script's own variables (``$(( 10000 + SLURM_JOB_ID % 20000 ))``
    -> ``10000 + SLURM_JOB_ID % 20000``); None where it is a command or text. Outside ``$(( ))`` bash computes
    nothing: only a number or one ``$NAME`` is a number there (``arithmetic``: the value is read inside one)."""
    text = word(value).strip("\"'")
    m = re.fullmatch(r"\$\(\((.*)\)\)", text, re.S) or re.fullmatch(r"\$\[(.*)\]", text, re.S)
    text = m.group(1) if m else text
    if "$(" in text or "`" in text or not (m or arithmetic or ONE_VALUE.fullmatch(text)):
        return None
    text = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", r"\1", text)
    for name in set(re.findall(r"[A-Za-z_]\w*", text)) if depth else ():
        if name in s.values and not name.startswith("SLURM_"):
            inner = expression(s, s.values[name][1], depth - 1, arithmetic=bool(m) or arithmetic)
            if inner is None:
                return None
            text = re.sub(rf"\b{name}\b", f"({inner})", text)
    text = " ".join(text.replace("/", "//").split())
    return text if re.fullmatch(r"[\w\s+\-*/%()]*", text) and text else None


def evaluate(expr: str, names: dict) -> int | None:
    """``expr`` with ``names`` (integer arithmetic as bash's); None where a name is unknown or it is not arithmetic."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None

    def go(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](go(node.left), go(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -go(node.operand)
        raise KeyError(type(node).__name__)
    try:
        return go(tree)
    except (KeyError, ZeroDivisionError, TypeError):
        return None


def port_mistakes(s: Script, value: str, where: str) -> list[str]:
    """What is wrong with ``value`` as MASTER_PORT (``where``: how the script gives it); [] where it is right
    or cannot be worked out (then ``port_note`` says so)."""
    if not_a_number(s, value):
        return [f"{where}: MASTER_PORT={value} is text to bash, not a port: bash works out arithmetic, and reads a "
                "name without $, only inside $(( )), so rank 0 cannot listen on it and every rank stops; export "
                "MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 20000 ))"]
    expr = expression(s, value)
    fixed = expr is not None and evaluate(expr, {}) is not None
    if fixed or (expr is None and not JOB_ID.search(value)) or (expr and "SLURM_JOB" not in expr):
        return [f"{where}: MASTER_PORT={value} is not derived from the job id: a second job on the same node (yours "
                "or another user's) picks the same port, and its rank 0 fails with 'address already in use'; "
                "export MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 20000 ))"]
    ports = port_range(expr) if expr else None
    if ports is None:
        return []
    low, high = ports
    if low < 1024 or high > 65535:
        return [f"{where}: MASTER_PORT={value} can be {low if low < 1024 else high} for some job ids, not a port a "
                "user's process can listen on (1024-65535): keep it in range, e.g. 10000 + SLURM_JOB_ID % 20000"]
    if high >= EPHEMERAL[0] and low <= EPHEMERAL[1]:
        return [f"{where}: MASTER_PORT={value} reaches {max(low, EPHEMERAL[0])}-{min(high, EPHEMERAL[1])}, inside "
                f"Linux's ephemeral range {EPHEMERAL[0]}-{EPHEMERAL[1]} (the local ports of outgoing connections): on "
                "a busy node another connection may hold it ('address already in use'); stay below 32768, e.g. "
                "10000 + SLURM_JOB_ID % 20000"]
    return []


def torchrun_port(s: Script) -> list[str]:
    """A fixed port in torchrun's --rdzv_endpoint or --master_port (two jobs on a node collide)."""
    options = torchrun_options(s)
    port = options.get("master_port") or (options.get("rdzv_endpoint", "").rpartition(":")[2] or None)
    if not port or "MASTER_PORT" in port:
        return []
    return port_mistakes(s, port, "torchrun's rendezvous port")


def port_range(expr: str) -> tuple[int, int] | None:
    """(lowest, highest) of ``expr`` over many job ids; None where it uses other names."""
    got = [evaluate(expr, {"SLURM_JOB_ID": j, "SLURM_JOBID": j}) for j in JOB_IDS]
    return None if None in got else (min(got), max(got))


def port_note(s: Script, value: str) -> str:
    """What the check worked out about a port it did not fail."""
    expr = expression(s, value)
    ports = port_range(expr) if expr else None
    if ports is None:
        return f"MASTER_PORT={value} uses the job id; its range was not worked out (not looked at)"
    return f"MASTER_PORT from the job id, {ports[0]}-{ports[1]}"


def threads(s: Script, value: str, cpus: int, sharing: int) -> int | None:
    """The threads each rank gets, None where not worked out (a node's count: NODE_CPUS), with ``cpus`` per task and
    ``sharing`` ranks in a task (torchrun's ranks share its one task)."""
    expr = None if NODE_CPUS.search(value) else expression(s, value)
    return None if expr is None else evaluate(expr, {"SLURM_CPUS_PER_TASK": cpus, "SLURM_NTASKS_PER_NODE": sharing})


def not_a_number(s: Script, value: str, depth: int = 3) -> bool:
    """True where bash gives ``value`` as text that is not a number: a name without ``$`` or arithmetic outside
    ``$(( ))`` (``SLURM_CPUS_PER_TASK``, ``10000+SLURM_JOB_ID%20000``), also through the script's own variable
    (``$X``); a command's output, a variable of the job or a ``${X:-default}`` is not judged."""
    text = word(value)
    if text.startswith("'"):                  # single quotes: bash expands nothing inside
        return not text.strip("'").isdigit()
    text = text.strip('"')
    if re.fullmatch(r"\$\(\(.*\)\)|\$\[.*\]", text, re.S) or "$(" in text or "`" in text or "${" in text \
            or re.fullmatch(r"-?\d+", text):
        return False
    ref = re.fullmatch(r"\$([A-Za-z_]\w*)", text)
    if ref:
        name = ref.group(1)
        return depth > 0 and name in s.values and not_a_number(s, s.values[name][1], depth - 1)
    return bool(BARE_TEXT.search(re.sub(r"\$[A-Za-z_]\w*", "0", text)))
