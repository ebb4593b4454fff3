"""Shared fixtures. Slurm fixtures are added by the jobs tests' owner; keep others in their own test files."""
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import cpu_time
import pytest
from stall_dump import pytest_runtest_call, pytest_terminal_summary  # noqa: F401 - a stalled test keeps its evidence

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# GNU OpenMP (torch's) lets a thread spin after each parallel region while OMP_WAIT_POLICY is unset. With the ranks
# of four test workers on two cores, every spin takes a core from a process with work to do: one 2-epoch run of the
# serial solution on digits beside four CPU-bound processes used 17-20 CPU-s so, 8-9 with PASSIVE. Set before
# anything imports torch (every process the tests start inherits it); only how idle threads wait changes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def live_processes(*needles: str, environ: bool = False) -> list[str]:
    """``"pid: command"`` of live processes (no zombies, not pytest) whose command line (and environment, if
    asked) holds every one of ``needles``: what a run that must leave nothing behind left behind."""
    from course_lib.runtime import proc

    found = []
    for p in proc.live(["cmdline", "environ"] if environ else ["cmdline"]):
        if p.pid == os.getpid():
            continue
        argv = p.info["cmdline"] or []
        cmd = " ".join(argv)
        blob = cmd + ("".join(f"{k}={v}" for k, v in (p.info["environ"] or {}).items()) if environ else "")
        if not _is_pytest(argv) and all(n in blob for n in needles):
            found.append(f"{p.pid}: {cmd[:200]}")
    return found


def _is_pytest(argv: list) -> bool:
    """pytest itself (its arguments may name what a test looks for), not a process whose path has "pytest" in
    it, as every file under tmp_path (/tmp/pytest-of-USER/...) does."""
    return bool(argv) and (os.path.basename(argv[0]) in ("pytest", "py.test") or argv[1:3] == ["-m", "pytest"])


def processes_under(folder, any_of: tuple = ()) -> list[str]:
    """``"pid: command"`` of live processes whose command line or working folder names ``folder`` (and, if
    ``any_of`` is given, holds one of those strings too): what a run in ``folder`` left behind."""
    from course_lib.runtime import proc

    found = []
    for p in proc.live(["cmdline", "cwd"]):
        cmd = " ".join(p.info["cmdline"] or [])
        blob = f"{cmd} {p.info['cwd'] or ''}"
        if p.pid != os.getpid() and str(folder) in blob and (not any_of or any(a in blob for a in any_of)):
            found.append(f"{p.pid}: {cmd[:120]}")
    return found


def in_queue(job_id: str) -> str:
    """The job's state in squeue ("" once it has left the queue)."""
    import subprocess

    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                          timeout=60).stdout.strip()


def running_within(job_id: str, seconds: float = 120.0) -> str:
    """Wait up to ``seconds`` for the job to run (a busy machine can take a while to start one); its state then."""
    deadline = time.monotonic() + seconds
    while (state := in_queue(job_id)) != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    return state


def gone_within(find, seconds: float = 30.0) -> list:
    """What ``find()`` (the processes that must be gone, as a list) still returns after waiting up to ``seconds``
    for it to return nothing: a process killed a moment ago may not be reaped yet. The caller asserts that the
    result is empty, so a leftover fails the test instead of a fixed sleep deciding it."""
    deadline = time.monotonic() + seconds
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture
def run_mark(monkeypatch) -> str:
    """A unique value in this test's environment, which every process it starts inherits: pass it to
    ``live_processes(mark, environ=True)`` to find what this test left behind, and not what a test on the
    other xdist worker (or a notebook running the same module) is running right now."""
    import uuid

    mark = f"course-test-{uuid.uuid4()}"
    monkeypatch.setenv("COURSE_TEST_MARK", mark)
    return mark


@pytest.fixture(autouse=True, scope="session")
def _offline_defaults():
    # the tests never download: pin the data dir to an empty folder unless one is given
    os.environ.setdefault("COURSE_DATA_DIR", str(ROOT / "out" / "test-data"))
    # each worker's checks take slots of its own: a test that times a check or counts what it says must not wait
    # behind another worker's check (or another run's on this machine); tests/test_check_slots.py sets its own
    slots = tempfile.mkdtemp(prefix="course-check-slots-")
    os.environ.setdefault("COURSE_CHECK_SLOTS_DIR", slots)
    yield
    shutil.rmtree(slots, ignore_errors=True)


# ------------------------------------------------------------------------------------------- Slurm
# A real one-node Slurm on loopback for the whole session (scripts/local-slurm/start.sh): started the first
# time a test asks for it, stopped (by pid file) at the end. Free ports and a short state dir under /tmp,
# so a stray cluster elsewhere never blocks it. Where it cannot start, tests that need it skip, saying why.
class SlurmCluster:
    def __init__(self, directory: Path):
        self.dir = directory
        self.conf = directory / "etc" / "slurm.conf"

    @property
    def env(self) -> dict:
        """What a client needs (and what makes course_lib pick the Slurm engine)."""
        return {"SLURM_CONF": str(self.conf), "COURSE_ENGINE": "slurm", "COURSE_SITE": "local"}


def _start_slurm() -> SlurmCluster:
    import shutil
    import subprocess
    import tempfile

    from course_lib.runtime.launch import free_port

    if os.geteuid() != 0:
        pytest.skip("local Slurm needs root (it runs munged, slurmctld and slurmd as root): Slurm tests skipped")
    directory = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))   # short: unix socket paths < 108 chars
    ctld, slurmd = free_port(), free_port()
    while slurmd == ctld:
        slurmd = free_port()
    # each worker's cluster its own job ids: the course's jobs derive MASTER_PORT from the id, and two clusters on
    # this host running their job 27 at once both listened on 10027 (seen in CI: EADDRINUSE in notebook 03's check)
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    env = dict(os.environ, SLURM_LAB_CTLD_PORT=str(ctld), SLURM_LAB_SLURMD_PORT=str(slurmd),
               SLURM_LAB_FIRST_JOB_ID=str(1000 * (worker + 1)))
    try:
        r = subprocess.run(["bash", str(ROOT / "scripts" / "local-slurm" / "start.sh"), str(directory)], env=env,
                           capture_output=True, text=True, timeout=300)
        ok, out = r.returncode == 0, (r.stdout + r.stderr).strip()
    except subprocess.TimeoutExpired as e:
        ok, out = False, f"start.sh did not finish in 300 s: {e.stdout or ''}"
    if not ok:
        _stop_slurm(directory)
        shutil.rmtree(directory, ignore_errors=True)
        pytest.skip("local Slurm could not start: " + " | ".join(str(out).splitlines()[-6:]))
    print(f"\n[local-slurm] up in {directory} (slurmctld port {ctld}, slurmd port {slurmd})")
    return SlurmCluster(directory)


def _stop_slurm(directory: Path) -> None:
    import subprocess

    subprocess.run(["bash", str(ROOT / "scripts" / "local-slurm" / "stop.sh"), str(directory)],
                   capture_output=True, text=True, timeout=120)


def nodes_take_jobs_within(seconds: float) -> None:
    """Wait until every node of the Slurm that SLURM_CONF names takes jobs (not down, drained or "*": not
    answering, which sbatch --test-only refuses as "Requested node configuration is not available"); else fail,
    saying their states."""
    from course_lib.runtime.slurm import node_states, taking_no_jobs

    deadline = time.monotonic() + seconds
    while taking_no_jobs(states := node_states()):
        if time.monotonic() > deadline:
            pytest.fail(f"the nodes did not take jobs within {seconds:.0f} s: {states}")
        time.sleep(0.5)


def keep_slurm_logs(directory: Path, out: Path) -> None:
    """The daemons' logs and the job completions of the local Slurm in ``directory``, copied to ``out`` before
    the folder is removed: a reader of a failed run can see why Slurm refused or ended a job."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    for log in [*(directory / "log").glob("*.log"), directory / "log" / "jobcomp.txt"]:
        if log.is_file():
            shutil.copyfile(log, out / log.name)


def pytest_configure(config):
    config.pluginmanager.register(cpu_time, "course_cpu_time")   # each test's CPU time, printed at the end


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist's own hook, which reads the marks into the node ids
def pytest_collection_modifyitems(items):
    """Under xdist (--dist loadgroup) every test that uses the local Slurm runs on one worker: one cluster (a test of
    another group, the hub's, runs in its group, with a cluster of that worker's own).

    A test that took FAST_LIMIT seconds or more in the measured run (tests/durations.json) is marked slow too, so that
    ``make test-fast`` (``-m "not slow ..."``) keeps to the unit tests of under a second without a mark kept by hand.

    Then the slow tests (multi-process runs, notebooks) go first, longest first (tests/durations.json), and the
    quick unit tests last: xdist hands out tests in this order (groups first, the largest first), so the run ends
    on tests of a second or less instead of one worker finishing a minute-long test while the others are idle.
    The order within a group stays as written."""
    seconds = _durations()
    for item in items:
        # a test already in a group keeps it (test_hub's runs on Slurm, group "hub_slurm": a second mark would make
        # xdist join the names into yet another group); its worker starts a Slurm of its own
        if "slurm_cluster" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        if seconds.get(item.nodeid, 0) >= FAST_LIMIT and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)   # measured at a second or more: not a unit test for test-fast

    def order(item):
        if item.get_closest_marker("xdist_group"):
            return (0, 0)        # a group's tests run in the order written
        return (0 if item.get_closest_marker("slow") else 1, -seconds.get(item.nodeid, 0))
    items.sort(key=order)


# How long each test of a second or more took in a measured run (tests/durations.json): the slow tests are handed out
# longest first, so that a test that mostly waits (a hang case's deadline, a job) starts early instead of at the end,
# and a test of FAST_LIMIT seconds or more is left out of `make test-fast`. No verdict depends on it: a missing or
# stale file changes only the order and what test-fast runs. COURSE_TEST_DURATIONS=write (with `make test`, or a
# pytest run of some tests) writes what the run measured into it (a partial run updates the tests it ran).
DURATIONS = ROOT / "tests" / "durations.json"
FAST_LIMIT = 1.0
_measured: dict = {}


def _durations() -> dict:
    try:
        return json.loads(DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def pytest_runtest_logreport(report):
    if os.environ.get("COURSE_TEST_DURATIONS") == "write":   # on the controller, with xdist: every worker's reports
        node = report.nodeid.split("@")[0]                  # without xdist's group suffix
        _measured[node] = _measured.get(node, 0.0) + report.duration


def pytest_sessionfinish(session):
    if _measured and not hasattr(session.config, "workerinput"):
        kept = {**_durations(), **{node: round(t, 1) for node, t in _measured.items()}}
        kept = {node: t for node, t in sorted(kept.items()) if t >= FAST_LIMIT}
        DURATIONS.write_text(json.dumps(kept, indent=0) + "\n", encoding="utf-8")


def pytest_collection_finish(session):
    """The groups must hold: the hub tests share one hub and its learners' workspaces, which a second worker's
    hub would wipe. pytest-xdist marks a grouped test by a suffix of its node id; when that is missing (pytest
    9.2 with xdist 3.8 dropped it silently), stop here rather than run the groups split."""
    if not getattr(session.config.option, "loadgroup", False):   # set on each worker under --dist loadgroup
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        why = (f"pytest-xdist did not apply the xdist_group marks ({len(lost)} tests, e.g. {lost[0]}): "
               "install the pytest version pyproject.toml pins")
        print(why, file=sys.stderr, flush=True)   # a worker's exception reaches the user as an INTERNALERROR
        raise pytest.UsageError(why)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The session's local Slurm (skips, with the reason, where it cannot start)."""
    import shutil

    cluster = _start_slurm()
    yield cluster
    _stop_slurm(cluster.dir)
    keep_slurm_logs(cluster.dir, ROOT / "out" / "slurm")
    shutil.rmtree(cluster.dir, ignore_errors=True)


@pytest.fixture
def local(tmp_path, monkeypatch):
    """Jobs run on the local engine with the local profile, their run folders under ``tmp_path/runs``."""
    monkeypatch.setenv("COURSE_ENGINE", "local")
    monkeypatch.setenv("COURSE_SITE", "local")
    monkeypatch.setenv("COURSE_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path


@pytest.fixture
def slurm(slurm_cluster, monkeypatch):
    """Use the local Slurm in this test: SLURM_CONF set, COURSE_ENGINE=slurm, COURSE_SITE=local."""
    from course_lib import jobs

    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    jobs._probe_cache.clear()
    yield slurm_cluster
    jobs._probe_cache.clear()
