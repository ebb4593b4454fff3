"""Papermill's nbclient engine with a guard against a lost wake-up of the notebook client: ``engine_name=ENGINE``.

Why: in CI, about one in ten in-process papermill runs of notebooks 03 and 05 waited forever on a cell the kernel
had already run. What the stall dumps (tests/stall_dump.py) showed each time: the cell's reply sat in the client's
zmq shell socket, a receiver waited on it, the asyncio loop's epoll watched the socket's fd, but that fd (a zmq
mailbox, signalled only when the socket's state changes) held no signal, so the loop never woke. Twice, a second
thread that re-read the socket's EVENTS ended such a wait within seconds and the notebook finished normally. The
cause inside pyzmq or nbclient is not known. Still so after the runtime's redesign (issue 50, item 6): without the
guard, 2 of 3 runs of ``course run notebooks --only '00*' --quick`` waited on cell 16 (a reveal) with the kernel
idle and the reply in the shell socket until killed, while 57 runs of 03 and 05 passed; with it, 6 of 6 passed and
it handed over 2 missed wake-ups (cells 10 and 16).

So while a cell runs, every RECHECK_S seconds the guard re-reads EVENTS on the shell and iopub sockets from the
loop: pyzmq then hands a waiting message to its receiver (``_AsyncSocket.get`` schedules it). A message that
waited while the socket's fd held no signal is a wake-up the loop had missed: the guard says so on stderr (and in
``$COURSE_WAKEUP_LOG`` when set), so a run it saved is never silent. A kernel that really hangs is untouched: the
guard creates no message, and the cell's deadline stands.
"""
import asyncio
import os
import re
import sys
import time
from pathlib import Path

import zmq
from jupyter_core.utils import run_sync
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, papermill_engines
from papermill.log import logger

ENGINE = "course-guarded"
RECHECK_S = 2.0
CHANNELS = ("shell", "iopub")
_EVENTFD_COUNT = re.compile(r"eventfd-count:\s*(\d+)")


def _signalled(fd: int) -> bool | None:
    """Whether the socket's fd holds a signal the loop will wake for (None where /proc cannot tell)."""
    try:
        found = _EVENTFD_COUNT.search(Path(f"/proc/self/fdinfo/{fd}").read_text())
    except OSError:
        return None
    return None if found is None else found[1] != "0"


def _say(text: str) -> None:
    print(f"[papermill guard] {text}", file=sys.stderr, flush=True)
    log = os.environ.get("COURSE_WAKEUP_LOG")
    if log:
        try:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")
        except OSError as e:
            print(f"[papermill guard] not logged to {log}: {e}", file=sys.stderr, flush=True)


async def recheck(sockets: dict, where: str, every: float = RECHECK_S) -> None:
    """Until cancelled: every ``every`` seconds, re-read EVENTS on each zmq.asyncio socket of ``sockets`` (name:
    socket), which hands a waiting message to its receiver, and say when that message had no signal to wake for."""
    while True:
        await asyncio.sleep(every)
        for name, sock in sockets.items():
            if sock.closed:       # the kernel's channels closed under the cell: nbclient reports that
                return
            signalled, waiters = _signalled(sock.FD), len(sock._recv_futures)
            if sock.get(zmq.EVENTS) & zmq.POLLIN and waiters and signalled is False:
                _say(f"{where}: a message waited on the {name} channel for its receiver while the socket's fd "
                     "held no signal (a missed wake-up); handed over now")


class GuardedClient(PapermillNotebookClient):
    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        sockets = {name: getattr(self.kc, f"{name}_channel").socket for name in CHANNELS}
        source = self.nb.metadata.get("papermill", {}).get("input_path") or "notebook"
        guard = asyncio.ensure_future(recheck(sockets, f"{Path(source).name}, cell {cell_index}"))
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        finally:
            guard.cancel()

    execute_cell = run_sync(async_execute_cell)   # nbclient binds its own coroutine; papermill calls this one


class GuardedEngine(NBClientEngine):
    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None, stderr_file=None,
                                 start_timeout=60, execution_timeout=None, **kwargs):
        # NBClientEngine's own method, with the guarded client
        kwargs = {k: v for k, v in kwargs.items() if k not in ("input_path", "startup_timeout")}
        kwargs["timeout"] = execution_timeout or kwargs.get("timeout")
        return GuardedClient(nb_man, startup_timeout=start_timeout, kernel_name=kernel_name, log=logger,
                             log_output=log_output, stdout_file=stdout_file, stderr_file=stderr_file,
                             **kwargs).execute()


papermill_engines.register(ENGINE, GuardedEngine)
