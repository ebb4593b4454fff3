"""A pytest plugin for the nbval runs of tests/test_notebooks.py (``-p nbval_outputs``): the outputs of each
cell, as nbval received them from the kernel, are appended as one JSON line to the file named by
$NBVAL_OUTPUTS. The test then checks what the notebook showed without executing it a second time."""
import json
import os


def pytest_runtest_teardown(item):
    outputs = getattr(item, "test_outputs", None)
    path = os.environ.get("NBVAL_OUTPUTS")
    if path and outputs is not None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"cell": item.name, "outputs": outputs}) + "\n")
