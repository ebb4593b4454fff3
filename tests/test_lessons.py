"""course_lib.lessons: the checks of notebook 01's step.py and 04's schedule.py catch the usual mistakes, and
ddp_problem tells a DDP run from ranks that each trained alone (the run notebooks 03 and 04 must not draw from)."""
from pathlib import Path
from types import SimpleNamespace

from conftest import ROOT

from course_lib.lessons import runs, schedule_check, step_check


def edited(tmp_path, relative, old, new):
    text = (ROOT / "solutions" / relative).read_text()
    assert old in text
    path = tmp_path / Path(relative).name
    path.write_text(text.replace(old, new))
    return path


def verdicts(report):
    return {v.item: (v.result, v.message) for v in report.verdicts}


def test_solutions_pass_and_starters_say_not_written():
    for check, relative in ((step_check, "01_tuning/step.py"), (schedule_check, "04_scaling/schedule.py")):
        assert check.check(ROOT / "solutions" / relative).passed, relative
        starter = check.check(ROOT / "exercises" / relative)
        assert not starter.passed and all("not written yet" in v.message for v in starter.verdicts), starter.text()


def test_a_clock_read_before_the_sync_is_caught(tmp_path):
    path = edited(tmp_path, "01_tuning/step.py", "        torch.cuda.synchronize(device)\n    return",
                  "        pass\n    return")
    result, message = verdicts(step_check.check(path))["time_steps on a GPU"]
    assert result == "fail" and "synchronise before each clock read" in message


def test_fp16_without_the_scaler_is_caught(tmp_path):
    path = edited(tmp_path, "01_tuning/step.py", "    if scaler is not None:", "    if False:")
    result, message = verdicts(step_check.check(path))["train_step fp16 + GradScaler"]
    assert result == "fail" and "scaler calls []" in message


def test_a_warm_up_from_zero_is_caught(tmp_path):
    path = edited(tmp_path, "04_scaling/schedule.py", "return base_lr + (peak_lr - base_lr) * step / warmup_steps",
                  "return peak_lr * step / warmup_steps")
    result, message = verdicts(schedule_check.check(path))["lr_at"]
    assert result == "fail" and "small-batch rate" in message


def job(lines, ranks=2, state="COMPLETED", gpus=0):
    recs = [{"rank": r, "epoch": 1, "images_per_s": 200.0, "images_per_s_rank": 200.0 / ranks} for r in range(ranks)]
    return SimpleNamespace(state=state, metrics=lambda rank=None: recs, log=lambda: "\n".join(lines),
                           spec=SimpleNamespace(gpus_per_node=gpus))


def test_ddp_problem_names_ranks_that_trained_alone():
    assert runs.ddp_problem(job(["0: device=cpu"]), 2) is None
    alone = job(["0: device=cpu"], ranks=1)
    alone.metrics = lambda rank=None: [{"rank": r, "epoch": 1, "images_per_s": 100.0, "images_per_s_rank": 100.0}
                                       for r in range(2)]
    assert "trained on the whole data set by itself" in runs.ddp_problem(alone, 2)
    assert "asked for GPUs but trained on cpu" in runs.ddp_problem(job(["0: device=cpu"], gpus=4), 2)
    assert "FAILED" in runs.ddp_problem(job([], state="FAILED"), 2)
    assert 'TREE = "solutions"' in runs.caveat("x")
