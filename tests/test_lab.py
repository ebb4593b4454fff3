"""``make lab``: its settings and messages (unit tests, fast), and the lab itself in a real browser (slow).

The browser test does what the README tells a self-study learner: a fresh clone (of this checkout's HEAD), ``make
lab``, the address it prints. Debian's chromium, driven by Playwright, then checks that notebook 00 is what opened,
edits and saves ``exercises/02_ddp/mnist_classify_ddp.py`` in the lab's editor, runs `course check ddp ...` in the
lab's terminal and notebook 02's Step 1 check cell. Screenshots go to out/lab/; on a failure the server's log too.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from browser_lab import (
    WAIT_MS,
    Lab,
    chromium,
    failed_loads,
    fresh_clone,
    how_it_ended,
    one_line,
    run_to,
    still,
    why_no_browser_test,
)
from conftest import ROOT, processes_under

from course_lib.instructor import hub

OUT = ROOT / "out" / "lab"


def test_lab_dir_settings_keep_nbgrader_and_news_away(tmp_path):
    lab = tmp_path / "lab"
    (lab / "labconfig").mkdir(parents=True)
    (lab / "labconfig/page_config.json").write_text('{"disabledExtensions": {"other": true}}')
    hub.write_lab_dir(lab, venv=tmp_path / "venv")
    page = json.loads((lab / "labconfig/page_config.json").read_text())
    assert page["disabledExtensions"] == {"other": True, "@jupyter/nbgrader": True,
                                          "@jupyterlab/extensionmanager-extension": True}
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
    from course_lib.runtime import slurm

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


def _new_terminal(page) -> None:
    """File > New > Terminal, as a learner opens one; focus in it."""
    page.locator(".lm-MenuBar-item", has_text="File").first.click()
    page.locator(".lm-Menu-itemLabel:visible", has_text=re.compile(r"^New$")).first.hover()
    page.locator(".lm-Menu-itemLabel:visible", has_text=re.compile(r"^Terminal$")).first.click()
    page.locator(".jp-Terminal .xterm-helper-textarea").first.wait_for(state="attached")
    page.locator(".jp-Terminal").first.click()


@pytest.mark.slow
def test_make_lab_opens_00_edits_an_exercise_and_runs_checks(tmp_path):
    why = why_no_browser_test()
    if why:
        pytest.skip(f"no browser test of make lab here: {why}")
    clone = fresh_clone(tmp_path)
    exercise = clone / "exercises" / "02_ddp" / "mnist_classify_ddp.py"
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    lab, seen, t0 = Lab(clone, OUT / "server.log"), [], time.monotonic()
    try:
        opened = lab.wait_ready()
        assert opened.startswith("/lab/tree/notebooks/00_welcome.ipynb"), f"make lab printed {opened}"
        with chromium(OUT / "browser.log", seen) as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            still(page)
            failed_loads(page, seen)
            page.set_default_timeout(WAIT_MS)
            try:
                # the address as printed (jupyter elides the token it was given; a learner's is in the line)
                page.goto(f"{lab.base}{opened.replace('token=...', 'token=' + lab.token)}")
                page.locator(".jp-Notebook .jp-MarkdownOutput h1", has_text="Welcome").first.wait_for()
                page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(state="attached")
                tabs = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").all_inner_texts()
                seen.append(f"tabs once the lab had loaded: {tabs}")
                assert [t.strip() for t in tabs] == ["00_welcome.ipynb"], f"the lab opened {tabs}, not 00 alone"
                page.screenshot(path=str(OUT / "01-welcome.png"))
                tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").first.get_attribute("class")
                assert "jp-mod-dirty" not in tab, "00 opened marked unsaved"
                trust = page.locator(".jp-StatusBar-Widget [title*='trusted']").first.get_attribute("title")
                seen.append(f"00: tab {tab!r}; {trust}")
                assert trust.startswith("Notebook trusted"), trust
                page.locator(".jp-BreadCrumbs-home").first.click()
                page.locator(".jp-DirListing-item", has_text="solutions").first.wait_for()
                items = sorted(page.locator(".jp-DirListing-item").all(), key=lambda i: i.bounding_box()["y"])
                listed = [i.inner_text().split("\n")[0].strip() for i in items]
                seen.append(f"the file browser's root, top down: {listed}")
                assert listed[:2] == ["notebooks", "exercises"] and "solutions" in listed, listed
                mark = page.locator(".jp-DirListing-item", has_text="solutions").locator(".jp-DirListing-itemText")
                assert mark.first.evaluate("e => getComputedStyle(e, '::after').content") == '" (answers)"'
                assert not set(listed) & {"course_lib", "tests", "scripts", "multigpu_course.egg-info"}, listed
                page.screenshot(path=str(OUT / "01b-file-browser.png"))

                # 00 run as a learner runs it: the course map (with 10) from course_map, the start-up measured
                page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="00_welcome").first.click()
                cell = run_to(page, 'quiz.reveal("00-start-s"')
                revealed = cell.locator(".jp-OutputArea-output", has_text="What happened:")
                revealed.wait_for()
                seen.append(f"00's start-up reveal: {revealed.inner_text()[:200]!r}")
                route = page.locator(".jp-OutputArea-output", has_text="self-study").first.text_content()
                assert "10 (60)" in route and "09 after 05" in route, route
                page.screenshot(path=str(OUT / "01c-welcome-run.png"))
                assert page.locator(".lm-MenuBar-item", has_text="Nbgrader").count() == 0, "nbgrader's menu shows"
                assert page.get_by_text("Validate", exact=True).count() == 0, "nbgrader's Validate button shows"
                assert page.get_by_text("official Jupyter news").count() == 0, "the news prompt shows"

                page.goto(f"{lab.base}/lab/tree/exercises/02_ddp/mnist_classify_ddp.py")
                editor = page.locator(".jp-FileEditor .cm-content")
                editor.wait_for()
                editor.click()
                page.keyboard.press("Control+End")
                page.keyboard.type("\n# edited in the lab\n")
                page.keyboard.press("Control+s")
                deadline = time.monotonic() + 30
                while "# edited in the lab" not in exercise.read_text() and time.monotonic() < deadline:
                    time.sleep(0.2)
                seen.append(f"exercise on disk ends with: {exercise.read_text()[-40:]!r}")
                assert exercise.read_text().endswith("# edited in the lab\n"), "the lab did not save the exercise"
                page.screenshot(path=str(OUT / "02-exercise-edited.png"))

                # File > New > Terminal: it starts in the clone with course on its PATH; its check runs while the
                # notebook works
                _new_terminal(page)
                page.keyboard.type("mkdir -p out && (command -v course; course check ddp "
                                   "exercises/02_ddp/mnist_classify_ddp.py; echo \"course exit $?\") 2>&1 "
                                   "| tee out/terminal.txt\n")
                # the keys reach the terminal over its websocket: leaving the page before the Enter arrived lost
                # the command in CI (nothing ran); tee creates the file as soon as the command starts
                terminal, deadline = clone / "out" / "terminal.txt", time.monotonic() + 60
                while not terminal.exists():
                    assert time.monotonic() < deadline, "the command typed in the terminal did not start in 60 s"
                    time.sleep(0.2)
                seen.append("the terminal's command started")

                page.goto(f"{lab.base}/lab/tree/notebooks/02_ddp_six_steps.ipynb")
                page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(state="attached")
                cell = run_to(page, "steps=[1]")
                verdict = cell.locator(".jp-OutputArea-output", has_text="passed in")
                verdict.wait_for()
                seen.append(f"Step 1 cell: {verdict.inner_text()[:300]!r}")
                assert "course check ddp" in verdict.inner_text() and str(exercise) in verdict.inner_text()
                printed = page.locator(".jp-OutputArea-output pre").first     # the lab's custom.css
                assert printed.evaluate("e => getComputedStyle(e).wordBreak") == "normal", "lines break mid-word"
                items = cell.locator("td[style*='nowrap']").all()
                assert items and all(one_line(i) for i in items), \
                    f"the check table's items wrap: {[i.inner_text() for i in items if not one_line(i)]}"
                page.screenshot(path=str(OUT / "03-step1-check.png"))

                deadline = time.monotonic() + WAIT_MS / 1000
                while "course exit" not in terminal.read_text():
                    assert time.monotonic() < deadline, \
                        f"the terminal's course check did not end; it printed: {terminal.read_text()[-2000:]!r}"
                    time.sleep(0.5)
                page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="Terminal 1").first.click()
                page.locator(".jp-Terminal").first.wait_for()
                page.screenshot(path=str(OUT / "04-terminal.png"))
                said = terminal.read_text()
                seen.append(f"terminal: {said[:200]!r} ... {said[-80:]!r}")
                found = Path(said.splitlines()[0])      # the venv's own course, first on the terminal's PATH
                assert found.resolve() == (clone / ".venv" / "bin" / "course").resolve(), said
                assert "course check ddp exercises/02_ddp/mnist_classify_ddp.py" in said and " passed in " in said
                assert "course exit 1" in said      # the starter fails its checks: the exit code says so
            except Exception:
                try:
                    page.screenshot(path=str(OUT / "failure.png"), timeout=30_000)
                except Exception as why:   # noqa: BLE001 - the page may be what failed; the rest still counts
                    seen.append(f"no failure screenshot: {str(why).splitlines()[0]}")
                raise
    except Exception as e:
        print("what the test saw:\n  " + "\n  ".join(seen))
        print(f"server log ({OUT / 'server.log'}):\n{lab.log()[-4000:]}")
        # the summary's one line carries what a reader needs first: the error, how the browser ended, the last step
        raise AssertionError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} | browser: "
                             f"{how_it_ended(OUT / 'browser.log')} | last seen: {seen[-2:]}") from e
    finally:
        left = lab.stop()
        print(f"make lab test: {time.monotonic() - t0:.0f} s; screenshots in {OUT}")
    assert not left, f"make lab had not stopped these {60} s after SIGTERM (killed now): {left}"
    assert not processes_under(clone), f"left behind: {processes_under(clone)}"
    # the runs and outputs of the lab went to the clone (its own workspace), not to this checkout
    assert (clone / "out" / "terminal.txt").is_file()
