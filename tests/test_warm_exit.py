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


def test_a_rank_that_aborts_at_exit_fails_the_ddp_checks_clean_exit(tmp_path):
    # ranks forked warm left by os._exit after atexit (nothing torn down): this submission passed 6/6
    path = tmp_path / "mnist_classify_ddp.py"
    path.write_text((ROOT / "solutions" / "02_ddp" / "mnist_classify_ddp.py").read_text() + TEARDOWN_ABORT)
    report = ddp.check(str(path), cache=False)
    verdicts = {v.item: v.result for v in report.verdicts}
    assert verdicts["Step 6"] == "fail" and not report.passed, report.text()   # the clean exit is Step 6
