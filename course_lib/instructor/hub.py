"""``course write lab-settings``: the course's JupyterLab settings for learners (docs/jupyterhub.md lists them).

For a hub (``--prefix``, default: this Python's environment, the one the hub's servers run from): Jupyter's news
prompt off and nbgrader's JupyterLab extension off (an instructor turns it on for themselves with ``jupyter
labextension enable --level=user @jupyter/nbgrader``); other settings in those files are kept. For ``make lab``
(``--lab-dir DIR``, the lab server's own Jupyter config folder, which git ignores): the same two settings, the server's
config (no nbgrader server extensions, the terminals' shell, custom.css, the clone's scaffolding hidden), the notary
that ``--trust`` signs the notebooks with, and the terminals' bashrc, so that neither the environment nor the user's
``~/.jupyter`` changes.
"""
import json
import shlex
import shutil
import sys
from pathlib import Path

from course_lib.core import atomic

OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}
# nbgrader's menus are an instructor's; the Extension Manager offers a learner PyPI's extensions under a warning
# about installing untrusted code, in a lab whose install is not theirs to change
DISABLED = {"@jupyter/nbgrader": True, "@jupyterlab/extensionmanager-extension": True}
# the clone's scaffolding, out of the file browser's listing (still opened by a link or a path): the package, its
# tests and scripts, the build's egg-info, the files of make and pip; with Jupyter's own defaults
HIDDEN = ("__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~", "course_lib", "tests", "scripts", "*.egg-info",
          "Makefile", "pyproject.toml", "environment.yml")
NBGRADER_SERVER = ("nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.validate_assignment",
                   "nbgrader.server_extensions.assignment_list", "nbgrader.server_extensions.course_list")
CUSTOM_CSS = """\
/* written by `course write lab-settings`: long output lines wrap between words, a word is cut only when it alone is too
   long (JupyterLab's own rule is word-break: break-all, which cuts words anywhere; "body" outranks that rule,
   which JupyterLab's styles, loaded after this file, would otherwise win at equal specificity) */
body .jp-OutputArea-output pre { word-break: normal; overflow-wrap: anywhere; }
/* the file browser lists notebooks/ and exercises/ first, where a learner starts, and marks solutions/ (an item's
   title is "Name: NAME" and a new line; its list is made a column of flex items so that order applies) */
.jp-DirListing-content { display: flex; flex-direction: column; }
.jp-DirListing-item[title^="Name: notebooks\\A"] { order: -2; }
.jp-DirListing-item[title^="Name: exercises\\A"] { order: -1; }
.jp-DirListing-item[title^="Name: solutions\\A"] .jp-DirListing-itemText::after {
  content: " (answers)"; font-style: italic; opacity: 0.7;
}
"""
# bash's own order for a login shell (bash(1), INVOCATION): /etc/profile, then the first of these that exists
BASHRC = """\
# written by `course write lab-settings`: the start-up file of this lab's terminals (a login shell's profiles,
# then this course's environment first on PATH, whatever the profiles did to PATH)
[ -r /etc/profile ] && . /etc/profile
for f in ~/.bash_profile ~/.bash_login ~/.profile; do [ -r "$f" ] && {{ . "$f"; break; }}; done
export VIRTUAL_ENV={venv}
export PATH={bin}:"$PATH"
"""


def merge_settings(path: Path, new: dict) -> dict:
    """Set ``new`` ({section: {key: value}}) in the JSON file at ``path``, keeping its other settings (a value that is
    a dict is merged into the one there)."""
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except ValueError as e:
        raise SystemExit(f"course write lab-settings: {path} is not valid JSON ({e}); fix or remove it") from e
    for section, values in new.items():
        for key, value in values.items():
            old = data.setdefault(section, {}).get(key)
            data[section][key] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


def _lab_settings(overrides: Path, page: Path) -> list[Path]:
    """Jupyter's news prompt off in ``overrides``, the DISABLED extensions off in ``page``; both paths."""
    merge_settings(overrides, OVERRIDES)
    merge_settings(page, {"disabledExtensions": DISABLED})
    return [overrides, page]


def write_settings(prefix: str | Path) -> list[Path]:
    """Write both files of a hub install under ``prefix``; returns their paths."""
    prefix = Path(prefix)
    return _lab_settings(prefix / "share" / "jupyter" / "lab" / "settings" / "overrides.json",
                         prefix / "etc" / "jupyter" / "labconfig" / "page_config.json")


def server_config(lab_dir: Path) -> dict:
    """The ``make lab`` server's own settings: no nbgrader server extensions, terminals started with the bashrc
    of ``lab_dir``, custom.css (served from the config folder's custom/)."""
    server = {"jpserver_extensions": dict.fromkeys(NBGRADER_SERVER, False)}
    contents = {"hide_globs": list(HIDDEN)}
    bash = shutil.which("bash")
    if bash:  # without bash the terminal keeps Jupyter's default (a login $SHELL)
        server["terminado_settings"] = {"shell_command": [bash, "--rcfile", str(lab_dir / "bashrc"), "-i"]}
    # the notary keeps its secret and its signatures here, where trust() signed the course's notebooks
    notary = {"data_dir": str(lab_dir)}
    return {"ServerApp": server, "ContentsManager": contents, "NotebookNotary": notary, "LabApp": {"custom_css": True}}


def trust(lab_dir: Path, notebooks: Path) -> list[Path]:
    """Sign the notebooks in ``notebooks`` with the notary of ``lab_dir`` (server_config points the lab's there):
    they open trusted, not "0 of N code cells trusted" as a notebook nobody signed does. Nothing leaves lab_dir."""
    import nbformat
    from nbformat.sign import NotebookNotary

    notary, signed = NotebookNotary(data_dir=str(lab_dir)), sorted(Path(notebooks).glob("*.ipynb"))
    for path in signed:
        notary.sign(nbformat.read(path, as_version=4))
    return signed


def write_lab_dir(lab_dir: str | Path, venv: str | Path = sys.prefix) -> list[Path]:
    """Write the settings of ``make lab`` into ``lab_dir`` for the environment ``venv``; returns their paths."""
    lab_dir = Path(lab_dir).resolve()
    overrides, page = _lab_settings(lab_dir / "labconfig" / "default_setting_overrides.json",
                                    lab_dir / "labconfig" / "page_config.json")
    bashrc, server, css = lab_dir / "bashrc", lab_dir / "jupyter_server_config.json", lab_dir / "custom/custom.css"
    venv = Path(venv).absolute()   # not resolved: a venv reached through a link keeps its own bin/
    atomic.write_text(bashrc, BASHRC.format(venv=shlex.quote(str(venv)), bin=shlex.quote(str(venv / "bin"))))
    atomic.write_text(server, json.dumps(server_config(lab_dir), indent=2) + "\n")
    css.parent.mkdir(exist_ok=True)
    atomic.write_text(css, CUSTOM_CSS)
    return [page, overrides, server, bashrc, css]


def add_arguments(p) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--prefix", type=Path, default=Path(sys.prefix),
                       help="the environment a hub's JupyterLab runs from (default: this one)")
    where.add_argument("--lab-dir", type=Path,
                       help="write the settings of `make lab` into this folder instead (nothing else changes)")
    p.add_argument("--trust", type=Path, metavar="NOTEBOOKS",
                   help="with --lab-dir: sign the notebooks in this folder for that lab, so they open trusted")


def run(args) -> int:
    paths = write_lab_dir(args.lab_dir) if args.lab_dir else write_settings(args.prefix)
    if args.lab_dir and args.trust:
        print(f"course write lab-settings: signed {len(trust(args.lab_dir.resolve(), args.trust))} notebooks")
    for path in paths:
        print(f"course write lab-settings: wrote {path}")
    return 0
