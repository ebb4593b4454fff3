"""Store the outputs that nbval checks, and strip every other output, in the given notebooks.

    .venv/bin/python scripts/refresh_nbval_outputs.py notebooks/00_welcome.ipynb [...]

Each notebook runs once through papermill with its default parameters and COURSE_QUICK=1 (as the nbval
test runs it). Cells whose first line is ``# NBVAL_CHECK_OUTPUT`` keep the output of that run; all other
cells are committed without outputs or execution counts.
"""
import os
import sys
import tempfile
from pathlib import Path

import nbformat
import papermill

from course_lib.instructor.papermill_guard import ENGINE

MARK = "# NBVAL_CHECK_OUTPUT"


def refresh(path: Path) -> None:
    os.environ["COURSE_QUICK"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / path.name
        papermill.execute_notebook(str(path), str(out), cwd=str(path.parent), kernel_name="python3",
                                   progress_bar=False, engine_name=ENGINE)
        ran = {c.get("id"): c for c in nbformat.read(out, as_version=4).cells}
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        keep = cell.source.startswith(MARK) and cell.get("id") in ran
        cell.outputs = [o for o in ran[cell.id].outputs if o.output_type != "display_data"] if keep else []
        cell.execution_count = 1 if keep else None   # nbval ignores a cell with outputs but no count
        for o in cell.outputs:
            if o.output_type == "execute_result":
                o.execution_count = 1
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    print(f"{path}: {sum(c.source.startswith(MARK) for c in nb.cells if c.cell_type == 'code')} checked cells stored")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        refresh(Path(arg))
