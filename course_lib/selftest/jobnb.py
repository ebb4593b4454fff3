"""Items around the notebooks: a local-engine GPU job with the job template's ``nvidia-smi dmon`` block run beside
it (its log read back), and notebooks 00-02 through papermill on the solutions.
"""
import subprocess
import time

from course_lib import jobs
from course_lib.jobs.monitor import parse_dmon
from course_lib.runtime.launch import kill_group
from course_lib.runtime.proc import below, wait_gone
from course_lib.selftest import speed
from course_lib.selftest.runs import FAIL, PASS, Context, Outcome, child_env, python, run_command
from course_lib.selftest.train import DEVICE

JOB_NAME = "gpucheck"
MONITOR_S = 30     # of the item's deadline, for dmon's samples before and after the job and for its stop
# the job: the throughput worker's fp32 epoch repeated for 20 s, several of dmon's 5-second samples (the serial
# solution on digits keeps an H100 busy for well under a second per epoch: samples could all read 0 % SM)
JOB_ARGS = ["--variants", "fp32", "--min-seconds", "20"]
LEAST_S = MONITOR_S + 30   # the item's least deadline: the job's 20 s and its start, with the monitor's reserve
START, END = 'MONITOR_PIDS=""', "trap "     # the first line of the template's monitoring block, its last's start


def monitor_block(script: str) -> str:
    """The lines of ``script`` from ``MONITOR_PIDS=""`` to the trap that stops the monitors ("" if none)."""
    lines = script.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip() == START), None)
    if first is None:
        return ""
    last = next((i for i in range(first, len(lines)) if lines[i].lstrip().startswith(END)), None)
    return "" if last is None else "\n".join(lines[first:last + 1]) + "\n"


def summarize(rows: list[dict]) -> dict:
    """Figures of a dmon log: samples, peak SM use (%) and peak frame-buffer memory (MB)."""
    out = {"dmon_samples": len(rows)}
    for name, key in (("sm", "peak_sm_pct"), ("fb", "peak_fb_mb")):
        values = [r[name] for r in rows if r.get(name) is not None]
        if values:
            out[key] = max(values)
    return out


def _start_monitor(block: str, folder, job_id: str) -> subprocess.Popen:
    """The template's monitoring block in bash, as in a job script; it stops (trap) when ``stop`` appears."""
    script = f"{block}while [ ! -e stop ]; do sleep 0.5; done\n"
    env = child_env({"SLURM_JOB_NAME": JOB_NAME, "SLURM_JOB_ID": job_id})
    return subprocess.Popen(["bash", "-c", script], cwd=folder, env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def _stop_monitor(mon: subprocess.Popen, folder) -> bool:
    """Let the monitor end as a job script ends; True when its trap stopped dmon and top (nothing was left)."""
    started = list(below([mon.pid]).values())
    (folder / "stop").touch()
    try:
        mon.wait(15)
        return not wait_gone(started, 5)      # a killed monitor takes a moment to go (a zombie counts as gone)
    except subprocess.TimeoutExpired:
        return False
    finally:
        kill_group(mon)


def job_monitor(ctx: Context) -> Outcome:
    spec = jobs.JobSpec(name=JOB_NAME, script=str(speed.__file__),
                        args=JOB_ARGS, gpus_per_node=1, monitor=True, time="00:10:00")
    block = monitor_block(jobs.script(spec, engine_name="local"))
    if "nvidia-smi dmon" not in block:
        return Outcome(FAIL, "the job script of a GPU job with monitor=True has no `nvidia-smi dmon` block")
    job_id = f"{int(time.time())}"
    ctx.folder.mkdir(parents=True, exist_ok=True)
    mon = _start_monitor(block, ctx.folder, job_id)
    try:
        time.sleep(2)    # dmon's first sample before the training starts
        job = jobs.submit(spec, engine_name="local", runs=ctx.folder / "runs")
        job.wait(timeout=max(10.0, ctx.timeout - MONITOR_S), progress=False)
        if not job.done:
            job.cancel()
        time.sleep(6)    # one more sample after (dmon samples every 5 s)
    finally:
        stopped = _stop_monitor(mon, ctx.folder)
    if not job.ok:
        return Outcome(FAIL, job.summary(tail=8))
    log = ctx.folder / f"{JOB_NAME}-{job_id}.gpu.log"
    return judge_monitor(job.log(), log.read_text(errors="replace") if log.is_file() else None, stopped, job.id)


def judge_monitor(job_text: str, dmon_text: str | None, stopped: bool, job_id: str = "?") -> Outcome:
    """The job must have trained on cuda (its ``device=`` line) and dmon must have seen the SMs busy (peak SM
    use above 0 %): a job on the CPU beside an idle GPU, or a monitor that wrote nothing, is no PASS."""
    devices = [d for d, _ in DEVICE.findall(job_text)]
    if not devices or not all(d.startswith("cuda") for d in devices):
        return Outcome(FAIL, f"the job trained on {devices or 'no device line'}, not on cuda")
    rows = parse_dmon(dmon_text or "")
    if not rows:
        shown = "(no log written)" if dmon_text is None else (dmon_text[-600:] or "(empty)")
        return Outcome(FAIL, "no samples in the dmon log. If nvidia-smi runs, its output to a file may be "
                             "block-buffered and lost when the trap kills it (hypothesis: the template's "
                             f"`nvidia-smi dmon ... > FILE` would need `-f FILE` or line buffering):\n{shown}")
    figures = summarize(rows)
    if not figures.get("peak_sm_pct"):
        return Outcome(FAIL, f"dmon saw no SM use in {len(rows)} samples (peak SM {figures.get('peak_sm_pct')} %): "
                             "the GPU did not compute while the job ran", figures)
    if not stopped:
        return Outcome(FAIL, "the monitors were still running when the job script ended: the template's trap "
                             "did not stop them", figures)
    return Outcome(PASS, f"job {job_id} COMPLETED on the local engine on {devices[0]}; dmon: "
                         f"{figures['dmon_samples']} samples, peak SM {figures['peak_sm_pct']} %, peak memory "
                         f"{figures.get('peak_fb_mb')} MB", figures)


def notebook(stem: str):
    """The item: notebook ``stem`` through papermill on solutions/, QUICK (STRICT: a failing check cell fails it)."""
    def run(ctx: Context) -> Outcome:
        ran = run_command(python("-m", "course_lib", "notebooks", "--only", stem, "--out", ctx.folder, "--cell-timeout",
                                 str(int(ctx.timeout)), "--quick"), ctx.folder / "notebook.log", ctx.timeout + 30,
                          cwd=ctx.folder, env={"COURSE_QUICK": "1"})
        line = next((x for x in ran.text.splitlines() if x.startswith(stem)), "")
        if ran.ok:
            return Outcome(PASS, f"{' '.join(line.split())} (output: {ctx.folder.name}/{stem}.solutions.ipynb)")
        return Outcome(FAIL, ran.why())
    return run
