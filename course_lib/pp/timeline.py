"""Read the timed steps of ``course_lib.pp.measure`` back: each stage's busy and idle time, the bubble against
(p - 1) / (m + p - 1), the micro-batches each stage held at once, and the figure of a schedule stage by stage."""
import json

PREFIX = "PPEVENT "


def parse(outputs) -> dict:
    """{(schedule, p, m): [record of stage 0, 1, ...]} from the ranks' outputs (one text per rank)."""
    steps: dict = {}
    for text in outputs:
        for line in text.splitlines():
            if line.startswith(PREFIX):
                rec = json.loads(line[len(PREFIX):])
                steps.setdefault((rec["schedule"], rec["p"], rec["m"]), []).append(rec)
    return {k: sorted(v, key=lambda r: r["stage"]) for k, v in steps.items()}


def formula(p: int, m: int) -> float:
    """GPipe's bubble: (p - 1) / (m + p - 1) of the step, for AFAB and 1F1B alike (equal stages)."""
    return (p - 1) / (m + p - 1)


def peak_in_flight(events) -> int:
    """Forwards minus backwards, at its highest: the micro-batches whose activations the stage held at once."""
    held = peak = 0
    for e in sorted(events, key=lambda e: e["t0"]):
        held += 1 if e["kind"] == "F" else -1
        peak = max(peak, held)
    return peak


def summary(stages) -> dict:
    """The step's time (the last stage to finish), and per stage: busy and idle seconds, bubble, peak held."""
    step = max(r["end"] for r in stages)
    rows = []
    for r in stages:
        busy = sum(e["t1"] - e["t0"] for e in r["events"])
        rows.append({"stage": r["stage"], "busy": busy, "idle": step - busy, "bubble": 1 - busy / step,
                     "peak": peak_in_flight(r["events"])})
    return {"step": step, "stages": rows, "bubble": sum(x["bubble"] for x in rows) / len(rows)}


def table(steps: dict, schedule: str, p: int) -> list[dict]:
    """One row per m: measured bubble (mean over stages), the formula's, and each stage's peak held."""
    out = []
    for (s, pp, m), stages in sorted(steps.items(), key=lambda kv: kv[0][2]):
        if s == schedule and pp == p:
            sm = summary(stages)
            out.append({"m": m, "measured": sm["bubble"], "formula": formula(p, m),
                        "peaks": [x["peak"] for x in sm["stages"]], "step": sm["step"]})
    return out


def draw(stages, ax, title: str = "") -> None:
    """A stage-by-stage picture of one step: forwards light, backwards dark, each labelled with its micro-batch."""
    colours = {"F": "#8fb8de", "B": "#2b5d8a"}
    for r in stages:
        y = r["stage"]
        for e in r["events"]:
            ax.broken_barh([(e["t0"], e["t1"] - e["t0"])], (y - 0.4, 0.8), color=colours[e["kind"]])
            ax.text(e["t0"] + (e["t1"] - e["t0"]) / 2, y, f"{e['kind']}{e['i']}", ha="center", va="center",
                    fontsize=7, color="white" if e["kind"] == "B" else "black")
    ax.set_yticks([r["stage"] for r in stages], [f"stage {r['stage']}" for r in stages])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the step began")
    ax.set_title(title, fontsize=9)
