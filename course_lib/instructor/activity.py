"""The course's work counts as activity on a hub: a Jupyter server extension for the learners' servers.

A hub's idle culler stops a server whose last activity is older than its timeout, and a learner who waits on a
queued job or a quiet check makes no activity jupyter_server counts (docs/jupyterhub.md, the idle culler). So while
a kernel is busy, a job of the workspace is queued or running, a Slurm job of the learner's other than this
server's own is in the queue, or a ``course`` command runs under this server, this extension sets
``course_last_activity`` (jupyter_server takes the latest of the settings named ``*_last_activity``) to now. It
does nothing outside a hub (no ``$JUPYTERHUB_ACTIVITY_URL``).
"""
import asyncio
import json
import os
from datetime import datetime, timezone
from pathlib import Path

SETTING = "course_last_activity"


def _jupyter_server_extension_points():
    return [{"module": "course_lib.instructor.activity"}]


def poll_seconds() -> float:
    """How often to look: twice per report to the hub, at most every 30 s."""
    interval = float(os.environ.get("JUPYTERHUB_ACTIVITY_INTERVAL") or 300)
    return max(1.0, min(30.0, interval / 2))


def busy_kernels(kernel_manager) -> list[str]:
    """The ids of this server's kernels that run a cell now (jupyter_server follows each kernel's status)."""
    return [kid for kid in kernel_manager.list_kernel_ids()
            if getattr(kernel_manager.get_kernel(kid), "execution_state", "") == "busy"]


def live_jobs(runs: Path) -> list[str]:
    """The jobs of the run folders in ``runs`` that are queued or running now (an ended job's job.json says so,
    and is not asked again)."""
    from course_lib.runtime.job import INFO_NAME, TERMINAL
    from course_lib.runtime.reattach import from_folder

    live = []
    for info in runs.glob(f"*/{INFO_NAME}"):
        try:
            if json.loads(info.read_text()).get("state") in TERMINAL:
                continue
            job = from_folder(info.parent)
            if job.refresh() not in TERMINAL:
                live.append(job.id)
        except (OSError, ValueError, LookupError, TypeError):
            continue   # a folder being written, or from an older course: not a live job of this learner
    return live


def course_commands(server_pid: int) -> list[str]:
    """``course`` commands running under this server (a check started in a terminal)."""
    from course_lib.runtime import proc

    cmds = [p.info["cmdline"] or [] for p in proc.below({server_pid}, proc.live(("ppid", "cmdline"))).values()]
    return [" ".join(cmd[:4]) for cmd in cmds if any(Path(part).name == "course" for part in cmd[:2])]


def reasons(runs: Path, own_job: str | None, server_pid: int) -> list[str]:
    """What of the course runs now, outside the kernels (blocking: called off the server's event loop): live jobs,
    this user's Slurm jobs less this server's own (a server that runs as a Slurm job), course commands."""
    from course_lib.runtime.reattach import scheduler_ids

    return ([f"job {j}" for j in live_jobs(runs)] + [f"Slurm job {j}" for j in scheduler_ids() if j != own_job]
            + course_commands(server_pid))


class Watcher:
    def __init__(self, serverapp):
        self.app = serverapp
        self.runs = Path(os.environ.get("COURSE_RUNS_DIR") or Path(serverapp.root_dir) / "jobs" / "runs")
        self.own_job = os.environ.get("SLURM_JOB_ID")
        self.said: list[str] = []
        serverapp.web_app.settings[SETTING] = serverapp.web_app.settings["started"]

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(poll_seconds())
            try:
                now = [f"kernel {k} busy" for k in busy_kernels(self.app.kernel_manager)]
                now += await loop.run_in_executor(None, reasons, self.runs, self.own_job, os.getpid())
            except Exception as e:   # a broken look must not stop the server; the next one may work
                self.app.log.warning("course activity: could not look (%s)", e)
                continue
            if now:
                self.app.web_app.settings[SETTING] = datetime.now(timezone.utc)
            if now != self.said:
                self.app.log.info("course activity: %s", "; ".join(now) if now else "nothing of the course runs")
                self.said = now


def _load_jupyter_server_extension(serverapp) -> None:
    if not os.environ.get("JUPYTERHUB_ACTIVITY_URL"):
        return   # not a hub's server: nobody culls it
    watcher = Watcher(serverapp)
    serverapp.io_loop.add_callback(watcher.run)   # the loop runs once the server has started
    serverapp.log.info("course activity: a busy kernel, a live job or a course command counts as activity "
                       "(looked at every %.0f s)", poll_seconds())
