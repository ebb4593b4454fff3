"""torchrun's worker in a warm launch: ``python -m course_lib.runtime.warm_rank ARGS`` has torchrun's agent
(``course_lib.runtime.warm_agent``) start the rank ``python ARGS``, the agent's child, with this process's environment,
cwd and output (the request a warm server serves: ``course_lib.runtime.warm``), passes on every signal torchrun
sends it to the rank's group, and exits as the rank did (code or signal), so torchrun's restarts, failure summary and
shutdown see the rank as their own worker. It imports neither torch nor the rest of
course_lib (it starts in tens of milliseconds); with no server it becomes the cold rank (exec ``python -u ARGS``).
"""
import contextlib
import json
import os
import signal
import socket
import sys

SOCKET_VAR = "COURSE_WARM_SOCKET"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    path = env.pop(SOCKET_VAR, "")
    env["PYTHONUNBUFFERED"] = "1"     # torchrun starts its workers as ``python -u``
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()], [1, 2])
        pid = json.loads(conn.recv(4096) or b"{}")["pid"]
    except (OSError, ValueError, KeyError):
        conn.close()
        os.environ.pop(SOCKET_VAR, None)
        os.execv(sys.executable, [sys.executable, "-u", *argv])   # no server: the cold rank, as torchrun does

    def forward(sig, _frame):
        with contextlib.suppress(OSError):
            os.killpg(pid, sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    msg = conn.recv(4096)    # the rank's exit code, once the server has reaped it
    code = json.loads(msg)["code"] if msg else -signal.SIGKILL
    if code < 0:             # the rank died of a signal: so does this process, for torchrun to report
        if -code != signal.SIGKILL:   # whose handler cannot be set (EINVAL), nor needs resetting
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
