"""Runs on a machine with fewer GPUs than ranks (issue 54): the local engine's decision (course_lib.runtime.gpus),
and through ``course_lib.runs.launch`` with real ranks, on CPU with a simulated GPU count (COURSE_LOCAL_GPUS)."""
from __future__ import annotations

import pytest

from course_lib.runtime.gpus import COUNT_VAR, count, place

SAYS = "2 ranks but 1 GPU(s) here: GPUs hidden (CUDA_VISIBLE_DEVICES=''), all 2 ranks run on CPU with gloo"
RANK_SCRIPT = """import os
print("visible=" + repr(os.environ.get("CUDA_VISIBLE_DEVICES")))
"""


@pytest.mark.parametrize("nprocs, gpus, hidden", [(2, 1, True), (4, 2, True), (4, 3, True), (2, 2, False),
                                                  (4, 8, False), (1, 1, False), (2, 0, False), (4, 0, False)])
def test_fewer_gpus_than_ranks_hide_them_all_and_say_so(nprocs, gpus, hidden):
    env, note = place(nprocs, gpus, {"A": "1"})
    assert (env.get("CUDA_VISIBLE_DEVICES") == "") == hidden and env["A"] == "1"
    assert bool(note) == hidden
    if hidden:
        assert note.startswith(f"{nprocs} ranks but {gpus} GPU(s) here") and f"needs {nprocs} GPUs" in note


def test_gpus_the_caller_chose_are_left_as_they_are():
    assert place(2, 1, {"CUDA_VISIBLE_DEVICES": "0,1"}) == ({"CUDA_VISIBLE_DEVICES": "0,1"}, "")
    assert place(2, 1, None)[0] == {"CUDA_VISIBLE_DEVICES": ""}
    assert place(2, 2, None) == (None, "")


def test_the_count_can_be_simulated(monkeypatch):
    monkeypatch.setenv(COUNT_VAR, "1")
    assert count() == 1
    monkeypatch.delenv(COUNT_VAR)
    import torch
    assert count() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


@pytest.mark.parametrize("gpus, seen", [("1", "''"), ("2", "None"), ("0", "None")], ids=["1-gpu", "2-gpus", "cpu"])
def test_a_notebook_run_of_two_ranks_on_one_gpu_runs_on_cpu_and_says_so(tmp_path, monkeypatch, capsys, gpus, seen):
    """Two real ranks through runs.launch (the notebooks' path) on the local engine; the machine's GPUs simulated."""
    from course_lib import runs

    monkeypatch.setenv(COUNT_VAR, gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    res = runs.launch([str(script)], nprocs=2, timeout=60, on_line=None, warm=False, engine="local")
    assert res.ok, res.summary()
    assert [res.output(r).strip() for r in range(2)] == [f"visible={seen}"] * 2
    assert (SAYS in capsys.readouterr().out) == (gpus == "1")
