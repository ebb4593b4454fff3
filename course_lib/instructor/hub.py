"""``course lab-settings``: the course's JupyterLab settings for learners in one environment.

Writes, under ``--prefix`` (default: this Python's environment, the one the hub's servers run from):
- ``share/jupyter/lab/settings/overrides.json``: the news prompt off (``fetchNews: "false"``), so no learner is
  asked whether Jupyter may fetch news from the internet;
- ``etc/jupyter/labconfig/page_config.json``: nbgrader's JupyterLab extension disabled, so learners see no
  "Create Assignment" or "Validate" menus. An instructor turns it back on for themselves only with
  ``jupyter labextension enable --level=user @jupyter/nbgrader`` (a user-level setting wins over the environment's).
Existing settings in those files are kept; only these keys are set.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from course_lib.core import atomic

OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}
DISABLED = {"@jupyter/nbgrader": True}


def _merge(path: Path, update) -> dict:
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except ValueError as e:
        raise SystemExit(f"course lab-settings: {path} is not valid JSON ({e}); fix or remove it") from e
    update(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


def write_settings(prefix: str | Path) -> list[Path]:
    """Write both files under ``prefix``; returns their paths."""
    prefix = Path(prefix)
    overrides = prefix / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    page = prefix / "etc" / "jupyter" / "labconfig" / "page_config.json"
    _merge(overrides, lambda d: [d.setdefault(k, {}).update(v) for k, v in OVERRIDES.items()])
    _merge(page, lambda d: d.setdefault("disabledExtensions", {}).update(DISABLED))
    return [overrides, page]


def add_arguments(p) -> None:
    p.add_argument("--prefix", type=Path, default=Path(sys.prefix),
                   help="the environment JupyterLab runs from (default: this one)")


def run(args) -> int:
    for path in write_settings(args.prefix):
        print(f"course lab-settings: wrote {path}")
    return 0
