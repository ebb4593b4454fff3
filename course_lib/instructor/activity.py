"""The course's work counts as activity on a hub: a Jupyter server extension for the learners' servers.

A hub's idle culler (jupyterhub-idle-culler) stops a server whose ``last_activity``, as the hub records it, is older
than its timeout. The server reports that time itself: jupyterhub-singleuser posts ``web_app.last_activity()`` to
the hub every ``$JUPYTERHUB_ACTIVITY_INTERVAL`` seconds, and jupyter_server takes the latest of its API requests,
terminal I/O, kernel messages and every setting whose name ends in ``_last_activity``. A learner who waits on a
queued job, or on a check whose ranks print nothing for a while, makes none of those, and the server would look
idle. So this extension sets ``course_last_activity`` to now, every few seconds, while any of these holds:
- a kernel of this server is busy (a cell runs: a check, a job's ``wait()``, training);
- a job of the learner's workspace is queued or running (its run folder under ``jobs/runs``, asked afresh);
- a Slurm job of the learner other than this server's own is in the queue (a check on Slurm, a job from a shell);
- a ``course`` command runs under this server (``course check`` in a JupyterLab terminal).
Once none holds, the server's last activity stays where it was, and the culler's timeout runs from there.

It is on for the servers of the shared install (its ``etc/jupyter/jupyter_server_config.json``, written by
``course_lib.instructor.hub_server``) and does nothing outside a hub (no ``$JUPYTERHUB_ACTIVITY_URL``).
"""
from __future__ import annotations

import asyncio
import json
import os
from datetime import datetime, timezone
from pathlib import Path

import psutil

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


def queued_slurm_jobs(own_job: str | None) -> list[str]:
    """This user's jobs in Slurm's queue, less this server's own job (a server that runs as a Slurm job)."""
    from course_lib.runtime.reattach import scheduler_ids

    return [i for i in scheduler_ids() if i != own_job]


def course_commands(server_pid: int) -> list[str]:
    """``course`` commands running under this server (a check started in a terminal)."""
    found = []
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for p in children:
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if any(Path(part).name == "course" for part in cmd[:2]):
            found.append(" ".join(cmd[:4]))
    return found


def reasons(runs: Path, own_job: str | None, server_pid: int) -> list[str]:
    """What of the course runs now, outside the kernels (blocking: called off the server's event loop)."""
    return ([f"job {j}" for j in live_jobs(runs)] + [f"Slurm job {j}" for j in queued_slurm_jobs(own_job)]
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
