"""Check notebook 04's exercise, ``04_scaling/schedule.py``: ``lr_at``, ``scaling_rows``, ``gpu_hours_to_target``.

Pure arithmetic, so it runs in the caller's process against values worked out by hand: ``check(path)`` -> Report.
"""
import math

from course_lib.lessons.checking import run_parts

# (step, total, base, peak, warm-up) -> the rate: warm-up from the small-batch rate, then cosine to 0
LR_CASES = [((0, 100, 1.0, 4.0, 10), 1.0, "warm-up starts from the small-batch rate (base_lr), not from 0"),
            ((5, 100, 1.0, 4.0, 10), 2.5, "halfway through the warm-up: halfway from base_lr to peak_lr"),
            ((10, 100, 1.0, 4.0, 10), 4.0, "the end of the warm-up is peak_lr"),
            ((55, 100, 1.0, 4.0, 10), 2.0, "halfway through the cosine: half of peak_lr"),
            ((100, 100, 1.0, 4.0, 10), 0.0, "the last step: 0"),
            ((0, 100, 1.0, 4.0, 0), 4.0, "no warm-up: the cosine starts at peak_lr")]
SECONDS = {1: 100.0, 2: 60.0, 4: 40.0}
ROWS = [{"ranks": 1, "speedup": 1.0, "efficiency": 1.0, "cost": 1.0},
        {"ranks": 2, "speedup": 100 / 60, "efficiency": 100 / 120, "cost": 1.2},
        {"ranks": 4, "speedup": 2.5, "efficiency": 0.625, "cost": 1.6}]


def _call(report, item, fn, *args):
    try:
        return True, fn(*args)
    except NotImplementedError:
        report.add(item, False, "not written yet (raise NotImplementedError)")
    except Exception as e:            # the learner's code: any error is the verdict
        report.add(item, False, f"{fn.__name__}{args} raised {type(e).__name__}: {e}")
    return False, None


def _lr(mod, report):
    for args, want, why in LR_CASES:
        ok, got = _call(report, "lr_at", mod.lr_at, *args)
        if not ok:
            return
        if not isinstance(got, (int, float)) or not math.isclose(got, want, abs_tol=1e-9):
            report.add("lr_at", False, f"lr_at{args} = {got!r}, expected {want}: {why}")
            return
    report.add("lr_at", True, "warm-up from base_lr to peak_lr, then cosine to 0")


def _rows(mod, report):
    ok, rows = _call(report, "scaling_rows", mod.scaling_rows, dict(SECONDS))
    if not ok:
        return
    try:
        for got, want in zip(rows, ROWS, strict=True):
            for key, value in want.items():
                if not math.isclose(got[key], value, rel_tol=1e-9):
                    report.add("scaling_rows", False, f"for {got['ranks']} ranks {key} = {got[key]!r}, expected "
                               f"{value:.4g} (epoch seconds {SECONDS})")
                    return
    except (KeyError, TypeError, ValueError) as e:
        report.add("scaling_rows", False, f"rows {rows!r}: one dict per number of ranks with ranks, seconds, speedup, "
                   f"efficiency and cost ({type(e).__name__}: {e})")
        return
    report.add("scaling_rows", True, "speedup, efficiency and relative cost for 1, 2 and 4 ranks")


def _hours(mod, report):
    curve = [(1800.0, 0.8), (3600.0, 0.92), (5400.0, 0.95)]
    cases = [((curve, 4, 0.9), 4.0), ((curve, 2, 0.9, 4), 8.0), ((curve, 4, 0.99), None)]
    for args, want in cases:
        ok, got = _call(report, "gpu_hours_to_target", mod.gpu_hours_to_target, *args)
        if not ok:
            return
        if (got is None) != (want is None) or (want is not None and not math.isclose(got, want)):
            report.add("gpu_hours_to_target", False, f"gpu_hours_to_target(curve, {', '.join(map(repr, args[1:]))}) = "
                       f"{got!r}, expected {want} for curve {curve}")
            return
    report.add("gpu_hours_to_target", True, "GPU-hours at the first epoch that reaches the target; None if none does")


def check(path, **_options):
    """The verdicts on ``path`` (a course_lib.core.report.Report)."""
    return run_parts("schedule", path, (_lr, _rows, _hours))
