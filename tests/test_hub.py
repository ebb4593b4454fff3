"""The course on a real JupyterHub, through a real browser (Debian's chromium driven by Playwright).

One hub (tests/hub_support.py) from the shared install of ``make hub-test-install``, three local learner accounts,
each learner's server running as that learner. Per learner: log in, land in their new workspace (~/course),
open notebook 02 and run the Step 1 check to its verdict table, open notebook 03 and submit a job whose widget
reaches COMPLETED; a screenshot of each under out/hub/. Then: files and job folders in the learner's home and
owned by them, no learner can read another's workspace, the shared install unchanged. Skips, saying why, where
the machine cannot host it (not root, no chromium, no hub install). Figures: out/hub/figures.json.

Also the hub's settings: who may log in (a group, admins, a shared password; PAM or a shared password open to
every name stops the hub with one message), its private state folder and pid files, the course kernel, `course`
in a learner's terminal, and the idle culler on its own hub with a 30 s timeout (an idle server culled, one whose
kernel waits on a job not). And a hub on a login node (the site's checks and runs on the local Slurm): a learner's
notebooks 02, 04, 05, 06 and 09, run headless in their server's terminal, send their checks and runs to Slurm as
their own jobs, and no rank of theirs runs beside the hub.
"""
import ast
import json
import os
import pwd
import queue
import re
import stat
import subprocess
import time
from pathlib import Path

import hub_support as hs
import nbformat
import pytest
from browser_lab import chromium, how_it_ended, still
from conftest import ROOT

pytestmark = pytest.mark.slow
# The tests of the module's hub and its learners run one after another on one worker (xdist's loadgroup): a second
# worker's hub would wipe the learners' workspaces. A test with a hub and accounts of its own runs beside them: the
# runs on Slurm (their worker starts its own Slurm) and the culler, each minutes long, off the hub group's path.
ON_THE_HUB = pytest.mark.xdist_group("hub")
ON_SLURM_FROM_A_HUB = pytest.mark.xdist_group("hub_slurm")
OUT = ROOT / "out" / "hub"
DISCONNECTED: list = []   # a line when the module's browser goes away unasked (browser_lab.chromium)
# a bound for one step (a login, a cell's verdict) on a loaded 2-core machine: 165-244 s were measured at load 20;
# a step that takes longer is reported with its evidence (_evidence) instead of waited on for 15 minutes
WAIT_MS = 360_000
# one learner's whole test (login, notebook 02's check, notebook 03's job): every wait ends by then, leaving
# EVIDENCE_S to keep the evidence before pytest-timeout's LEARNER_TIMEOUT_S, which would end the test with none
LEARNER_BUDGET_S = 660
EVIDENCE_S = 120
LEARNER_TIMEOUT_S = LEARNER_BUDGET_S + EVIDENCE_S + 60
FIGURES: dict = {}

_reason = hs.why_not()
if _reason:
    pytest.skip(f"no real hub here: {_reason}", allow_module_level=True)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    for name in hs.LEARNERS:
        hs.fresh_learner(name)
    before = hs.install_digest()
    state = tmp_path_factory.mktemp("hub")
    hub = hs.Hub(state)
    try:
        hub.start({"COURSE_QUICK": "1", "COURSE_ENGINE": "local", "COURSE_SITE": "local"})
        hub.install_before = before
        yield hub
        FIGURES["hub_rss_mb_with_learners"] = _memory(hub)
    finally:
        hub.stop()
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "figures.json").write_text(json.dumps(FIGURES, indent=1, sort_keys=True))
        print("\nhub figures:", json.dumps(FIGURES, sort_keys=True))
    assert hs.install_digest() == before, "the shared install changed while learners worked"


@pytest.fixture(scope="module")
def browser():
    OUT.mkdir(parents=True, exist_ok=True)
    with chromium(OUT / "browser.log", DISCONNECTED) as b:
        yield b


def _memory(hub) -> dict:
    rss = {"hub": 0, "proxy": 0, "servers": 0, "kernels_and_jobs": 0}
    for p in hub.processes():
        try:
            cmd, mb = " ".join(p.cmdline()), p.memory_info().rss / 2**20
        except Exception:   # gone meanwhile
            continue
        key = ("proxy" if "configurable-http-proxy" in cmd else "servers" if "jupyterhub-singleuser" in cmd
               else "hub" if p.pid == hub.proc.pid else "kernels_and_jobs")
        rss[key] += mb
    return {k: round(v) for k, v in rss.items()}


def _evidence(hub, name: str, home: Path, step: str, cell=None) -> None:
    """What a learner's failed step leaves for a reader, in out/hub/NAME-failure.txt (beside the screenshot): the
    step, the machine's load, the cell's output as the learner saw it (a local check's own log: its deadline line,
    then its verdicts), the kernels' states as the server reports them, the learner's processes as the machine sees
    them (the kernel, the check's fork server and ranks: state, CPU seconds, age), the newest logs of the workspace
    (jobs' and Slurm checks') and the hub's log. Every part is bounded in time: the evidence itself never hangs."""
    parts = [f"step that failed: {step}; load average {os.getloadavg()}, {os.cpu_count()} cores",
             f"the browser: {how_it_ended(OUT / 'browser.log')} {DISCONNECTED}"]
    if cell is not None:
        try:
            parts.append("--- the cell's output\n" + cell.locator(".jp-OutputArea").first.inner_text(timeout=10_000))
        except Exception as e:   # noqa: BLE001 - the page may be what failed
            parts.append(f"--- no cell output: {e}")
    try:
        token = hs.user_token(hub, name)
        sessions = hs.server_api(hub, name, "sessions", token)
        for s in sessions:
            k = s["kernel"]
            parts.append(f"kernel of {s['path']}: {k['name']} {k['execution_state']}, last activity "
                         f"{k['last_activity']}")
        if not sessions:
            parts.append("no kernel: the server has no session")
    except Exception as e:   # the server itself may be what failed
        parts.append(f"no kernel states: {e}")
    parts.append("--- the learner's processes\n" + "\n".join(_processes_of(pwd.getpwnam(name).pw_uid)))
    logs = sorted((p for p in (home / "course").glob("**/*.log") if p.is_file()), key=lambda p: p.stat().st_mtime)
    for log in logs[-4:]:
        parts.append(f"--- {log} (last 40 lines)\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
    parts.append(f"--- the hub's log (last 80 lines)\n{hub.log_tail(80)}")
    text = "\n".join(parts)
    (OUT / f"{name}-failure.txt").write_text(text)
    print(text)


def _processes_of(uid: int) -> list[str]:
    """One line per live process of ``uid``: pid, parent, state, CPU seconds, age, command line."""
    import psutil

    now, lines = time.time(), []
    for p in psutil.process_iter(["pid", "ppid", "uids", "status", "cpu_times", "create_time", "cmdline"]):
        info = p.info
        if not info["uids"] or info["uids"].real != uid or info["cpu_times"] is None:
            continue
        cpu = info["cpu_times"].user + info["cpu_times"].system
        lines.append(f"{info['pid']:>7} parent {info['ppid']:>7} {info['status']:<9} cpu {cpu:7.1f} s  "
                     f"age {now - info['create_time']:6.0f} s  {' '.join(info['cmdline'] or [])[:200]}")
    return lines or ["(none)"]


class Budget:
    """A learner test's time: each wait gets WAIT_MS, and never more than what is left of LEARNER_BUDGET_S, so a
    stuck step fails with its evidence well before pytest-timeout would stop the test without any."""

    def __init__(self, seconds: float = LEARNER_BUDGET_S):
        self.start = time.monotonic()
        self.end = self.start + seconds

    def ms(self) -> float:
        return max(1_000.0, min(WAIT_MS, (self.end - time.monotonic()) * 1000))

    def spent(self) -> float:
        return time.monotonic() - self.start


def _run_to(page, marker: str, budget: Budget) -> object:
    """Run every cell above the cell holding ``marker``, then that cell; returns the cell's locator."""
    cell = page.locator(".jp-Notebook .jp-Cell", has_text=marker).first
    _palette(page, cell, "Run All Above Selected Cell", budget)   # _select scrolls the cell into view
    _select(page, cell, budget)
    page.keyboard.press("Shift+Enter")
    return cell


def _select(page, cell, budget: Budget, tries: int = 5) -> None:
    """Click ``cell``'s prompt until JupyterLab has made it the active cell, which "Run All Above Selected Cell" and
    Shift+Enter act on. A click lands where the prompt was when Playwright measured it: a notebook still laying out
    its cells can move another cell there. Once (CI under load), notebook 03's job cell ran as In[2] with the cells
    above it never run ('jobs' is not defined); that a click selected another cell is a likely, not a proven,
    cause. A cell never made active fails here, naming the active one."""
    for _ in range(tries):
        cell.scroll_into_view_if_needed(timeout=budget.ms())
        cell.locator(".jp-InputPrompt").first.click(timeout=budget.ms())
        if cell.evaluate("e => e.classList.contains('jp-mod-active')"):
            return
        page.wait_for_timeout(1_000)   # let the layout settle before the next click
    active = page.locator(".jp-Notebook .jp-Cell.jp-mod-active").first
    raise AssertionError(f"the cell was not made active by {tries} clicks; the active cell starts with "
                         f"{active.inner_text(timeout=10_000)[:120]!r}")


def _palette(page, cell, command: str, budget: Budget, tries: int = 4) -> None:
    """Select ``cell`` and run ``command`` from the command palette. The palette is a modal that closes when it
    loses focus; on a learner's first page load, a late start-up step (kernel, file browser) took the focus once
    between filling the palette and clicking its item, and the click then waited for nothing (CI, 15 minutes). So
    the palette is opened afresh when its item does not show within a minute."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(1, tries + 1):
        try:
            _select(page, cell, budget)   # the cell the command acts on, in command mode
            page.keyboard.press("Control+Shift+C")
            page.locator(".lm-CommandPalette-input").fill(command, timeout=min(60_000, budget.ms()))
            page.locator(".lm-CommandPalette-item", has_text=command).first.click(timeout=min(60_000, budget.ms()))
            return
        except PlaywrightTimeout:
            print(f"command palette, try {attempt} of {tries}: {command!r} did not show; opening it again")
            page.keyboard.press("Escape")
    raise AssertionError(f"the command palette never offered {command!r} in {tries} tries")


def _open(page, notebook: str, budget: Budget, folder: str | None = None):
    """Open ``notebook`` with a double click in the lab's file browser (into ``folder`` first), in a new tab beside
    those open, as a learner opens one: going to its address loaded JupyterLab anew, 3-5 CPU-s of the browser's each
    time (measured). Returns once it is the current tab, its cells shown and its kernel idle. (Not the command
    palette's Open from Path: on the first page, a late start-up step closed it, a minute's retry each time.)"""
    listing = page.locator(".jp-FileBrowser .jp-DirListing-content")
    for name in filter(None, (folder, notebook)):
        listing.locator(f".jp-DirListing-item[title*='{name}']").first.dblclick(timeout=budget.ms())
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current", has_text=notebook).first.wait_for(
        timeout=budget.ms())
    panel = page.locator(".jp-NotebookPanel:visible")   # the current tab's notebook, not one open behind it
    panel.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=budget.ms())
    panel.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(state="attached",
                                                                                        timeout=budget.ms())


# pyproject's 600 s per test is too short for a hub on a loaded 2-core machine; the test's own waits end earlier.
# func_only: the hub's start (the module's fixture, bounded by Hub.start's own 300 s) is not counted in it
@ON_THE_HUB
@pytest.mark.timeout(LEARNER_TIMEOUT_S, func_only=True)
@pytest.mark.parametrize("name", hs.LEARNERS)
def test_learner_logs_in_checks_and_submits(hub, browser, name):
    user = pwd.getpwnam(name)
    home = Path(user.pw_dir)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    still(context)
    page = context.new_page()
    budget, step, cell = Budget(), "log in", None
    page.set_default_timeout(WAIT_MS)
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        hub.add_user(name)
        page.goto(f"{hub.url}/hub/login", timeout=budget.ms())
        page.fill("#username_input", name, timeout=budget.ms())
        page.fill("#password_input", hub.password, timeout=budget.ms())
        t0 = time.monotonic()
        page.click("#login_submit", timeout=budget.ms())
        page.wait_for_url(f"**/user/{name}/lab**", timeout=budget.ms())
        page.locator("#jp-main-dock-panel").wait_for(timeout=budget.ms())
        t_lab = time.monotonic() - t0
        assert (home / "course" / ".course-workspace.json").is_file(), "no workspace made at first login"

        step = "open notebook 02"
        _open(page, "02_ddp_six_steps.ipynb", budget, folder="notebooks")
        step = "run notebook 02 down to the Step 1 check"
        cell = _run_to(page, "steps=[1]", budget)
        step = "the Step 1 check's verdict"
        verdict = cell.locator(".jp-OutputArea-output", has_text="passed in")
        verdict.wait_for(timeout=budget.ms())
        t_verdict = time.monotonic() - t0
        assert "course check ddp" in verdict.inner_text()
        assert str(home / "course" / "exercises") in verdict.inner_text()   # the learner's file, not the install's
        page.screenshot(path=str(OUT / f"{name}-02-step1.png"))
        # the course's lab settings: no "get notified about official Jupyter news?" prompt (shown at start-up)
        assert page.get_by_text("official Jupyter news").count() == 0
        # the notebook names python3; the server offers the course kernel only, and the notebook runs on it
        token = hs.user_token(hub, name)
        specs = hs.server_api(hub, name, "kernelspecs", token)
        assert (specs["default"], [*specs["kernelspecs"]]) == ("multigpu-course", ["multigpu-course"]), specs
        kernels = {s["path"]: s["kernel"]["name"] for s in hs.server_api(hub, name, "sessions", token)}
        assert kernels.get("notebooks/02_ddp_six_steps.ipynb") == "multigpu-course", kernels

        step, cell = "open notebook 03", None
        _open(page, "03_launching_jobs.ipynb", budget)
        step = "run notebook 03 down to the job's submission"
        cell = _run_to(page, "job = jobs.submit(spec, ENGINE_NAME)", budget)
        step = "the job's COMPLETED"
        cell.locator(".jp-OutputArea-output", has_text="COMPLETED").first.wait_for(timeout=budget.ms())
        cell.locator(".progress-bar-success, .widget-progress .progress-bar-success").first.wait_for(
            state="attached", timeout=budget.ms())
        page.screenshot(path=str(OUT / f"{name}-03-job.png"))
        FIGURES[name] = {"login_to_lab_s": round(t_lab, 1), "login_to_first_verdict_s": round(t_verdict, 1)}
    except Exception:
        print(f"\n{name}: '{step}' failed {budget.spent():.0f} s into the test")
        try:
            page.screenshot(path=str(OUT / f"{name}-failure.png"), timeout=30_000)
        except Exception as e:   # noqa: BLE001 - the rest of the evidence still counts
            print(f"no screenshot: {e}")
        _evidence(hub, name, home, step, cell)
        raise
    finally:
        context.close()

    # everything the learner made is in their home, owned by them; the run folder is theirs too
    ws = home / "course"
    runs = [p for p in (ws / "jobs" / "runs").glob("ddp-srun-*") if (p / "job.json").is_file()]
    assert runs, f"no run folder in {ws / 'jobs' / 'runs'}"
    for path in [ws, ws / "exercises", ws / "jobs" / "runs", *runs, *(runs[0].iterdir())]:
        assert path.stat().st_uid == user.pw_uid, f"{path} is not owned by {name}"
    assert json.loads((runs[0] / "job.json").read_text())["state"] == "COMPLETED"


@ON_THE_HUB
def test_learners_cannot_read_each_other(hub):
    a, b = hs.LEARNERS[:2]
    for name in (a, b):   # made at their first login by the browser test; made here where that did not run
        if not (Path(pwd.getpwnam(name).pw_dir) / "course").is_dir():
            made = hs.as_user(name, f"{hs.HUB_PREFIX}/venv/bin/course init ~/course")
            assert made.returncode == 0, made.stderr
    theirs = Path(pwd.getpwnam(b).pw_dir) / "course" / "exercises" / "05_allreduce" / "allreduce.py"
    r = hs.as_user(a, f"cat {theirs}")
    assert r.returncode != 0 and "Permission denied" in r.stderr, (r.returncode, r.stdout[:200], r.stderr)
    own = Path(pwd.getpwnam(a).pw_dir) / "course" / "exercises" / "05_allreduce" / "allreduce.py"
    assert hs.as_user(a, f"cat {own}").returncode == 0
    # nor write into the shared install
    r = hs.as_user(a, f"touch {hs.HUB_PREFIX / 'course' / 'exercises' / 'x'}")
    assert r.returncode != 0 and "Permission denied" in r.stderr


def _as_learner(name: str, code: str, env: dict) -> subprocess.CompletedProcess:
    """``code`` run by the shared install's Python as ``name`` in their workspace's notebooks/ (like a kernel)."""
    exports = " ".join(f"{k}={v}" for k, v in env.items())
    cmd = f"cd ~/course/notebooks && env -i HOME=$HOME PATH={hs.HUB_PREFIX}/venv/bin:/usr/bin:/bin {exports} " \
          f"{hs.HUB_PREFIX}/venv/bin/python -"
    return subprocess.run(["su", "-s", "/bin/sh", name, "-c", cmd], input=code, capture_output=True, text=True,
                          timeout=600)


@ON_SLURM_FROM_A_HUB
@pytest.mark.slurm
def test_learner_jobs_reach_slurm_as_the_learner(slurm_cluster):
    """A learner's kernel submits to the local Slurm: the job is the learner's (squeue/sacct user column), runs
    as them, and a second process (the kernel after a restart) lists and attaches to it."""
    name = hs.SLURM_LEARNER
    user = hs.fresh_learner(name)
    slurm_cluster.dir.chmod(0o755)   # learners' clients read slurm.conf (the munge key stays 0600)
    assert hs.as_user(name, f"{hs.HUB_PREFIX}/venv/bin/course init ~/course").returncode == 0
    env = {"SLURM_CONF": slurm_cluster.conf, "COURSE_ENGINE": "slurm", "COURSE_SITE": "local"}
    r = _as_learner(name, """
from pathlib import Path
from course_lib import jobs
script = Path("../whoami.py").resolve()
script.write_text("import getpass, time\\nprint('running as', getpass.getuser(), flush=True)\\ntime.sleep(4)\\n")
job = jobs.submit(jobs.JobSpec("whoami", str(script), launcher="python"))
print("JOB", job.id, job.run_dir)
""", env)
    assert r.returncode == 0, r.stderr[-2000:]
    job_id, run_dir = r.stdout.split("JOB ")[1].split()
    assert run_dir.startswith(f"{user.pw_dir}/course/jobs/runs/")

    q = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%u"], capture_output=True, text=True,
                       env=dict(os.environ, SLURM_CONF=str(slurm_cluster.conf)), timeout=60)
    assert q.stdout.split() == [name], (q.stdout, q.stderr)
    r = _as_learner(name, f"""
from course_lib import jobs
print("LISTED", [j.id for j in jobs.list() if not isinstance(j, tuple)])
job = jobs.attach({job_id!r}).wait(timeout=300, progress=False)
print("STATE", job.state)
print(job.log())
""", env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"'{job_id}'" in r.stdout.split("LISTED", 1)[1].splitlines()[0]
    assert "STATE COMPLETED" in r.stdout and f"running as {name}" in r.stdout, r.stdout[-2000:]
    for path in (Path(run_dir), Path(run_dir) / "output.log"):
        assert path.stat().st_uid == user.pw_uid, f"{path} is not owned by {name}"


# a hub on a login node: every check and multi-rank run of a learner goes to Slurm as a short job
ON_SLURM = {"COURSE_QUICK": "1", "COURSE_ENGINE": "slurm", "COURSE_SITE": "local", "COURSE_CHECKS": "slurm",
            "COURSE_RUNS": "slurm"}
# one notebook's run from the terminal; the test's own limit leaves room for all of them on a loaded machine
NOTEBOOK_TIMEOUT_S = 480
ON_SLURM_TIMEOUT_S = 1800


@ON_SLURM_FROM_A_HUB
@pytest.mark.slurm
@pytest.mark.timeout(ON_SLURM_TIMEOUT_S)
def test_notebook_runs_go_to_slurm_as_the_learners_jobs(slurm_cluster, tmp_path):
    """A hub with the site's checks and runs on Slurm (COURSE_CHECKS/COURSE_RUNS, passed on to every server): a
    learner who has done the exercises runs notebooks 02, 04, 05, 06 and 09 headless (papermill in a terminal of
    their server, in their workspace). Each succeeds as against the solutions; sacct has every job as the learner's;
    while each ran, every rank of the learner ran under a slurmstepd, no other Python process of theirs ran beside
    the hub, and the watch saw the ranks (so it would have seen one here). The output notebooks go to out/hub/."""
    name = hs.RUNS_LEARNER
    user = hs.fresh_learner(name)
    home = Path(user.pw_dir)
    slurm_cluster.dir.chmod(0o755)   # learners' clients read slurm.conf (the munge key stays 0600)
    hub = hs.Hub(tmp_path)
    t0 = time.monotonic()
    runs = {}
    try:
        hub.start({**ON_SLURM, "SLURM_CONF": str(slurm_cluster.conf)})
        hub.add_user(name)
        hub.api("POST", f"/users/{name}/server")
        hs.wait_for_server(hub, name, want_ready=True)
        t_server = time.monotonic() - t0
        assert (home / "course" / ".course-workspace.json").is_file(), "no workspace made when the server started"
        for folder in sorted({f for nb in hs.ON_SLURM_NOTEBOOKS.values() for f in nb.folders}):
            solved = hs.as_user(name, f"cp -r {hs.HUB_PREFIX}/course/solutions/{folder}/. ~/course/exercises/{folder}/")
            assert solved.returncode == 0, solved.stderr
        token = hs.user_token(hub, name)
        for stem, nb in hs.ON_SLURM_NOTEBOOKS.items():
            runs[stem] = _run_headless(hub, name, user.pw_uid, token, stem, nb.marker)
            if runs[stem]["said"] is None:   # out of time: its kernel may still run; the rest would wait behind it
                break
    finally:
        hub.stop()
        hs.clean_up_learner(slurm_cluster, name, user.pw_uid)
    problems = [p for stem, run in runs.items() for p in _judged(stem, run, home)]
    problems += _jobs_not_the_learners(slurm_cluster, home, name, user.pw_uid)
    missing = [stem for stem in hs.ON_SLURM_NOTEBOOKS if stem not in runs]
    assert not missing, f"not run (an earlier notebook ran out of time): {missing}; " + "; ".join(problems)
    assert not problems, "\n".join(problems)
    print(f"\n[hub, runs on Slurm] hub + {name}'s server {t_server:.0f} s; " + "; ".join(
        f"{stem[:2]} {run['seconds']:.0f} s, {len(run['watch'].in_slurm)} ranks in jobs, none here "
        f"({run['watch'].looks} looks)" for stem, run in runs.items()))


def _run_headless(hub, name: str, uid: int, token: str, stem: str, marker: str) -> dict:
    """Notebook ``stem`` run by papermill in a new terminal of the learner's server, with its ranks watched: what the
    terminal printed (None when it did not end in time), the watch, the seconds it took. A terminal of its own: one
    reused would replay the last notebook's end marker to the next."""
    term = hs.server_api(hub, name, "terminals", token, "POST")
    command = (f"cd ~/course/notebooks && {hs.HUB_PREFIX}/venv/bin/papermill {stem}.ipynb {stem}-on-slurm.ipynb "
               f"-k multigpu-course -p STRICT True -p ANSWERS key --no-progress-bar 2>&1 | tee {stem}-papermill.log "
               "| tail -n 20; "
               "echo PAPERMILL=${PIPESTATUS[0]}")
    t0 = time.monotonic()
    with hs.RankWatch(uid, marker) as watch:
        try:
            said = _terminal_says(f"ws://127.0.0.1:{hub.port}/user/{name}/terminals/websocket/{term['name']}",
                                  token, command, timeout=NOTEBOOK_TIMEOUT_S)
        except TimeoutError:
            said = None
    return {"said": said, "watch": watch, "seconds": time.monotonic() - t0}


def _kernel_lines(log: Path) -> str:
    """The lines of papermill's log that are not papermill's or nbclient's own traceback: why a kernel died before
    it replied is printed by the kernel itself, above papermill's RuntimeError."""
    if not log.is_file():
        return "(no log)"
    lines = log.read_text(errors="replace").splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("Traceback") and "papermill" in
                "".join(lines[i:i + 4])), len(lines))
    return "\n".join(lines[max(0, end - 40):end]) or "(none)"


def _judged(stem: str, run: dict, home: Path) -> list[str]:
    """What is wrong with one notebook's run on Slurm: its papermill, what it showed (test_notebooks' solutions
    run, and this test's own strings), the ranks the watch saw. Its output notebook is kept in out/hub/."""
    from test_jobs_notebooks import text_of
    from test_notebooks import assert_solutions_run, load, unreadable_reveals

    said, watch = run["said"], run["watch"]
    out = home / "course" / "notebooks" / f"{stem}-on-slurm.ipynb"
    log = out.with_name(f"{stem}-papermill.log")   # all papermill printed, with the kernel's own stderr
    OUT.mkdir(parents=True, exist_ok=True)
    for kept in (out, log):
        if kept.is_file():   # as far as it ran: papermill writes the notebook after each cell
            (OUT / kept.name).write_bytes(kept.read_bytes())
    if said is None:
        return [f"{stem}: papermill did not end within {NOTEBOOK_TIMEOUT_S} s (out/hub/{out.name}, out/hub/{log.name})"]
    if "PAPERMILL=0" not in said:
        return [f"{stem}: papermill failed (out/hub/{out.name}, out/hub/{log.name}): {said[-3000:]}"
                f"\nthe kernel's own lines: {_kernel_lines(log)}"]
    text = text_of(nbformat.read(out, as_version=4))
    problems = []
    try:
        assert_solutions_run(stem, text, "from the hub, on Slurm")
    except AssertionError as e:
        problems.append(str(e))
    nb = hs.ON_SLURM_NOTEBOOKS[stem]
    problems += [f"{stem} does not show {s!r}" for s in nb.shows if s not in text]
    problems += [f"{stem} shows {r}" for r in unreadable_reveals(load(out)["cells"])]
    if watch.outside:
        problems.append(f"{stem}: ranks ran on the hub's node: {watch.outside}")
    if watch.strays:
        problems.append(f"{stem}: other Python processes of the learner ran on the hub's node: {watch.strays}")
    if len(watch.in_slurm) < nb.ranks:
        problems.append(f"{stem}: the watch saw {len(watch.in_slurm)} ranks in jobs (at least {nb.ranks} run) in "
                        f"{watch.looks} looks: {watch.in_slurm}")
    return problems


def _jobs_not_the_learners(cluster, home: Path, name: str, uid: int) -> list[str]:
    """Every job folder the notebooks made in the learner's workspace (runs, checks, the study's jobs) that is not
    in Slurm's record as the learner's, COMPLETED; and no run-* folder at all is a problem too."""
    folders = [f.name for f in (home / "course" / "jobs" / "runs").iterdir() if re.search(r"-\d+$", f.name)]
    if not any(f.startswith("run-") for f in folders):
        return [f"no run-* job folder in the learner's workspace: {folders}"]
    ids = {f.rsplit("-", 1)[1]: f for f in folders}
    done = subprocess.run(["sacct", "-c", "-n", "-P", "-o", "JobID,JobName,User,State", "-j", ",".join(ids)],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, SLURM_CONF=str(cluster.conf))).stdout
    # the job-completion log names the user as NAME(UID)
    rows = {line.split("|")[0]: line.split("|")[2:] for line in done.splitlines()}
    return [f"job {ids[i]}: sacct says {rows.get(i)}" for i in ids if rows.get(i) != [f"{name}({uid})", "COMPLETED"]]


@ON_THE_HUB
def test_hub_state_is_private_and_holds_its_pid_files(hub):
    """The database, cookie secret and both pid files in the hub's own folder (0700), none where it started."""
    state = Path(hub.env({})["COURSE_HUB_DIR"])
    assert stat.S_IMODE(state.stat().st_mode) == 0o700, oct(state.stat().st_mode)
    for name in ("jupyterhub.sqlite", "jupyterhub_cookie_secret", "jupyterhub.pid", "jupyterhub-proxy.pid"):
        assert (state / name).is_file(), f"no {name} in {state}: {sorted(p.name for p in state.iterdir())}"
    assert [p.name for p in hub.cwd.iterdir()] == [], "the hub wrote into the folder it was started in"


@ON_THE_HUB
def test_hub_refuses_to_let_every_account_in(tmp_path):
    """PAM or a shared password with no group and no explicit opt-in: the hub stops with one message; a group
    and its admins are what the authenticator is given; the state folder by default is the install's own, 0700.
    One interpreter loads the config once per case (importing JupyterHub takes seconds)."""
    hs.fresh_learner(hs.LEARNERS[0], wipe=False)
    env = hs.Hub(tmp_path).env({"COURSE_HUB_GROUP": ""})
    refused = [({"COURSE_HUB_AUTH": "pam"},
                "with PAM every account of this machine could log in: set COURSE_HUB_GROUP=<a Unix group"),
               ({"COURSE_HUB_AUTH": "shared"}, "with a shared password anyone who has it could log in under any name"),
               ({"COURSE_HUB_AUTH": "shared", "COURSE_HUB_GROUP": "no-such-group-here"},
                "COURSE_HUB_GROUP=no-such-group-here: no such group on this machine"),
               ({"COURSE_HUB_AUTH": "shared", "COURSE_HUB_PASSWORD": ""},
                "COURSE_HUB_AUTH=shared needs COURSE_HUB_PASSWORD")]
    allowed = [{"COURSE_HUB_AUTH": "pam", "COURSE_HUB_GROUP": hs.GROUP, "COURSE_HUB_ADMINS": "teacher1, teacher2"},
               {"COURSE_HUB_AUTH": "shared", "COURSE_HUB_GROUP": hs.GROUP, "COURSE_HUB_ADMINS": "teacher1",
                "COURSE_HUB_ADMIN_PASSWORD": "a" * 32},
               {"COURSE_HUB_AUTH": "pam", "COURSE_HUB_ALLOW_ALL": "1", "COURSE_HUB_DIR": ""}]
    show = ("(dict.get(cfg.LocalAuthenticator, 'allowed_groups'), sorted(cfg.Authenticator.admin_users), "
            "dict.get(cfg.Authenticator, 'allow_all'), dict.get(cfg.JupyterHub, 'authenticator_class'), "
            "sorted(dict.get(cfg.Authenticator, 'allowed_users', [])), "
            "dict.get(cfg.SharedPasswordAuthenticator, 'admin_password'), cfg.JupyterHub.db_url, "
            "cfg.ConfigurableHTTPProxy.pid_file)")
    shown = hs.load_configs(env, [case for case, _ in refused] + allowed, show)
    for (case, says), got in zip(refused, shown):
        assert got.startswith(f"SystemExit: [course hub] {says}"), (case, got)
    pam, shared, everyone = [ast.literal_eval(text) for text in shown[len(refused):]]
    assert pam[:4] == ({hs.GROUP}, ["teacher1", "teacher2"], None, None), pam
    assert shared[2:4] == (None, "shared-password") and shared[5] == "a" * 32, shared
    assert hs.LEARNERS[0] in shared[4] and "teacher1" not in shared[4], shared
    assert everyone[2] is True, everyone
    # the state folder by default: one per install, under /var/lib, private
    state = Path("/var/lib/multigpu-course-hub") / str(hs.HUB_PREFIX).strip("/").replace("/", "-")
    assert everyone[6:] == (f"sqlite:///{state}/jupyterhub.sqlite", f"{state}/jupyterhub-proxy.pid"), everyone
    assert stat.S_IMODE(state.stat().st_mode) == 0o700, oct(state.stat().st_mode)


@ON_THE_HUB
def test_hub_refuses_a_name_outside_the_group(hub, browser):
    """The shared password with a name that is no member of the hub's group: the login page again, no server."""
    page = browser.new_page()
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        page.goto(f"{hub.url}/hub/login")
        page.fill("#username_input", "nosuchlearner")
        page.fill("#password_input", hub.password)
        page.click("#login_submit")
        page.locator("#login_submit").wait_for(timeout=60_000)
        assert "/hub/login" in page.url
        page.get_by_text("Invalid username or password").wait_for(timeout=30_000)
    except Exception:
        page.screenshot(path=str(OUT / "refused-login-failure.png"))
        raise
    finally:
        page.close()
    assert all(u["name"] != "nosuchlearner" for u in hub.api("GET", "/users"))


@ON_THE_HUB
def test_activity_sees_a_live_job_and_a_course_command(tmp_path):
    """The extension's looks, on a real local job and a real process run as ``course``: live while they run,
    not after."""
    import sys

    from course_lib import jobs
    from course_lib.instructor import activity

    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "course").write_text("import time\ntime.sleep(60)\n")   # what `course check` is to ps
    job = jobs.submit(jobs.JobSpec("sleeper", str(tmp_path / "sleeper.py"), launcher="python"), "local", "local",
                      tmp_path / "runs")
    command = subprocess.Popen([sys.executable, str(tmp_path / "course")])
    try:
        # the local runner writes the job's folder as it starts: on a busy machine that is a moment after submit()
        # returns (CI: [] at the first look); the extension looks again every minute, so the test may wait too
        deadline, seen = time.monotonic() + 30, []
        while time.monotonic() < deadline and (seen := activity.live_jobs(tmp_path / "runs")) != [job.id]:
            time.sleep(0.2)
        assert seen == [job.id], f"after 30 s the job {job.id} ({job.state}) is not seen: {seen}"
        assert activity.course_commands(os.getpid()) == [f"{sys.executable} {tmp_path / 'course'}"]
    finally:
        job.cancel()
        command.kill()
        command.wait(30)
    assert job.state in jobs.TERMINAL and activity.live_jobs(tmp_path / "runs") == []
    assert activity.course_commands(os.getpid()) == []


CULL = {"COURSE_HUB_CULL_TIMEOUT": "30", "COURSE_HUB_CULL_EVERY": "5", "COURSE_HUB_ACTIVITY_INTERVAL": "4",
        "COURSE_QUICK": "1", "COURSE_ENGINE": "local", "COURSE_SITE": "local"}
JOB_S = 75   # the job outlasts the idle server's cull (30 s idle + a cull pass) by a wide margin
WAITER = """
from pathlib import Path
from course_lib import jobs
script = Path("sleeper.py").resolve()
script.write_text("import time\\nprint('asleep', flush=True)\\ntime.sleep({s})\\nprint('awake', flush=True)\\n")
job = jobs.submit(jobs.JobSpec("sleeper", str(script), launcher="python"))
print("JOB", job.id, flush=True)
job.wait(progress=False)   # silent: no output reaches the server until the job ends
print("DONE", job.state)
"""


def _kernel_runs(hub, name: str, token: str, home: Path, kernel_id: str, code: str):
    """Send ``code`` to the learner's kernel (its connection file, read as root) and return the client; the first
    stream line it prints comes back with it."""
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=str(home / ".local/share/jupyter/runtime" /
                                                      f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    client.start_channels()
    _wait_until_it_answers(client, lambda: hs.server_api(hub, name, f"kernels/{kernel_id}", token))
    client.execute(code)
    end = time.monotonic() + 120
    while True:
        msg = client.get_iopub_msg(timeout=max(1.0, end - time.monotonic()))   # queue.Empty past the end
        if msg["msg_type"] == "stream":
            return client, msg["content"]["text"]
        if msg["msg_type"] == "error":
            raise AssertionError("\n".join(msg["content"]["traceback"]))


def _wait_until_it_answers(client, server_view, seconds: float = 120) -> None:
    """kernel_info until the kernel replies and its IOPub reaches us. Not ``client.wait_for_ready``: that calls a
    kernel dead when one heartbeat comes back later than 1 s (jupyter_client's HBChannel ``time_to_dead``), which a
    live kernel can do on a loaded machine (a likely cause, not proven, of "Kernel died before replying to
    kernel_info" in a CI run under load 16-27). Whether the kernel lives is its server's word (``server_view()``:
    its model in the server's kernels API)."""
    end = time.monotonic() + seconds
    while True:
        client.kernel_info()
        try:
            client.get_shell_msg(timeout=5)
            client.get_iopub_msg(timeout=5)   # its busy/idle status: our IOPub subscription is live
            return
        except queue.Empty:
            model = server_view()
            assert model.get("execution_state") != "dead" and time.monotonic() < end, (
                f"the learner's kernel did not answer kernel_info within {seconds:.0f} s; its server says: {model}")


# Mostly waiting (a 2-minute job, the culler's passes): on the worker of the two-node tests, which mostly wait too,
# one after the other. Handed out alone it ran beside them and a core stood idle for some 100 s (ciC, /proc/stat
# sampled every 10 s: 80 idle core-s from 154 to 264 s into the run).
@pytest.mark.xdist_group("slurm-two-nodes")
@pytest.mark.timeout(600)
def test_culler_stops_idle_servers_not_one_waiting_on_a_job(tmp_path):
    """jupyterhub-idle-culler with a 30 s timeout: an idle server is culled; a server whose kernel waits, silent,
    on a job is not, until the job has ended; after that cull the learner's job is found again (jobs.attach)."""
    idle, waiting = hs.CULL_LEARNERS
    home = Path(hs.fresh_learner(waiting).pw_dir)
    hs.fresh_learner(idle)
    hub = hs.Hub(tmp_path)
    client = None
    try:
        hub.start(CULL)
        for name in (idle, waiting):
            hub.add_user(name)
            hub.api("POST", f"/users/{name}/server")
        for name in (idle, waiting):
            hs.wait_for_server(hub, name, want_ready=True)
        token = hs.user_token(hub, waiting)
        # a notebook's kernel (a session: it runs in notebooks/, like a notebook opened in JupyterLab)
        session = hs.server_api(hub, waiting, "sessions", token, "POST", {
            "path": "notebooks/waiting.ipynb", "type": "notebook", "name": "", "kernel": {"name": "multigpu-course"}})
        client, first = _kernel_runs(hub, waiting, token, home, session["kernel"]["id"], WAITER.format(s=JOB_S))
        job_id = first.split("JOB ")[1].split()[0]
        job_ends = time.monotonic() + JOB_S
        idle_gone = None
        while time.monotonic() < job_ends - 5:      # the waiting server lives on; the idle one goes
            assert hub.api("GET", f"/users/{waiting}")["servers"].get(""), \
                f"{waiting}'s server was culled while its kernel waited on job {job_id}:\n{hub.log_tail(60)}"
            if idle_gone is None and not hub.api("GET", f"/users/{idle}")["servers"]:
                idle_gone = time.monotonic()
            time.sleep(2)
        assert idle_gone is not None, f"{idle}'s idle server was never culled:\n{hub.log_tail(60)}"
        # the job ends, the kernel turns idle: now that server is culled too, within the timeout and two passes
        deadline = job_ends + 30 + 60
        while hub.api("GET", f"/users/{waiting}")["servers"] and time.monotonic() < deadline:
            time.sleep(2)
        assert not hub.api("GET", f"/users/{waiting}")["servers"], \
            f"{waiting}'s server outlived its job by 90 s:\n{hub.log_tail(60)}"
        culled_after = time.monotonic() - job_ends
    finally:
        if client is not None:
            client.stop_channels()
        hub.stop()
    r = _as_learner(waiting, f"""
from course_lib import jobs
job = jobs.attach({job_id!r})
print("STATE", job.state)
print(job.log())
""", {"COURSE_ENGINE": "local"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "STATE COMPLETED" in r.stdout and "awake" in r.stdout, r.stdout[-2000:]
    culls = [line for line in hub.log.read_text().splitlines() if "Culling server" in line]
    print(f"\n[culler] idle server culled; the waiting one {culled_after:.0f} s after its job ended: {culls}")


def _terminal_says(url: str, token: str, command: str, timeout: float = 120) -> str:
    """Type ``command`` into a JupyterLab terminal (terminado's websocket) and return what it printed up to the
    end marker the command is followed by."""
    import asyncio

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    async def talk() -> str:
        ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
        await ws.write_message(json.dumps(["stdin", f"{command}; echo END-$((6*7))\r"]))
        seen = ""
        while "END-42" not in seen:
            msg = await ws.read_message()
            if msg is None:
                break
            kind, *text = json.loads(msg)
            seen += "".join(text) if kind == "stdout" else ""
        ws.close()
        return seen

    # a thread of its own: a Playwright test before this one in the same worker leaves an event loop running in
    # this thread, where asyncio.run() refuses to start ("cannot be called from a running event loop")
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(asyncio.wait_for(talk(), timeout))).result(timeout + 30)


@ON_THE_HUB
def test_terminal_finds_course(hub):
    """A learner's JupyterLab terminal (a login shell, whose /etc/profile sets PATH afresh) finds `course` of the
    shared install: the terminals start from the bashrc that `make lab` gives its own (course write lab-settings)."""
    name = hs.LEARNERS[-1]
    hs.fresh_learner(name, wipe=False)
    hub.add_user(name)
    if not hub.api("GET", f"/users/{name}")["servers"]:
        hub.api("POST", f"/users/{name}/server")
    hs.wait_for_server(hub, name, want_ready=True)
    token = hs.user_token(hub, name)
    term = hs.server_api(hub, name, "terminals", token, "POST")
    try:
        said = _terminal_says(f"ws://127.0.0.1:{hub.port}/user/{name}/terminals/websocket/{term['name']}", token,
                              "command -v course; echo PATH=$PATH; echo WAIT=$OMP_WAIT_POLICY; echo HERE=$PWD; "
                              "course update")
    finally:
        hs.server_api(hub, name, f"terminals/{term['name']}", token, "DELETE")
    assert f"{hs.HUB_PREFIX}/venv/bin/course" in said, said[-2000:]
    # it opens in the learner's course folder, where the course's `course check ... exercises/...` lines work, and
    # `course update` there updates it (issue 55: it opened in ~ and was told to init the install)
    home = Path(pwd.getpwnam(name).pw_dir)
    assert f"HERE={home / 'course'}" in said and f"updating {home / 'course'}" in said, said[-2000:]
    # set for the hub (here by conftest), so for the learners' servers and what they start (env_keep)
    assert f"WAIT={os.environ['OMP_WAIT_POLICY']}" in said, said[-2000:]
