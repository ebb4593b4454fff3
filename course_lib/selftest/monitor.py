"""The job template's GPU monitoring, run for real beside a GPU job, and the ``nvidia-smi dmon`` log read back.

The template writes a block that starts ``nvidia-smi dmon -s um -d 5`` (and ``top -b``) in the background
and a trap that stops them when the script exits. ``monitor_block`` cuts that block out of a rendered job
script so that the self-check can run exactly those lines; ``parse_dmon`` reads the log it writes.
"""
from __future__ import annotations

from course_lib.jobs.monitor import parse_dmon  # noqa: F401  (the self-check reads dmon as a notebook does)

START = 'MONITOR_PIDS=""'
END = "trap "


def monitor_block(script: str) -> str:
    """The lines of ``script`` from ``MONITOR_PIDS=""`` to the trap that stops the monitors ("" if none)."""
    lines = script.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip() == START), None)
    if first is None:
        return ""
    last = next((i for i in range(first, len(lines)) if lines[i].lstrip().startswith(END)), None)
    return "" if last is None else "\n".join(lines[first:last + 1]) + "\n"


def summarize(rows: list[dict]) -> dict:
    """Figures of a dmon log: samples, peak SM use (%) and peak frame-buffer memory (MB)."""
    def peak(name):
        values = [r[name] for r in rows if r.get(name) is not None]
        return max(values) if values else None

    out = {"dmon_samples": len(rows)}
    for name, key in (("sm", "peak_sm_pct"), ("fb", "peak_fb_mb")):
        if peak(name) is not None:
            out[key] = peak(name)
    return out
