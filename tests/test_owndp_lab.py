"""Notebook 10's table of step times (course_lib.owndp.lab), from a run's figures written out by hand: the rows, the
exposed communication and its share, the alpha-beta model fitted to the run's own all-reduces. The real run is
executed by tests/test_notebooks.py (both trees)."""
import pytest

from course_lib.allreduce import costmodel
from course_lib.owndp import lab

CONFIG = {"steps": 5, "warmup": 2, "width": 256, "layers": 4, "bucket_mb": 0.125}
ALPHA, BETA = 100e-6, 1e-9


def made_up_run():
    timed = [(b, 1000 * costmodel.predict("gloo", 2, b, ALPHA, BETA)) for b in (4096, 262144, 4194304)]
    return {"world": 2, "config": CONFIG, "allreduce": timed, "torch buckets": [263168] * 4, "errors": {},
            "ms": {"compute only": (10.0, 0.0), "naive": (20.0, 9.0), "flat": (15.0, 4.0), "bucketed": (12.5, 1.0),
                   "torch DDP": (11.0, 0.0)}}


def test_rows_give_exposed_communication_and_its_share():
    got = {r[0]: r for r in lab.rows(made_up_run())}
    assert list(got) == ["compute only", "naive", "flat", "bucketed", "torch DDP"]     # in the table's order
    assert got["naive"][1:6] == (8, 20.0, 9.0, 10.0, 0.5)          # 4 layers x (weight, bias); 10 of 20 ms exposed
    assert got["flat"][1] == 1 and got["bucketed"][1] == 4 and got["torch DDP"][1] == 4
    assert got["compute only"][4:6] == (0.0, 0.0)


def test_the_model_is_fitted_to_the_run_and_prices_each_variants_messages():
    cost, (alpha, beta) = lab.model_ms(made_up_run())
    assert alpha == pytest.approx(ALPHA, rel=1e-3) and beta == pytest.approx(BETA, rel=1e-3)
    sizes = [4 * 256 * 256, 4 * 256] * 4
    assert cost["naive"] == pytest.approx(1000 * sum(costmodel.predict("gloo", 2, n, ALPHA, BETA) for n in sizes),
                                          rel=1e-3)
    # the same bytes in one message: (P - 1) latencies fewer, 2(W-1) alpha each
    assert cost["naive"] - cost["flat"] == pytest.approx(1000 * 7 * 2 * ALPHA, rel=1e-3)


def test_table_says_what_did_not_run():
    run = made_up_run()
    run["errors"]["overlapped"] = "not written yet: NotImplementedError (own_ddp.py line 9, in __init__)"
    text = lab.table(run)
    assert "naive                   8     20.0       9.0     10.0        50%" in text, text
    assert "overlapped did not run: not written yet" in text
    assert "alpha = 100 us" in text
