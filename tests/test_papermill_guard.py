"""The papermill guard (course_lib/instructor/papermill_guard.py) against a lost wake-up of a notebook client,
on real zmq sockets: a reply reaches the client's socket while its receiver waits, and the signal the asyncio loop
would wake for is taken first (by a read of EVENTS on the plain socket, as the stall dumps found it: message
waiting, receiver waiting, fd watched, no signal). Without the guard the receiver waits past its deadline; with
it, the reply arrives and the guard says it handed over a missed wake-up. The notebook tests run every in-process
papermill execution through the guarded engine (engine_name=ENGINE)."""
import asyncio
import time

import papermill
import pytest
import zmq
import zmq.asyncio
from papermill.exceptions import PapermillException

from course_lib.instructor import papermill_guard


async def _reply_after_a_lost_wakeup(guarded: bool, wait_s: float):
    server = zmq.Context.instance().socket(zmq.ROUTER)
    client = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    try:
        client.connect(f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}")
        await client.send(b"request")
        ident, _ = server.recv_multipart()
        reply = asyncio.ensure_future(client.recv())
        await asyncio.sleep(0.1)                  # the receiver waits
        server.send_multipart([ident, b"reply"])
        deadline = time.monotonic() + 5           # the loop held here while zmq delivers it
        while not client._shadow_sock.get(zmq.EVENTS) & zmq.POLLIN and time.monotonic() < deadline:
            time.sleep(0.01)                      # each read takes the fd's signal: the loop will not wake
        guard = asyncio.ensure_future(papermill_guard.recheck({"shell": client}, "test", every=0.2)) if guarded \
            else None
        try:
            return await asyncio.wait_for(reply, wait_s)
        except asyncio.TimeoutError:
            return None
        finally:
            if guard:
                guard.cancel()
    finally:
        client.close(linger=0)
        server.close(linger=0)


def test_a_lost_wakeup_stalls_the_receiver_and_the_guard_hands_the_reply_over(capsys, monkeypatch):
    monkeypatch.delenv("COURSE_WAKEUP_LOG", raising=False)    # the run's log keeps the notebooks' wake-ups only
    assert asyncio.run(_reply_after_a_lost_wakeup(guarded=False, wait_s=0.6)) is None, \
        "the reply arrived without the guard: the test no longer makes a lost wake-up"
    assert asyncio.run(_reply_after_a_lost_wakeup(guarded=True, wait_s=5)) == b"reply"
    assert "missed wake-up" in capsys.readouterr().err


def test_papermill_knows_the_guarded_engine():
    assert papermill.engines.papermill_engines.get_engine(papermill_guard.ENGINE) is papermill_guard.GuardedEngine
    with pytest.raises(PapermillException):   # a typo is papermill's error, not a silent fallback to the plain engine
        papermill.engines.papermill_engines.get_engine(papermill_guard.ENGINE + "x")


@pytest.mark.slow   # starts a kernel (4 s): make test, not test-fast
def test_the_guarded_engine_watches_each_cell_by_notebook_and_cell(tmp_path, monkeypatch):
    # what a wake-up line names: the notebook papermill ran and the cell (CI's log then says where to look)
    import nbformat
    watched = []

    async def recording(sockets, where, every=papermill_guard.RECHECK_S):
        watched.append((where, sorted(sockets)))
        await asyncio.sleep(3600)

    monkeypatch.setattr(papermill_guard, "recheck", recording)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("x + 1")])
    nbformat.write(nb, tmp_path / "tiny.ipynb")
    papermill.execute_notebook(str(tmp_path / "tiny.ipynb"), str(tmp_path / "out.ipynb"), kernel_name="python3",
                               progress_bar=False, engine_name=papermill_guard.ENGINE)
    assert watched == [("tiny.ipynb, cell 0", ["iopub", "shell"]), ("tiny.ipynb, cell 1", ["iopub", "shell"])]
