"""One task of ``course grade --engine slurm``'s job array: ``python -m course_lib.grading.array_task MANIFEST``
grades learner ``$SLURM_ARRAY_TASK_ID`` as the local engine does and rewrites ``rows/<task id>.json`` after each
exercise, so a task Slurm kills leaves what it finished; SIGTERM kills the running check first.
"""
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from course_lib.core.atomic import write_text
from course_lib.grading.cgroups import describe
from course_lib.grading.discover import discover
from course_lib.grading.run import check_one, raise_interrupt, timing_note
from course_lib.grading.sandbox import Limits
from course_lib.runtime.slurm import forget_the_job


def _write(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=1))


def grade_task(manifest: dict, index: int, rows_dir: Path) -> dict:
    """Grade learner ``index`` of the manifest; the data written to ``rows_dir/<index>.json``."""
    entry = manifest["learners"][index]
    exercises, limits = manifest["exercises"], Limits(**manifest["limits"])
    out = Path(manifest["out"])
    data = {"learner": entry["name"], "rows": [], "done": [], "finished": False, "timing": [],
            "isolation": describe(limits), "host": os.uname().nodename}
    path = rows_dir / f"{index}.json"
    kills = []
    with tempfile.TemporaryDirectory(prefix="course-grade-task-") as scratch:
        found, _ = discover(Path(manifest["submissions"]), exercises, Path(scratch), only={entry["source"]})
        learner = next(lr for lr in found if lr.source == entry["source"])
        learner.name = entry["name"]
        _write(path, data)
        try:
            for ex in exercises:
                rows, outcome = check_one(learner, ex, limits, out, kills.append)
                kills.clear()      # only the running check may be killed: a finished one's pid is reused
                if outcome is not None:
                    data["timing"].append(timing_note(ex, outcome))
                data["rows"] += [{"learner": learner.name, "exercise": ex, **r} for r in rows]
                data["done"].append(ex)
                _write(path, data)
        except KeyboardInterrupt:    # SIGTERM from Slurm: stop the running check and end
            for kill in kills:
                kill()
            raise
    data["finished"] = True
    _write(path, data)
    return data


def main(argv: list[str]) -> int:
    manifest_path = Path(argv[0])
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    rows_dir = manifest_path.parent / os.environ["SLURM_ARRAY_JOB_ID"] / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    forget_the_job()   # the checks must see what they see on the local engine
    signal.signal(signal.SIGTERM, raise_interrupt)
    start = time.monotonic()
    try:
        data = grade_task(manifest, index, rows_dir)
    except KeyboardInterrupt:
        print(f"task {index}: stopped by SIGTERM (Slurm's time limit or scancel)", flush=True)
        return 143
    print(f"task {index}: {data['learner']}: {len(data['rows'])} rows in {time.monotonic() - start:.1f} s "
          f"on {data['host']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
