"""Write the workshop's sbatch scripts into jobs/ from the templates (--check: fail if they drift).

    course write jobs                 write jobs/*.sbatch (site 'generic': any Slurm, CPU only)
    course write jobs --check         exit 1, with a diff, when jobs/ differs from what the templates give
    course write jobs --site mysite --out ~/myjobs    the same scripts for your site (GPUs, account, modules)
"""
import difflib
import sys
from pathlib import Path

from course_lib.core.atomic import write_text
from course_lib.core.paths import workspace

DEFAULT_SITE = "generic"   # fixed, so --check does not depend on $COURSE_SITE


def add_arguments(p):
    p.add_argument("--check", action="store_true", help="do not write; exit 1 (with a diff) if the files drift")
    p.add_argument("--site", default=None, help=f"site profile name or .toml path (default: {DEFAULT_SITE})")
    p.add_argument("--out", default=None, help="folder to write into (default: jobs/ of the course)")
    p.add_argument("--force", action="store_true", help="overwrite scripts that differ (edited by hand?)")
    p.add_argument("--for-install", metavar="PREFIX", default=None,
                   help="scripts for the learner workspaces of a shared install (make shared-install): PREFIX's "
                        "python and course_lib, submitted from a workspace")


def run(args) -> int:
    from course_lib.core.site import SiteError, load_site
    from course_lib.jobs.workshop import render_all

    try:
        site = load_site(args.site or DEFAULT_SITE)
    except SiteError as e:
        print(f"course write jobs: {e}", file=sys.stderr)
        return 2
    out = Path(args.out).expanduser() if args.out else workspace() / "jobs"
    texts = render_all(site, install=Path(args.for_install).resolve() if args.for_install else None)
    if args.check:
        return _check(out, texts)
    try:
        return _write(out, texts, args.force)
    except OSError as e:
        print(f"course write jobs: cannot write into {out}: {e}", file=sys.stderr)
        return 2


def _write(out: Path, texts: dict, force: bool) -> int:
    """Write each script that changed; one edited by hand is kept (exit 1) unless ``force``."""
    out.mkdir(parents=True, exist_ok=True)
    status = 0
    for name, text in texts.items():
        path = out / name
        old = path.read_text() if path.exists() else None
        if old == text:
            print(f"unchanged {path}")
            continue
        if old is not None and not force:
            print(f"kept      {path}: it differs from the template (edited by hand?); --force overwrites it, "
                  "--check shows the difference")
            status = 1
            continue
        write_text(path, text)
        path.chmod(0o755)
        print(f"wrote     {path}")
    return status


def _check(out: Path, texts: dict) -> int:
    drift = 0
    for name, text in texts.items():
        path = out / name
        old = path.read_text() if path.exists() else ""
        if old != text:
            drift += 1
            print(f"{path}: differs from the template" + ("" if path.exists() else " (missing)"))
            print("".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                               f"{path} (in the folder)", f"{path} (from the template)")))
    if drift:
        print(f"{drift} job script(s) drifted: run `course write jobs --force` to rewrite them from the template")
        return 1
    print(f"{len(texts)} job scripts in {out} match the template")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``course write jobs ...`` without the rest of the ``course`` command (tests, ``python -m``)."""
    import argparse

    p = argparse.ArgumentParser(prog="course write jobs", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
