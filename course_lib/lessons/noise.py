"""When a measurement a learner is asked to believe cannot be believed, and the verdict it then gives: none.

Two signs, both measured, never assumed: repeats of one setting that disagree (the spread between the fastest
and the slowest run of the same thing), and a machine where other processes want the cores the runs need (the
1-minute load average, against the cores). A knob whose effect is smaller than the spread of the baseline's own
repeats cannot be told from noise, whatever its ratio says; on a busy machine the next rerun can flip it.
"""
import os

SPREAD = 0.10    # repeats of one setting further apart than this: the machine's noise hides a 10 % effect
OTHERS = 0.5     # other runnable processes per core (load average minus the run's own) above which runs queue
MARGIN = 0.10    # a ratio within 10 % of 1 is "about the same" even on a quiet machine


def spread(values) -> float:
    """(slowest - fastest) / fastest of repeats of one setting: 0.46 when one run took 46 % longer."""
    values = [v for v in values if v > 0]
    return (max(values) - min(values)) / min(values) if len(values) >= 2 else 0.0


def machine_load() -> tuple[float, int]:
    """(1-minute load average, cores) of the machine this runs on."""
    return os.getloadavg()[0], os.cpu_count() or 1


def why_not(repeats, load: float | None = None, cores: int = 1, own: float = 1.0) -> str:
    """Why the measurement cannot be believed, or "" when it can.

    ``repeats``: one setting's measurements (images/s or step times); ``load``: the load average of the machine
    the runs went to (None where that is not this one, e.g. a Slurm node), of which ``own`` is the runs' own."""
    if len(repeats) < 2:
        return "the baseline ran once here, so its noise is unknown"
    s = spread(repeats)
    if s > SPREAD:
        return (f"the same setting measured {len(repeats)} times differs by {s:.0%} (over {SPREAD:.0%}): "
                f"an effect smaller than that cannot be told from noise")
    if load is not None and (load - own) / cores > OTHERS:
        return (f"the machine is busy (load {load:.1f} on {cores} cores, about {max(load - own, 0):.1f} of it "
                "other processes): the runs waited for a CPU, and a rerun can flip the verdict")
    return ""


def verdict(ratio: float, why: str = "") -> str:
    """"faster" / "about the same" / "slower" for a throughput ratio against the baseline, or no verdict."""
    if why:
        return "no verdict: this measurement cannot be believed here"   # why: printed beside it
    return "faster" if ratio > 1 + MARGIN else "slower" if ratio < 1 - MARGIN else "about the same"
