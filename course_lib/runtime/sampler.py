"""The local engine's ``top`` (a Slurm job runs ``top -b -d 2 -u <you>``, templates/sbatch.sh.j2): the processes
below the runner, sampled with psutil into the same frames (course_lib.jobs.monitor.parse_top reads them); %CPU is
top's, CPU time over the time since the last frame, per core.
"""
import getpass
import os
import threading
import time
from pathlib import Path

import psutil

TOP_EVERY = 2      # seconds between top frames (the template's -d and the local sampler's interval)
HEADER = f"{'PID':>7} {'USER':<9} S {'%CPU':>6} {'%MEM':>5} {'TIME+':>9} COMMAND"


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):    # a uid with no name (some containers): top shows the number too
        return str(os.getuid())


class Sampler:
    """``with Sampler(path):`` a thread writes a frame every ``every`` seconds until the block ends."""

    def __init__(self, path: Path, every: float = TOP_EVERY):
        self.path, self.every = Path(path), every
        self.root = psutil.Process()      # this process (the runner): its descendants are the job
        self.user = _user()
        self._last: dict[int, tuple[float, float]] = {}   # pid -> (wall time, cpu seconds) at the last frame
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="job-top-sampler", daemon=True)

    def __enter__(self):
        self._file = open(self.path, "a", buffering=1)
        self._file.write(f"# local engine: the job's processes, sampled with psutil every {self.every:g} s "
                         "(the frames of top -b)\n")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=2 * self.every + 5)
        self.frame()          # a last frame: the end of the job is on the plot
        self._file.close()
        return False

    def _loop(self):
        while not self._stop.wait(self.every):
            try:
                self.frame()
            except (psutil.Error, OSError, ValueError):   # a process ended mid-frame: next frame
                continue

    def frame(self) -> None:
        now = time.time()
        rows = []
        try:
            procs = self.root.children(recursive=True)
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                cpu_s = sum(p.cpu_times()[:2])   # user + system
                since, before = self._last.get(p.pid, (p.create_time(), 0.0))
                cpu = 100 * (cpu_s - before) / max(now - since, 1e-3)
                self._last[p.pid] = (now, cpu_s)
                with p.oneshot():
                    name, status, mem = p.name(), p.status(), p.memory_percent()
                rows.append(f"{p.pid:>7} {self.user[:8]:<9} {status[:1].upper()} {cpu:>6.1f} {mem:>5.1f} "
                            f"{int(cpu_s // 60)}:{cpu_s % 60:05.2f} {name}")
            except psutil.Error:
                continue      # it ended between the listing and the read
        stamp = time.strftime("%H:%M:%S", time.localtime(now))
        self._file.write("\n".join([f"top - {stamp} local engine sampler", "", HEADER, *rows]) + "\n\n")
