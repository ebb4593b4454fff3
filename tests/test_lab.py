"""``make lab``: its settings (unit tests, fast), and the lab itself in a real browser (slow)."""
from __future__ import annotations

import json
import subprocess

from course_lib.instructor import hub


def test_lab_dir_settings_keep_nbgrader_and_news_away(tmp_path):
    lab = tmp_path / "lab"
    (lab / "labconfig").mkdir(parents=True)
    (lab / "labconfig/page_config.json").write_text('{"disabledExtensions": {"other": true}}')
    hub.write_lab_dir(lab, venv=tmp_path / "venv")
    page = json.loads((lab / "labconfig/page_config.json").read_text())
    assert page["disabledExtensions"] == {"other": True, "@jupyter/nbgrader": True}
    news = json.loads((lab / "labconfig/default_setting_overrides.json").read_text())
    assert news["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    server = json.loads((lab / "jupyter_server_config.json").read_text())["ServerApp"]
    assert set(server["jpserver_extensions"]) == set(hub.NBGRADER_SERVER)
    assert not any(server["jpserver_extensions"].values())
    assert server["terminado_settings"]["shell_command"][1:] == ["--rcfile", str(lab / "bashrc"), "-i"]


def test_lab_terminal_puts_the_venv_first_after_a_profile_that_resets_path(tmp_path):
    """A login profile that sets PATH afresh (Debian's /etc/profile does) must not hide the course's venv."""
    venv = tmp_path / "my venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/course").write_text("#!/bin/sh\necho course answered\n")
    (venv / "bin/course").chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text("PATH=/usr/bin:/bin\n")
    hub.write_lab_dir(tmp_path / "lab", venv=venv)
    shell = json.loads((tmp_path / "lab/jupyter_server_config.json").read_text())["ServerApp"]["terminado_settings"]
    r = subprocess.run([*shell["shell_command"], "-c", "course; echo \"$VIRTUAL_ENV\""], capture_output=True,
                       text=True, timeout=30, env={"HOME": str(home), "PATH": "/usr/bin:/bin", "TERM": "dumb"})
    assert r.stdout.splitlines()[-2:] == ["course answered", str(venv)], r.stdout + r.stderr


def test_a_report_names_a_command_only_where_there_is_one():
    from course_lib.core.report import Report

    for exercise, header in (("ddp", "course check ddp ex.py"), ("setup", "setup check (ex.py)"),
                             ("scaling", "scaling check (ex.py)")):
        r = Report(exercise, "ex.py")
        r.add("item", True)
        assert r.text().splitlines()[0] == header
        assert header in r._repr_html_()


def test_slurm_client_without_a_controller_is_said_calmly(tmp_path, monkeypatch):
    """Slurm's client installed, no controller (a laptop, CI before its Slurm starts): sinfo's own words, without
    its "sinfo: fatal:" prefix, in one line that says what to set."""
    from course_lib.jobs import slurm

    for tool, body in (("sbatch", "exit 1"), ("sinfo", "echo 'sinfo: error: fetch_config: DNS SRV lookup failed' >&2\n"
                                                       "echo 'sinfo: fatal: Could not establish a configuration "
                                                       "source' >&2\nexit 1")):
        (tmp_path / tool).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    ok, why = slurm.available()
    assert not ok and "fatal" not in why and "error" not in why and why.count("\n") == 0
    assert "no Slurm controller answers here: Could not establish a configuration source" in why
    assert "SLURM_CONF" in why
