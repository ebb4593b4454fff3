"""The arithmetic behind notebook 12's figures, on made-up timelines and layer times (no processes): the bubble
of an ideal AFAB step is GPipe's formula, peaks are counted from the calls, the cut by time is the best one."""
import itertools

import pytest

from course_lib.pp import balance, timeline


def ideal_afab(p: int, m: int, tf: float, tb: float) -> list[dict]:
    """Every stage's calls in GPipe's ideal step: forward i on stage s in slot i + s, backwards after the last
    forward, the last stage first; each stage's step ends with its last backward."""
    fill = (m + p - 1) * tf
    stages = []
    for s in range(p):
        events = [{"kind": "F", "i": i, "t0": (i + s) * tf, "t1": (i + s + 1) * tf} for i in range(m)]
        events += [{"kind": "B", "i": i, "t0": fill + (i + p - 1 - s) * tb, "t1": fill + (i + p - s) * tb}
                   for i in range(m)]
        stages.append({"stage": s, "events": events, "end": events[-1]["t1"]})
    return stages


@pytest.mark.parametrize("p,m", [(2, 1), (2, 8), (4, 3), (4, 8)])
def test_an_ideal_afab_step_has_gpipes_bubble_and_holds_m(p, m):
    got = timeline.summary(ideal_afab(p, m, 0.02, 0.04))
    assert got["step"] == pytest.approx((m + p - 1) * 0.06)
    assert got["bubble"] == pytest.approx(timeline.formula(p, m))
    assert [row["peak"] for row in got["stages"]] == [m] * p


def test_peak_in_flight_counts_forwards_minus_backwards():
    calls = [("F", 0), ("F", 1), ("B", 2), ("F", 3), ("B", 4), ("B", 5), ("F", 6), ("B", 7)]
    events = [{"kind": k, "t0": t, "t1": t + 0.5} for k, t in calls]
    assert timeline.peak_in_flight(events) == 2


def test_parse_groups_the_ranks_lines_by_step():
    line = timeline.PREFIX + '{"schedule": "afab", "p": 2, "m": 1, "stage": %d, "events": [], "end": 1.0}'
    steps = timeline.parse([line % 1 + "\nother output", line % 0])
    assert list(steps) == [("afab", 2, 1)] and [r["stage"] for r in steps[("afab", 2, 1)]] == [0, 1]


@pytest.mark.parametrize("times,p", [([1, 1, 4, 4, 1, 1, 4, 1], 4), ([5, 1, 1, 1, 1, 1], 3), ([2, 3, 1], 3)])
def test_the_cut_by_time_is_the_best_cut_into_consecutive_layers(times, p):
    cut = balance.by_time(times, p)
    assert [i for r in cut for i in r] == list(range(len(times))) and len(cut) == p
    best = min(max(sum(times[a:b]) for a, b in zip((0, *c), (*c, len(times))))
               for c in itertools.combinations(range(1, len(times)), p - 1))
    assert max(balance.stage_times(times, cut)) == best
