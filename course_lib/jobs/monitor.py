"""What a job's monitoring wrote, read back: ``top -b`` frames, ``nvidia-smi dmon`` samples, ``seff``/``sacct``.

With ``monitor=True`` the job script (templates/sbatch.sh.j2) runs ``top -b -d 2 -u <you>`` into
``<name>-<id>.top.log`` and, where there is a GPU, ``nvidia-smi dmon -s um -d 5`` into ``<name>-<id>.gpu.log``;
the local engine writes the same ``top``-style frames for the job's own processes (course_lib.runtime.sampler).
Everything here reads text; nothing raises on a missing or odd log: an empty result, and ``why_no_*`` says why.
"""
import re
import shutil
from pathlib import Path

from course_lib.runtime import slurm

DMON_EVERY = 5     # seconds between dmon samples (the template's -d)
FRAME = re.compile(r"^top - (\d\d):(\d\d):(\d\d)\b")


def top_log(run_dir: Path) -> Path | None:
    return next(iter(sorted(Path(run_dir).glob("*.top.log"))), None)


def gpu_log(run_dir: Path) -> Path | None:
    return next(iter(sorted(Path(run_dir).glob("*.gpu.log"))), None)


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "."))   # some locales print 12,5
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------- top
def parse_top(text: str) -> list[dict]:
    """The frames of ``top -b`` output: [{"t": seconds since the first frame, "rows": [{"pid", "user",
    "cpu", "mem", "command"}]}]. The column header (``PID USER ... %CPU %MEM TIME+ COMMAND``) says where
    each field is, so a reduced set of columns (the local sampler's) reads the same."""
    frames: list[dict] = []
    columns: list[str] = []
    first = None
    for line in text.splitlines():
        m = FRAME.match(line)
        if m:
            clock = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))
            first = clock if first is None else first
            frames.append({"t": float((clock - first) % 86400), "rows": []})   # % 86400: past midnight
            columns = []
            continue
        words = line.split()
        if not frames or not words:
            continue
        if "PID" in words and "%CPU" in words:
            columns = words
        elif columns and words[0].isdigit():
            row = _top_row(columns, line)
            if row is not None:
                frames[-1]["rows"].append(row)
    return frames


def _top_row(columns: list[str], line: str) -> dict | None:
    # COMMAND is last and may hold spaces (top -c): split the rest only
    values = line.split(None, len(columns) - 1)
    if len(values) < len(columns):
        return None
    field = dict(zip(columns, values))
    cpu = _number(field["%CPU"])
    if cpu is None:
        return None
    return {"pid": int(field["PID"]), "user": field.get("USER", ""), "cpu": cpu,
            "mem": _number(field.get("%MEM", "")), "command": field.get("COMMAND", "")}


def cpu_series(frames: list[dict]) -> tuple[list[float], list[float]]:
    """(seconds, total %CPU of the frame's processes). top's %CPU is per core: 200 = two cores busy."""
    return [f["t"] for f in frames], [round(sum(r["cpu"] for r in f["rows"]), 1) for f in frames]


# ------------------------------------------------------------------------------------------- dmon
def parse_dmon(text: str, every: float = DMON_EVERY) -> list[dict]:
    """The samples of ``nvidia-smi dmon`` (column name -> number, None for ``-``), each with ``t``: seconds
    since the first sample. The ``# gpu sm mem ...`` header (repeated now and then) names the columns; with
    ``-o T`` a Time column comes first, else the n-th sample of a GPU is at n x ``every`` (dmon's -d)."""
    names: list[str] = []
    rows: list[dict] = []
    first = None
    seen: dict[float, int] = {}
    for line in text.splitlines():
        words = line.replace("#", " # ", 1).split() if line.lstrip().startswith("#") else line.split()
        if not words:
            continue
        if words[0] == "#":
            lowered = [w.lower() for w in words[1:]]
            if "gpu" in lowered and "sm" in lowered:
                names = lowered
            continue
        if not names or len(words) != len(names):
            continue             # an error line ("Failed to initialize NVML ..."), or a cut-off last line
        row = {n: (w if n in ("date", "time") else _number(w)) for n, w in zip(names, words)}
        if row.get("gpu") is None:
            continue
        if "time" in row and re.match(r"^\d\d:\d\d:\d\d$", row["time"]):
            h, m, s = map(int, row["time"].split(":"))
            first = h * 3600 + m * 60 + s if first is None else first
            row["t"] = float((h * 3600 + m * 60 + s - first) % 86400)
        else:
            row["t"] = float(seen.get(row["gpu"], 0) * every)
        seen[row["gpu"]] = seen.get(row["gpu"], 0) + 1
        rows.append(row)
    return rows


def gpu_series(rows: list[dict], column: str = "sm") -> dict[int, tuple[list[float], list[float]]]:
    """{gpu index: (seconds, values of ``column``)}; ``sm``: % of the sample period a kernel ran."""
    out: dict[int, tuple[list[float], list[float]]] = {}
    for r in rows:
        if r.get(column) is not None:
            ts, vs = out.setdefault(int(r["gpu"]), ([], []))
            ts.append(r["t"])
            vs.append(r[column])
    return out


# ------------------------------------------------------------------------------------------- seff / sacct
def slurm_seconds(text: str) -> float | None:
    """Slurm's durations: ``[D-]HH:MM:SS``, ``MM:SS.mmm`` (TotalCPU) -> seconds; None when unreadable."""
    m = re.match(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$", (text or "").strip())
    if not m:
        return None
    d, h, mi, s = m.groups()
    return int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi) * 60 + float(s)


def parse_seff(text: str) -> dict:
    """seff's report as {key: value}, plus ``elapsed_s`` and ``cpu_efficiency_pct`` where it gives them."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    m = re.match(r"^([\d.]+)%", out.get("CPU Efficiency", ""))
    if m:
        out["cpu_efficiency_pct"] = float(m.group(1))
    if slurm_seconds(out.get("Job Wall-clock time", "")) is not None:
        out["elapsed_s"] = slurm_seconds(out["Job Wall-clock time"])
    return out


SACCT_FIELDS = ("JobID", "State", "Elapsed", "TotalCPU", "NCPUS", "MaxRSS")


def parse_sacct(text: str, fields=SACCT_FIELDS) -> list[dict]:
    """``sacct -n -P -o <fields>`` rows as dicts (the job, then its steps: .batch, .0 ...)."""
    return [dict(zip(fields, line.split("|"))) for line in text.splitlines() if line.count("|") == len(fields) - 1]


def cpu_efficiency(rows: list[dict]) -> float | None:
    """seff's CPU efficiency from sacct's job row: TotalCPU / (NCPUS x Elapsed), in %."""
    job = next((r for r in rows if "." not in r.get("JobID", ".")), None)
    if job is None:
        return None
    cpu, wall = slurm_seconds(job.get("TotalCPU", "")), slurm_seconds(job.get("Elapsed", ""))
    ncpus = _number(job.get("NCPUS", "")) or 0
    return round(100 * cpu / (ncpus * wall), 1) if cpu is not None and wall and ncpus else None


def _run(cmd: list[str]) -> tuple[int, str]:
    r = slurm.command(cmd, timeout=30)
    return r.returncode, (r.stdout + r.stderr).strip()


def slurm_report(job_id: str) -> str:
    """What Slurm's accounting says about a finished job: seff where it is installed, else sacct's fields
    (or, with accounting storage off, ``sacct -c``: the job-completion log), each with a line on what it is."""
    lines = []
    if shutil.which("seff"):
        code, out = _run(["seff", job_id])
        lines += [f"$ seff {job_id}", out or "(no output)"]
        if code == 0:
            return "\n".join(lines)
    else:
        lines.append("seff is not installed here (it is a contrib script of Slurm); sacct's fields instead:")
    code, out = _run(["sacct", "-j", job_id, "-n", "-P", "-o", ",".join(SACCT_FIELDS)])
    rows = parse_sacct(out) if code == 0 else []
    if rows:
        lines += [f"$ sacct -j {job_id} -o {','.join(SACCT_FIELDS)}", *("  ".join(r.values()) for r in rows)]
        eff = cpu_efficiency(rows)
        if eff is not None:
            lines.append(f"CPU efficiency = TotalCPU / (NCPUS x Elapsed) = {eff}%")
        return "\n".join(lines)
    lines += [f"sacct: {out.splitlines()[-1] if out else 'no record'}",
              "the job-completion log (sacct -c) keeps no CPU time or memory; it says:"]
    code, out = _run(["sacct", "-c", "-j", job_id, "-o", "JobID,JobName,State,Start,End,NCPUS,NodeList"])
    return "\n".join([*lines, out or "(nothing)"])
