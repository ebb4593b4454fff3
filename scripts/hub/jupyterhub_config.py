# JupyterHub settings for a workshop on one machine (the login node): every learner's server runs as that
# learner (LocalProcessSpawner, so the hub runs as root) from the shared install that
# `make shared-install PREFIX=...` made; at each start the server makes the learner's workspace
# (~/course, `course workspace init --exist-ok`) if it is not there yet, and opens JupyterLab in it.
#
#   COURSE_PREFIX=/opt/multigpu-course jupyterhub -f scripts/hub/jupyterhub_config.py
#
# Each server as a Slurm job instead (batchspawner): jupyterhub_slurm_config.py, which loads this file.
#
# Settings from the environment (all optional):
#   COURSE_PREFIX        the shared install (default /opt/multigpu-course)
#   COURSE_HUB_IP/PORT   where the hub listens for browsers (default 127.0.0.1:8000)
#   COURSE_HUB_DIR       the hub's own state: database, cookie secret (default PREFIX/../multigpu-course-hub)
#   COURSE_HUB_AUTH      "pam" (default: the machine's accounts) or "dummy" (tests: one shared password,
#                        COURSE_HUB_PASSWORD)
#   COURSE_HUB_TOKEN     an API token for a service "course-admin" that may create users and start servers
#   COURSE_QUICK, COURSE_ENGINE, COURSE_SITE, COURSE_CHECKS, SLURM_CONF: passed on to every learner's server and kernels
import os
from pathlib import Path

c = get_config()  # noqa: F821 - JupyterHub provides it

prefix = Path(os.environ.get("COURSE_PREFIX", "/opt/multigpu-course"))
bin_dir = prefix / "venv" / "bin"
state = Path(os.environ.get("COURSE_HUB_DIR", str(prefix.parent / "multigpu-course-hub")))
state.mkdir(parents=True, exist_ok=True)

c.JupyterHub.ip = os.environ.get("COURSE_HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(os.environ.get("COURSE_HUB_PORT", "8000"))
c.JupyterHub.hub_ip = "127.0.0.1"
if os.environ.get("COURSE_HUB_API_PORT"):
    c.JupyterHub.hub_port = int(os.environ["COURSE_HUB_API_PORT"])
if os.environ.get("COURSE_PROXY_API_PORT"):
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ['COURSE_PROXY_API_PORT']}"
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
proxy = prefix / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
if proxy.exists():
    c.ConfigurableHTTPProxy.command = [str(proxy)]

if os.environ.get("COURSE_HUB_AUTH", "pam") == "dummy":
    c.JupyterHub.authenticator_class = "dummy"
    c.DummyAuthenticator.password = os.environ["COURSE_HUB_PASSWORD"]
c.Authenticator.allow_all = True

if os.environ.get("COURSE_HUB_TOKEN"):
    c.JupyterHub.services = [{"name": "course-admin", "api_token": os.environ["COURSE_HUB_TOKEN"]}]
    c.JupyterHub.load_roles = [{"name": "course-admin", "services": ["course-admin"],
                                "scopes": ["admin:users", "admin:servers", "list:users", "read:users",
                                           "tokens"]}]

# each learner's server: as the learner, from the shared environment, in their own workspace
c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
c.Spawner.cmd = ["/bin/sh", "-c",
                 f'"{bin_dir}/course" workspace init --exist-ok "$HOME/course" >/dev/null '
                 f'&& exec "{bin_dir}/jupyterhub-singleuser" "$@"', "course-singleuser"]
c.Spawner.notebook_dir = "~/course"
c.Spawner.default_url = "/lab"
c.Spawner.environment = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"}
c.Spawner.env_keep = ["LANG", "LC_ALL", "COURSE_QUICK", "COURSE_ENGINE", "COURSE_SITE", "COURSE_CHECKS", "SLURM_CONF"]
c.Spawner.http_timeout = 120     # a first login copies the workspace and imports JupyterLab on a busy node
c.Spawner.start_timeout = 120
