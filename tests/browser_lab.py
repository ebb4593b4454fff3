"""``make lab`` in a fresh clone, driven in Debian's chromium by Playwright: what tests/test_lab.py and the learner
runs of tests/test_browser_learner.py share.

A learner's way through a notebook (``walk``): Shift+Enter on every cell from the top, each waited for, and every
question widget a cell shows answered with a click and committed before the next cell runs.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from conftest import ROOT

CHROMIUM = Path(os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium"))
WAIT_MS = 240_000      # one step on a loaded 2-core machine; progress is what the test waits on
UI_MS = 60_000         # a click's effect on the screen, on the same machine
# CSS animations run to their end at once: the editor's blinking cursor and the busy indicators repainted an open lab
# page several times a second, CPU of the renderer's that no assertion looks at (measured beside each other in one
# lab: a busy kernel's 20 s 1.6 -> 1.0 CPU-s, 15 idle s 0.8 -> 0.4). Each still ends, so code that waits for an
# animation's end still sees it; transitions are left as they are.
STILL = "*, *::before, *::after { animation-duration: 0s !important; animation-delay: 0s !important; " \
        "animation-iteration-count: 1 !important; }"


def why_no_browser() -> str | None:
    """Why Playwright cannot drive Debian's Chromium here, or None."""
    if not CHROMIUM.exists():
        return f"no {CHROMIUM} (Debian's chromium; scripts/system-deps.sh installs it as root)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "no playwright (pip install -e '.[test]')"
    return None


def why_no_browser_test() -> str | None:
    if why := why_no_browser():
        return why
    if not (ROOT / ".venv" / ".installed").is_file():
        return "no .venv built by make here (make venv)"
    if not shutil.which("git") or not shutil.which("make"):
        return "no git or make"
    return None


def failed_loads(page, seen: list) -> None:
    """Every request of ``page`` that failed, and every page, script or stylesheet that got an HTTP error, goes into
    ``seen`` as it happens: an unstyled lab behind an "Error Loading Theme" dialog (once in CI) says only that a
    stylesheet did not load, not why. (The lab's API answers 404 to some questions as a matter of course, and
    leaving a page aborts its requests.)"""
    page.on("requestfailed", lambda r: "ERR_ABORTED" not in (r.failure or "")     # not a page left on purpose
            and seen.append(f"request failed: {r.method} {r.url}: {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and r.request.resource_type in ("document", "script", "stylesheet")
            and seen.append(f"HTTP {r.status} for {r.request.method} {r.url}"))


def still(target) -> None:
    """Every page of ``target`` (a Playwright page or browser context) gets STILL as it loads."""
    target.add_init_script("document.addEventListener('DOMContentLoaded', () => { const s = "
                           f"document.createElement('style'); s.textContent = {json.dumps(STILL)}; "
                           "document.head.appendChild(s); });")


@contextlib.contextmanager
def chromium(log: Path, seen: list):
    """Debian's Chromium through Playwright, yielding the browser. Playwright's log of the browser
    (``DEBUG=pw:browser``: Chromium's own output and how its process ended) goes to ``log``, because a "Target page,
    context or browser has been closed" error says only that the browser is gone (``how_it_ended`` says how);
    ``seen`` gets a line with the machine's state at the moment the browser disconnects unasked."""
    from playwright.sync_api import sync_playwright

    before, os.environ["DEBUG"] = os.environ.get("DEBUG"), "pw:browser"   # read once, by the driver as it starts
    try:
        with log.open("w") as f, contextlib.redirect_stderr(f):   # the driver's stderr: sys.stderr's file
            driver = sync_playwright().start()
    finally:
        os.environ.pop("DEBUG") if before is None else os.environ.update(DEBUG=before)
    closing = []
    try:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        browser.on("disconnected", lambda _: closing or seen.append(f"the browser disconnected: {machine()}"))
        try:
            yield browser
        finally:
            closing.append(True)
            browser.close()
    finally:
        driver.stop()


def how_it_ended(log: Path) -> str:
    """From ``chromium``'s log: how each Chromium process Playwright started ended, how often its GPU process (the
    compositor, and WebGL such as the lab terminal's) died or hung, and Chromium's last fatal lines. Debian's
    Chromium here ended itself with SIGABRT ("GPU process isn't usable. Goodbye.") at the sixth GPU process killed."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    ended = [ln.split("pw:browser ", 1)[-1] for ln in lines if "<process did exit" in ln]
    gpu = [ln.rsplit("] ", 1)[-1] for ln in lines if "GPU process exited unexpectedly" in ln or "gpu_watchdog" in ln]
    fatal = [ln.rsplit("] ", 1)[-1][:300] for ln in lines if ":FATAL:" in ln or "Check failed" in ln]
    said = ended + ([f"{len(gpu)} GPU process ends or hangs, the last: {gpu[-1]}"] if gpu else []) + fatal[-2:]
    return "; ".join(said) or "the browser's process was still running"


def machine() -> str:
    """The load, free memory and free space where Chromium keeps its files, for a line of evidence."""
    import psutil

    free = {d: shutil.disk_usage(d).free >> 20 for d in ("/tmp", "/dev/shm") if os.path.isdir(d)}
    return (f"load {os.getloadavg()[0]:.1f}, {psutil.virtual_memory().available >> 20} MB memory available, "
            + ", ".join(f"{mb} MB free in {d}" for d, mb in free.items()))


def fresh_clone(where: Path) -> Path:
    """This checkout's HEAD, cloned, with the venv this checkout built (linked, not rebuilt: make sees it is up
    to date because the clone's pyproject.toml is given the age of this one)."""
    clone = where / "course"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(clone)], check=True, timeout=120)
    subprocess.run(["git", "checkout", "--quiet", head.stdout.strip()], cwd=clone, check=True, timeout=120)
    (clone / ".venv").symlink_to((ROOT / ".venv").resolve())
    stamp = (ROOT / ".venv" / ".installed").stat().st_mtime
    os.utime(clone / "pyproject.toml", (stamp - 1, stamp - 1))
    return clone


class Lab:
    """``make lab`` in ``clone`` on a free loopback port with a known token; ``stop`` ends its process group."""

    def __init__(self, clone: Path, log: Path):
        from course_lib.runtime.launch import free_port

        self.clone, self.log_path = clone, log
        self.port, self.token = free_port(), secrets.token_hex(16)
        # the venv is this checkout's (its editable install points here): PYTHONPATH makes the clone's course_lib win
        env = dict(os.environ, PYTHONPATH=str(clone), COURSE_QUICK="1", COURSE_ENGINE="local")
        for name in ("COURSE_WORKSPACE", "COURSE_OUT_DIR", "COURSE_RUNS_DIR", "COURSE_HOME"):
            env.pop(name, None)
        self.proc = subprocess.Popen(
            ["make", "lab", f"LAB_ARGS=--port={self.port} --IdentityProvider.token={self.token}"], cwd=clone, env=env,
            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.base = f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180) -> str:
        """The address JupyterLab printed (with the token elided), once it serves."""
        deadline, wanted = time.monotonic() + timeout, re.compile(rf"http://127\.0\.0\.1:{self.port}(/\S*)")
        while time.monotonic() < deadline:
            found = wanted.search(self.log())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError(f"make lab printed no address in {timeout} s (exit {self.proc.poll()}):\n"
                             + self.log()[-3000:])

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        import urllib.request

        req = urllib.request.Request(f"{self.base}{path}", method=method, data=json.dumps(body or {}).encode(),
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"{}")

    def end_kernels(self) -> None:
        """Shut down every notebook's kernel (as File > Close and Shut Down Notebook would)."""
        for session in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{session['id']}")

    def stop(self, grace: float = 60) -> list[str]:
        """Stop the lab as Ctrl-C where make runs would (SIGTERM to make and jupyter, whose shutdown ends its kernels
        and terminals, each in a session of its own); returns what had not ended after ``grace`` seconds, which
        is then killed."""
        import psutil

        try:
            started = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            started = []
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(started, timeout=grace)
        left = []
        for p in alive:
            try:
                left.append(f"{p.pid}: {' '.join(p.cmdline())[:160]}")
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(timeout=30)
        return left


def run_to(page, marker: str):
    """Run every cell above the cell holding ``marker``, then that cell (as tests/test_hub.py does)."""
    cell = page.locator(".jp-Notebook .jp-Cell", has_text=marker).first
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Control+Shift+C")
    page.locator(".lm-CommandPalette-input").fill("Run All Above Selected Cell")
    page.locator(".lm-CommandPalette-item", has_text="Run All Above Selected Cell").first.click()
    cell.locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Shift+Enter")
    return cell


# ------------------------------------------------------------------------------------------- a learner's run
NOTEBOOK = ".jp-NotebookPanel:visible"


def open_notebook(page, lab: Lab, stem: str) -> dict:
    """Open notebooks/STEM.ipynb alone (a fresh workspace: no tab of an earlier notebook), wait for its kernel;
    returns what a learner sees before running anything: {"dirty", "trust", "shown knobs", "committed FAIL"}."""
    page.goto(f"{lab.base}/lab/tree/notebooks/{stem}.ipynb?reset&token={lab.token}")
    # the kernel started and answered (its language_info is in): before that the lab shows an empty notebook, one
    # cell marked unsaved, and an "idle" indicator without a kernel
    page.locator(".jp-StatusBar-Widget", has_text=re.compile(r"\(ipykernel\) \| Idle")).first.wait_for()
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current").first
    knobs = page.locator(f"{NOTEBOOK} .jp-InputArea-editor:visible", has_text=re.compile(r"\b(STRICT|ANSWERS) ="))
    return {"tab": tab.inner_text().strip(), "dirty": "jp-mod-dirty" in (tab.get_attribute("class") or ""),
            "trust": page.locator(".jp-StatusBar-Widget [title*='trusted']").first.get_attribute("title"),
            "shown knobs": [k.inner_text()[:120] for k in knobs.all()],
            "committed FAIL": [t[:200] for t in outputs(page) if "FAIL" in t]}


def cells(page):
    return page.locator(f"{NOTEBOOK} .jp-Notebook .jp-Cell")


def outputs(page) -> list[str]:
    """Each cell's output text, in order ("" for a cell without output); offscreen cells included."""
    return cells(page).evaluate_all(
        "cs => cs.map(c => [...c.querySelectorAll('.jp-OutputArea-output')].map(o => o.textContent).join('\\n'))")


def _select(page, cell) -> None:
    """Make ``cell`` the active one with the keyboard's focus in the notebook (command mode), as a click on its
    prompt does. After Shift+Enter it already is; after a click in a widget the focus is in the widget."""
    active = cell.evaluate("c => c.classList.contains('jp-mod-active')")
    focus = page.evaluate("() => { const e = document.activeElement; "
                          "return !!e && !!e.closest('.jp-Notebook') && !e.closest('.jupyter-widgets') }")
    if active and focus:
        return
    prompt = cell.locator(".jp-InputArea .jp-InputPrompt").first
    assert prompt.is_visible(), f"cannot select the cell by its prompt (collapsed?): {cell.inner_text()[:200]!r}"
    prompt.click()
    page.wait_for_function("c => c.classList.contains('jp-mod-active')", arg=cell.element_handle())


def _answer(cell, answers: dict, said: list) -> None:
    """Click an answer in every question widget of ``cell`` and commit it; ``answers``: {words of the question:
    the choice or number, or (it, seconds the learner reads and types before the click)}, else the first choice
    (or 50) at once."""
    widgets = cell.locator(".widget-vbox", has=cell.page.locator("button", has_text="Commit"))
    for i in range(widgets.count()):
        box = widgets.nth(i)
        question = box.locator(".widget-html").first.inner_text().split("\n")[0]
        wanted = next((a for q, a in answers.items() if q in question), None)
        if isinstance(wanted, tuple):
            wanted, reading = wanted
            time.sleep(reading)
        radios = box.locator(".widget-radio-box label")
        if radios.count():
            label = radios.filter(has_text=re.compile(rf"^{re.escape(str(wanted))}$")).first if wanted is not None \
                else radios.first
            choice = label.inner_text().strip()
            label.click()
        else:
            choice = str(50 if wanted is None else wanted)
            field = box.locator("input").first
            field.fill(choice)
            field.press("Tab")      # the number widget takes its value when the field loses focus
        box.locator("button", has_text="Commit").click()
        box.locator(".widget-output", has_text=re.compile(r"\S")).first.wait_for()
        said.append(f"answered {question[:70]!r}: {choice!r} -> {box.locator('.widget-output').inner_text()[:120]!r}")


def walk(page, answers: dict, said: list, timeout_ms: int = WAIT_MS, last: int | None = None) -> float:
    """Shift+Enter through every cell from the top, each run to its end, the question widgets it shows answered
    (``_answer``) before the next; returns the seconds it took. ``said`` gets one line per code cell. With
    ``last`` (a cell's index in the notebook), the walk ends after that cell: a learner who stopped there."""
    t0 = time.monotonic()
    every = cells(page)
    for i in range(every.count() if last is None else last + 1):
        cell = every.nth(i)
        _select(page, cell)
        page.keyboard.press("Shift+Enter")
        if "jp-CodeCell" not in (cell.get_attribute("class") or ""):
            continue
        if cell.locator(".jp-InputPlaceholder").count():
            # a collapsed input (the settings cell) shows no prompt, so no count to wait for: the kernel runs
            # cells in order, so the next cell's count says that this one ended
            said.append(f"c{i} (collapsed) sent")
            continue
        started = time.monotonic()
        page.wait_for_function(
            "c => [...c.querySelectorAll('.jp-InputPrompt')].some(p => /\\[\\d+\\]/.test(p.textContent))",
            arg=cell.element_handle(), timeout=timeout_ms, polling=250)
        said.append(f"c{i} ran in {time.monotonic() - started:.1f} s")
        _answer(cell, answers, said)
    return time.monotonic() - t0


def one_line(element) -> bool:
    """The element's text sits on one line on the screen (not wrapped; scrolled into sight first, since the lab lays
    out no cell out of sight)."""
    element.scroll_into_view_if_needed()
    return element.evaluate("e => { const r = document.createRange(); r.selectNodeContents(e); "
                            "return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size === 1 }")
