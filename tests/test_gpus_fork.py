"""The warm-fork-cuda item's two false FAILs (issue 54), on CPU: its ranks must print their line when the report
folder is relative (scripts/gpu-wheels-check.sh passes ``--out out/gpu-check``) and when the python running the
check has no course installed (the device's own python, run from the repository: ``python -m course_lib``).

On CPU the ranks' CUDA op fails ("Torch not compiled with CUDA"), so the item is a FAIL here either way; what
these tests pin is that the ranks ran, warm, and printed their ``fork_rank`` line (the verdict then names the
CUDA op), where before they printed nothing ("rank(s) [0, 1] printed no fork_rank line")."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

RUN_ITEM = """
import sys
from pathlib import Path
from course_lib.selftest.forkcheck import warm_fork_cuda
from course_lib.selftest.probe import probe
from course_lib.selftest.runs import Context
out = warm_fork_cuda(Context(probe(), Path(sys.argv[1]), 120))
print("VERDICT", out.status, out.detail)
"""
NO_LINE = "printed no fork_rank line"
RAN = "a CUDA op failed in a warm-forked rank (not marked a bad fork): rank 0: "


def _item(python: str, cwd, folder: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COURSE_WARM")}
    p = subprocess.run([python, "-c", RUN_ITEM, folder], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=240)
    verdict = next((x for x in p.stdout.splitlines() if x.startswith("VERDICT ")), "")
    assert verdict, p.stdout + p.stderr
    return verdict


def _cpu_only():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU here: the item would pass, this test reads the CPU's verdict")


@pytest.mark.slow
def test_a_relative_report_folder_reaches_the_forked_ranks(tmp_path):
    """``--out out/gpu-check``: the warm server runs in its own folder and resolved the ranks' relative cwd there."""
    _cpu_only()
    verdict = _item(sys.executable, tmp_path, "out/gpu-check/warm-fork-cuda")
    assert NO_LINE not in verdict and RAN in verdict, verdict
    assert (tmp_path / "out/gpu-check/warm-fork-cuda/ranks.log").is_file()


@pytest.mark.slow
def test_the_ranks_import_the_course_when_the_python_has_none_installed(tmp_path):
    """The device's python: a venv that sees this venv's torch (``pick --see-site``) but not its editable
    course_lib, run from a tree that holds course_lib (a link here), as ``cd repo && python -m course_lib``."""
    _cpu_only()
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "course_lib.selftest.pick", "--see-site", py, sys.executable], cwd=ROOT,
                   check=True, capture_output=True, timeout=120)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "course_lib").symlink_to(ROOT / "course_lib")
    nowhere = subprocess.run([py, "-c", "import course_lib"], cwd=tmp_path, capture_output=True, timeout=120)
    assert nowhere.returncode != 0, "this venv must not have the course installed"
    verdict = _item(py, tree, str(tmp_path / "report" / "warm-fork-cuda"))
    assert NO_LINE not in verdict and RAN in verdict, verdict
