"""scripts/hub/jupyterhub_config.py as traitlets loads it, without JupyterHub (tests/test_hub.py loads it with the
hub's own Python where the shared test install is): the servers' activity interval follows the culler's timeout,
and the learners' servers work in their course folder (issue 55)."""
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

CONFIG = ROOT / "scripts" / "hub" / "jupyterhub_config.py"
LOAD = """
import json, runpy, sys
from traitlets.config import Config
cfg = Config()
try:
    runpy.run_path(sys.argv[1], {"get_config": lambda: cfg})
except SystemExit as e:
    print(json.dumps({"stopped": str(e)}))
else:
    print(json.dumps({"interval": cfg.Spawner.environment["JUPYTERHUB_ACTIVITY_INTERVAL"],
                      "cmd": list(cfg.Spawner.cmd), "folder": cfg.Spawner.notebook_dir,
                      "culler": [s["command"] for s in cfg.JupyterHub.services if s["name"] == "idle-culler"]}))
"""


def load(tmp_path, **variables) -> dict:
    """The config under ``variables``; jupyterhub-idle-culler is an empty package here (the config only asks
    whether it is installed): the tests' venv has no JupyterHub."""
    stub = tmp_path / "stub" / "jupyterhub_idle_culler"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_HUB_")}
    env.update(PYTHONPATH=str(stub.parent), COURSE_HUB_DIR=str(tmp_path / "state"), COURSE_HUB_AUTH="dummy",
               COURSE_HUB_PASSWORD="x" * 16, COURSE_PREFIX=str(tmp_path / "prefix"), **variables)
    p = subprocess.run([sys.executable, "-c", LOAD, str(CONFIG)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


@pytest.mark.parametrize("timeout, asked, interval", [("30", "", "10"), ("3600", "", "60"), ("0", "", "60"),
                                                       ("30", "4", "4"), ("90", "", "30")])
def test_activity_reaches_the_hub_well_within_the_culler_timeout(tmp_path, timeout, asked, interval):
    """A server reports its activity every interval: at the timeout or above, a server busy with a job looked idle
    between two reports and was culled (a 30 s timeout with the 60 s interval did)."""
    got = load(tmp_path, COURSE_HUB_CULL_TIMEOUT=timeout, COURSE_HUB_ACTIVITY_INTERVAL=asked)
    assert got["interval"] == interval, got
    assert bool(got["culler"]) == (timeout != "0") and (not got["culler"] or f"--timeout={timeout}" in got["culler"][0])


def test_an_interval_the_culler_would_outrun_is_refused(tmp_path):
    got = load(tmp_path, COURSE_HUB_CULL_TIMEOUT="30", COURSE_HUB_ACTIVITY_INTERVAL="20")
    assert got["stopped"].startswith("[course hub] COURSE_HUB_ACTIVITY_INTERVAL=20 s with COURSE_HUB_CULL_TIMEOUT=30 s")


def test_servers_work_in_the_course_folder(tmp_path):
    """A terminal that JupyterLab opens without a folder starts in the server's working folder: ~/course."""
    got = load(tmp_path)
    assert got["folder"] == "~/course"
    assert '&& cd "$HOME/course" && exec ' in got["cmd"][2], got["cmd"]
