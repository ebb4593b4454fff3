"""The course map: which notebooks each route takes, in what order, and how long each takes.

One source: a notebook's minutes are the ones its own header states (``**Time:** about N minutes``, the first
thing a learner reads in it), the routes are here, and notebook 00 and the README's "Course map" both show what
``route_rows`` renders from them (tests/test_course_map.py compares the README's rows with it). A new notebook
(11, 12, ...) joins the map with its header and a line in ``ORDER`` and ``NEEDS``; until its file exists it is
left out.
"""
import json
import re
from pathlib import Path

from course_lib.core.paths import course_root

MINUTES = re.compile(r"\*\*Time:\*\* about (\d+) minutes")

# what a learner does in each, for 00's path table (a notebook not listed shows its title)
DOES = {"00": "see what this machine runs on, and choose your route",
        "01": "measure the serial baseline, and tune it before you scale it",
        "02": "turn the serial script into DistributedDataParallel",
        "03": "write and submit the job script: srun or torchrun",
        "04": "run on 1, 2, 4 ranks and ask: is it worth the resources?",
        "05": "write naive, ring and tree all-reduce yourself, and time them",
        "06": "split one layer over ranks, the Megatron way",
        "07": "find the bugs in five broken programs and jobs",
        "08": "checkpoint, kill a rank, resume; a job that requeues itself",
        "09": "gradient accumulation, ZeRO-1/2 on your own collectives, FSDP2",
        "10": "write DDP yourself: hooks, buckets, overlap",
        "11": "split the sequence over ranks: context parallelism and ring attention",
        "12": "cut a model into pipeline stages: AFAB, 1F1B, the bubble measured"}
HALF_DAY = ("00", "01", "02", "03", "04")
# the self-study order; each notebook after the ones it needs (NEEDS)
ORDER = ("00", "01", "02", "03", "04", "05", "10", "06", "11", "12", "07", "08", "09")
NEEDS = {"07": "03", "08": "04", "09": "05", "10": "05", "11": "06", "12": "06"}
ROUTES = (("half day", HALF_DAY, "the data-parallel core: baseline, DDP, jobs, scaling"),
          ("one day", HALF_DAY + ("05", "06"), "adds what an all-reduce costs and tensor parallelism"),
          ("one day, debugging focus", HALF_DAY + ("07", "05"),
           "for sites whose users bring broken jobs: the bug hunt, then the all-reduce"))


def notebooks(folder: Path | None = None) -> dict[str, tuple[str, int | None]]:
    """{"01": (title, minutes)} of the numbered notebooks, the minutes from each one's header."""
    found = {}
    for path in sorted((folder or course_root() / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        text = "\n".join(_header(json.loads(path.read_text(encoding="utf-8"))["cells"]))
        m = MINUTES.search(text)
        title = text.splitlines()[0].lstrip("# ").split(" · ", 1)[-1]
        found[path.name[:2]] = (title, int(m.group(1)) if m else None)
    return found


def _header(cells):
    """The text of the Markdown cells before the first code cell: the notebook's header."""
    for cell in cells:
        if cell["cell_type"] != "markdown":
            return
        yield "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _hours(minutes: int) -> str:
    half_hours = round(minutes / 30)
    return f"{half_hours // 2}{'.5' if half_hours % 2 else ''} hours"


def route_rows(folder: Path | None = None) -> list[tuple[str, str, str]]:
    """(route, notebooks with their minutes, what it covers): the rows of the course map."""
    nbs = notebooks(folder)
    rows = []
    for name, route, covers in ROUTES:
        total = sum(nbs[n][1] or 0 for n in route)
        rest = route[len(HALF_DAY):] if route[:len(HALF_DAY)] == HALF_DAY else ()
        listed = ("the half day, then " + " and ".join(f"{n} ({nbs[n][1]})" for n in rest) if rest
                  else ", ".join(f"{n} ({nbs[n][1]})" for n in route if n in nbs))
        rows.append((f"{name} (about {_hours(total)})", listed, covers))
    order = [n for n in ORDER if n in nbs] + sorted(set(nbs) - set(ORDER))
    after = "; ".join(f"{n} after {NEEDS[n]}" for n in order if n in NEEDS)
    listed = ", ".join(f"{n} ({nbs[n][1]})" for n in order)
    rows.append(("self-study", f"{listed} in this order ({after}); at your own pace",
                 "every notebook runs on a laptop: CPU, Gloo, local processes"))
    return rows


def markdown(folder: Path | None = None) -> str:
    """The course map as a Markdown table: what 00 shows and the README's "Course map" holds."""
    head = "| route | notebooks (minutes) | what it covers |\n| --- | --- | --- |\n"
    return head + "".join(f"| {a} | {b} | {c} |\n" for a, b, c in route_rows(folder))


def path_table(folder: Path | None = None) -> str:
    """Every notebook, its minutes and what you do there: 00's "The path"."""
    rows = "".join(f"| {n} {title} | {minutes} | {DOES.get(n, title)} |\n"
                   for n, (title, minutes) in notebooks(folder).items())
    return "| notebook | minutes | you will |\n| --- | --- | --- |\n" + rows
