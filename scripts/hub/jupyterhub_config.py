# JupyterHub settings for a workshop on one machine (the login node): every learner's server runs as that
# learner (LocalProcessSpawner, so the hub runs as root) from the shared install that
# `make shared-install PREFIX=...` made; at each start the server makes the learner's workspace
# (~/course, `course init --exist-ok`) if it is not there yet, and opens JupyterLab in it.
#
#   COURSE_PREFIX=/opt/multigpu-course COURSE_HUB_GROUP=workshop jupyterhub -f scripts/hub/jupyterhub_config.py
#
# Each server as a Slurm job instead (batchspawner): jupyterhub_slurm_config.py, which loads this file.
# Every setting is an environment variable; docs/jupyterhub.md lists them all with their defaults:
#   COURSE_PREFIX, COURSE_HUB_IP, COURSE_HUB_PORT, COURSE_HUB_API_PORT, COURSE_PROXY_API_PORT, COURSE_HUB_DIR,
#   COURSE_HUB_AUTH (pam | shared | dummy), COURSE_HUB_GROUP, COURSE_HUB_ADMINS, COURSE_HUB_ALLOW_ALL,
#   COURSE_HUB_PASSWORD, COURSE_HUB_ADMIN_PASSWORD, COURSE_HUB_TOKEN, COURSE_HUB_CULL_TIMEOUT, COURSE_HUB_CULL_EVERY,
#   COURSE_HUB_ACTIVITY_INTERVAL, and COURSE_QUICK, COURSE_ENGINE, COURSE_SITE, COURSE_CHECKS, COURSE_RUNS,
#   SLURM_CONF, passed on to every learner's server and kernels.
import grp
import importlib.util
import os
import pwd
import re
import sys
from pathlib import Path

c = get_config()  # noqa: F821 - JupyterHub provides it


def _stop(message: str):
    """End the hub's start with one message that says what to set (traitlets would print a traceback)."""
    raise SystemExit(f"[course hub] {message}")


def _names(variable: str) -> set:
    return {n for n in re.split(r"[\s,]+", os.environ.get(variable, "")) if n}


prefix = Path(os.environ.get("COURSE_PREFIX", "/opt/multigpu-course"))
bin_dir = prefix / "venv" / "bin"

# -- the hub's state: its database, cookie secret and pid files. One folder per install (two installs, e.g. a
# test install beside the workshop's, never share a database), outside the install (make shared-install opens
# PREFIX to every user), and private: the database holds the users' API tokens.
_default_state = Path("/var/lib/multigpu-course-hub") / str(prefix.resolve()).strip("/").replace("/", "-")
state = Path(os.environ.get("COURSE_HUB_DIR") or _default_state)
state.mkdir(parents=True, exist_ok=True, mode=0o700)
state.chmod(0o700)
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.ConfigurableHTTPProxy.pid_file = str(state / "jupyterhub-proxy.pid")   # default: the folder the hub starts in

# -- where it listens
c.JupyterHub.ip = os.environ.get("COURSE_HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(os.environ.get("COURSE_HUB_PORT", "8000"))
c.JupyterHub.hub_ip = "127.0.0.1"
if os.environ.get("COURSE_HUB_API_PORT"):
    c.JupyterHub.hub_port = int(os.environ["COURSE_HUB_API_PORT"])
if os.environ.get("COURSE_PROXY_API_PORT"):
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ['COURSE_PROXY_API_PORT']}"
proxy = prefix / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
if proxy.exists():
    c.ConfigurableHTTPProxy.command = [str(proxy)]

# -- who may log in: the machine's accounts of one group (or everyone, said explicitly), some of them admins
auth = os.environ.get("COURSE_HUB_AUTH", "pam")
group, admins = os.environ.get("COURSE_HUB_GROUP", ""), _names("COURSE_HUB_ADMINS")
allow_all = os.environ.get("COURSE_HUB_ALLOW_ALL", "") == "1"
c.Authenticator.admin_users = admins
if auth == "pam":
    if group:
        c.LocalAuthenticator.allowed_groups = {group}   # checked at each login, against the system's groups
    elif not allow_all:
        _stop("with PAM every account of this machine could log in: set COURSE_HUB_GROUP=<a Unix group of the "
              "learners> (and COURSE_HUB_ADMINS=<instructors' accounts>), or COURSE_HUB_ALLOW_ALL=1 to allow "
              "every account on purpose")
elif auth == "shared":
    # one workshop password, no personal ones (JupyterHub's SharedPasswordAuthenticator, 5.3+). The servers
    # still run as system accounts of these names (LocalProcessSpawner, SlurmSpawner): make them beforehand.
    c.JupyterHub.authenticator_class = "shared-password"
    c.SharedPasswordAuthenticator.user_password = os.environ.get("COURSE_HUB_PASSWORD") or _stop(
        "COURSE_HUB_AUTH=shared needs COURSE_HUB_PASSWORD (8 characters or more), the password of every learner")
    if os.environ.get("COURSE_HUB_ADMIN_PASSWORD"):
        c.SharedPasswordAuthenticator.admin_password = os.environ["COURSE_HUB_ADMIN_PASSWORD"]
    if group:   # the members of the Unix group, as the hub starts: anyone else is refused at login
        try:
            entry = grp.getgrnam(group)
        except KeyError:
            _stop(f"COURSE_HUB_GROUP={group}: no such group on this machine")
        # its members, and the accounts whose primary group it is (as PAM's allowed_groups counts them)
        members = set(entry.gr_mem) | {u.pw_name for u in pwd.getpwall() if u.pw_gid == entry.gr_gid}
        c.Authenticator.allowed_users = members - admins
    elif not allow_all:
        _stop("with a shared password anyone who has it could log in under any name: set COURSE_HUB_GROUP=<a Unix "
              "group of the learners' accounts>, or COURSE_HUB_ALLOW_ALL=1 to allow every name on purpose")
elif auth == "dummy":   # the tests' hub: any name with the one password (JupyterHub's DummyAuthenticator)
    c.JupyterHub.authenticator_class = "dummy"
    c.DummyAuthenticator.password = os.environ["COURSE_HUB_PASSWORD"]
else:
    _stop(f"COURSE_HUB_AUTH={auth!r}: use pam (the machine's passwords), shared (one workshop password) or dummy")
if allow_all:
    c.Authenticator.allow_all = True

# -- services: an admin token for scripts (the tests), and the idle culler
services, roles = [], []
if os.environ.get("COURSE_HUB_TOKEN"):
    services.append({"name": "course-admin", "api_token": os.environ["COURSE_HUB_TOKEN"]})
    roles.append({"name": "course-admin", "services": ["course-admin"],
                  "scopes": ["admin:users", "admin:servers", "list:users", "read:users", "tokens"]})
cull_timeout = int(os.environ.get("COURSE_HUB_CULL_TIMEOUT", "3600"))
activity_every = int(os.environ.get("COURSE_HUB_ACTIVITY_INTERVAL") or 60)
if cull_timeout > 0:
    if importlib.util.find_spec("jupyterhub_idle_culler") is None:
        _stop(f"no jupyterhub-idle-culler in {sys.prefix}: install the course's hub extra (make shared-install), "
              "or set COURSE_HUB_CULL_TIMEOUT=0 to run without culling")
    cull_every = int(os.environ.get("COURSE_HUB_CULL_EVERY", str(max(10, cull_timeout // 10))))
    # a server's activity reaches the hub every interval; at the timeout or above it, a server busy with a job
    # looks idle to the culler between two reports: a third of the timeout at most, by default
    activity_every = int(os.environ.get("COURSE_HUB_ACTIVITY_INTERVAL") or min(60, max(1, cull_timeout // 3)))
    if activity_every * 2 > cull_timeout:
        _stop(f"COURSE_HUB_ACTIVITY_INTERVAL={activity_every} s with COURSE_HUB_CULL_TIMEOUT={cull_timeout} s: a "
              "server that is busy would be culled between two reports of its activity; keep the interval under "
              "half the timeout (unset, it is a third of it, at most 60 s)")
    services.append({"name": "idle-culler", "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                                                        f"--timeout={cull_timeout}", f"--cull-every={cull_every}"]})
    # the scopes jupyterhub-idle-culler's documentation gives for culling servers (not users)
    roles.append({"name": "idle-culler", "services": ["idle-culler"],
                  "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]})
c.JupyterHub.services = services
c.JupyterHub.load_roles = roles

# each learner's server: as the learner, from the shared environment, in their own workspace
c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
c.Spawner.cmd = ["/bin/sh", "-c",
                 f'"{bin_dir}/course" init --exist-ok "$HOME/course" >/dev/null '
                 f'&& cd "$HOME/course" && exec "{bin_dir}/jupyterhub-singleuser" "$@"', "course-singleuser"]
# the server works in ~/course: a terminal that JupyterLab opens without a folder starts where the server runs
# (terminado's cwd), so the course's own `course check ... exercises/...` lines work there as printed
c.Spawner.notebook_dir = "~/course"
c.Spawner.default_url = "/lab"
# how often a server tells the hub its last activity (jupyterhub-singleuser's default is 300 s); the course's
# server extension (course_lib.instructor.activity) keeps that time fresh while a kernel is busy or a job lives
c.Spawner.environment = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
                         "JUPYTERHUB_ACTIVITY_INTERVAL": str(activity_every)}
# (not COURSE_RUNS_DIR: one folder for every learner's runs; each learner's are in their own workspace)
# OMP_WAIT_POLICY: a shared node's choice; PASSIVE makes OpenMP's idle threads sleep, not spin on a core (OpenMP spec)
c.Spawner.env_keep = ["LANG", "LC_ALL", "COURSE_QUICK", "COURSE_ENGINE", "COURSE_SITE", "COURSE_CHECKS", "COURSE_RUNS",
                      "SLURM_CONF", "OMP_WAIT_POLICY"]
c.Spawner.http_timeout = 120     # a first login copies the workspace and imports JupyterLab on a busy node
c.Spawner.start_timeout = 120
