"""torchrun's agent in a warm launch: ``python -m course_lib.runtime.warm_agent TORCHRUN_ARGS``, forked by the warm
server (torch imported), so that each rank is the agent's child, as under torchrun, and still costs only a fork.

While this process has one thread, it forks the processes its ranks will be, one per worker torchrun may start
(nproc_per_node x (max_restarts + 1)), each waiting at the top of this main thread. Then torchrun's own ``main`` runs
here, in the main thread as ``torchrun`` runs it, and a thread hands each worker's request
(``course_lib.runtime.warm_rank``) to a waiting child, which runs the script and leaves through the interpreter's own
exit (``course_lib.runtime.forkserver``). A fork from inside torchrun would copy one thread of several (its store's,
its log tailers'), locks held by the others included. A worker that finds no child waiting starts cold.
"""
import contextlib
import json
import os
import socket
import sys
import threading

from torch.distributed import run as torchrun

from course_lib.runtime import forkserver
from course_lib.runtime.warm import SOCKET_PATH_MAX
from course_lib.runtime.warm_rank import SOCKET_VAR

MAX_WAITING = 16   # children forked ahead at most (a --max-restarts of hundreds would fork hundreds)


def main(argv: list[str]):
    """Run torchrun (its exit is this process's); in a child forked ahead, return what ``forkserver.run()`` needs."""
    args = torchrun.parse_args(argv)
    worker = argv.index("course_lib.runtime.warm_rank")   # ps and top show the command a cold launch runs
    forkserver.title(["-m", "torch.distributed.run", *argv[:worker - 1], *argv[worker + 1:]])
    server = os.environ.pop(SOCKET_VAR, "")
    path = os.path.join(os.path.dirname(server), f"a{os.getpid()}")   # in the server's private folder
    waiting: list = []
    if not server or len(os.fsencode(path)) > SOCKET_PATH_MAX or not forkserver.one_thread():
        torchrun.main(argv)   # no socket: every worker starts cold
        return None
    for _ in range(min(MAX_WAITING, _workers(args))):
        rank = _fork_waiting(waiting)
        if rank is not None:
            return rank
    listener = forkserver.listen(path)
    os.environ[SOCKET_VAR] = path   # torchrun starts its workers with this process's environment
    end_r, end_w = os.pipe()
    hand = threading.Thread(target=forkserver.serve_forks, args=(listener, end_r, _hand_over(waiting)), daemon=True)
    hand.start()
    try:
        torchrun.main(argv)
    finally:
        os.close(end_w)   # the thread stops what still runs, reaps it and ends
        hand.join()
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        for pid, sock in waiting:   # not needed: EOF ends them
            sock.close()
            os.waitpid(pid, 0)
    return None


def _workers(args) -> int:
    try:
        return torchrun.determine_local_world_size(args.nproc_per_node) * (args.max_restarts + 1)
    except ValueError:
        return 0


def _fork_waiting(waiting: list):
    """Fork a child that waits for its request: None here, and in the child its request (after which it is the
    rank) or, at EOF, its end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid:
        theirs.close()
        waiting.append((pid, ours))
        return None
    for _, sock in waiting:
        sock.close()
    ours.close()
    msg, fds, _, _ = socket.recv_fds(theirs, forkserver.MAX_MSG, 2)
    if not msg:
        os._exit(0)   # not needed; it ran nothing of anyone's
    return json.loads(msg), fds, theirs.detach()   # closed once it leads its own session (forkserver.run)


def _hand_over(waiting: list):
    """The start for ``forkserver.serve_forks``: the request goes to the first child waiting (IndexError when none
    is left: the worker starts cold)."""
    def start(req, fds, inherited):
        pid, sock = waiting.pop(0)
        with sock:
            socket.send_fds(sock, [json.dumps(req).encode()], fds)
            sock.recv(1)   # EOF once the child leads its own session: the worker may signal its group now
        return pid, None
    return start


if __name__ == "__main__":
    rank = main(sys.argv[1:])
    if rank is not None:
        forkserver.run(rank)
