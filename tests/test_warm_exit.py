"""A learner's rank leaves under ``course check`` as under ``python script.py``: its exit included (a module of its
own: test_warm's module-wide fork server would serve the check's launches instead of the check's own)."""
import pytest
from conftest import ROOT

from course_lib.ddp import check as ddp

pytestmark = pytest.mark.slow

TEARDOWN_ABORT = """
import os
class Last:
    def __del__(self):   # in the interpreter's teardown, as gloo's exit abort
        os.write(2, b"terminate called at teardown\\n")
        os.abort()
last = Last()
"""


ATEXIT_EXIT = """
import atexit, os
atexit.register(lambda: print("atexit: log closed, leaving with 3", flush=True) or os._exit(3))
"""


THREAD_LEFT = """
import threading, time
threading.Thread(target=lambda: (print("uploader thread still running", flush=True), time.sleep(3600))).start()
"""


def _step6(tmp_path, tail: str, **kw):
    path = tmp_path / "mnist_classify_ddp.py"
    path.write_text((ROOT / "solutions" / "02_ddp" / "mnist_classify_ddp.py").read_text() + tail)
    report = ddp.check(str(path), cache=False, **kw)
    verdicts = {v.item: v for v in report.verdicts}
    assert [i for i, v in verdicts.items() if v.result != "pass"] == ["Step 6"], report.text()  # the clean exit
    return verdicts["Step 6"].message


def test_a_rank_that_aborts_at_exit_fails_the_ddp_checks_clean_exit(tmp_path):
    # ranks forked warm left by os._exit after atexit (nothing torn down): this submission passed 6/6; then it
    # failed with "the ranks did not form one group (see Step 1)", though Step 1 passed
    message = _step6(tmp_path, TEARDOWN_ABORT)
    assert "rank 0 finished the script, but then its process was killed by SIGABRT" in message, message
    assert "terminate called at teardown" in message and "form one group" not in message, message


def test_an_atexit_handler_runs_and_its_exit_code_and_print_show(tmp_path):
    message = _step6(tmp_path, ATEXIT_EXIT)
    assert "finished the script, but then its process exited with code 3" in message, message
    assert "atexit: log closed, leaving with 3" in message, message   # what the handler printed, as python shows it


def test_a_non_daemon_thread_left_running_keeps_the_rank_from_exiting_as_python_does(tmp_path):
    # python joins non-daemon threads before it exits: the rank finishes the script and never ends (Step 6 said
    # "works under no launcher; under srun:" with no reason at all). A short deadline: the check waits it out.
    message = _step6(tmp_path, THREAD_LEFT, timeout=40)
    assert "finished the script, but its process had not exited when the launch's deadline" in message
    assert "non-daemon thread" in message and "uploader thread still running" in message, message
