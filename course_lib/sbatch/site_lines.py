"""The site's own lines in the job-script exercise (partition, account, reservation: nothing a learner can know),
written from the site profile into a marked block the learner keeps as it is; ``course check sbatch`` holds a
script to the same profile. The repository's files carry the ``generic`` block; for another site::

    python -m course_lib.sbatch.site_lines exercises/03_jobs/ddp.sbatch --site mysite
"""
import argparse
import re
import sys
from pathlib import Path

from course_lib.core.atomic import write_text
from course_lib.core.site import load_site

BEGIN = re.compile(r"^# >>> site '([^']*)'.*$", re.M)
END = "# <<< site"
CPU_TASKS, CPU_CPUS = 2, 2      # what the exercise asks where the nodes have no GPUs


def shape(site) -> tuple[int, int, int]:
    """(tasks per node, CPUs per task, GPUs per node) that the exercise asks for on ``site``."""
    if site.gpus_per_node:
        return site.gpus_per_node, max(1, site.cpus_per_node // site.gpus_per_node), site.gpus_per_node
    return CPU_TASKS, CPU_CPUS, 0


def gpu_line(site, gpus: int) -> str:
    return f"#SBATCH --gres=gpu:{gpus}" if site.gpu_request == "gres" else f"#SBATCH --gpus-per-node={gpus}"


def directives(site) -> list[str]:
    return [f"#SBATCH --{key}={value}" for key, value in site.sbatch_options()]


def block(site) -> str:
    tasks, cpus, gpus = shape(site)
    nodes = (f"# This site's nodes: {gpus} GPUs, {site.cpus_per_node} CPUs each: one task (rank) per GPU, the CPUs "
             f"shared; GPUs: {gpu_line(site, gpus)[8:]}" if gpus else
             f"# This site's nodes: no GPUs, {site.cpus_per_node} CPUs each: {tasks} tasks (ranks) of {cpus} CPUs")
    lines = [f"# >>> site '{site.name}': written from its site profile; keep these lines as they are",
             *(directives(site) or ["# (no partition, account or reservation needed here)"]), nodes, END]
    return "\n".join(lines)


def written_for(text: str) -> str | None:
    """The site the file's block was written for (None: the file has no block)."""
    m = BEGIN.search(text)
    return m.group(1) if m else None


def render(text: str, site) -> str:
    """``text`` with its block written for ``site`` (ValueError where it has no block)."""
    m = BEGIN.search(text)
    end = text.find(END, m.end()) if m else -1
    if end < 0:
        raise ValueError(f"no site block (a line starting \"# >>> site '\" and a line {END!r}) in the job script")
    return text[:m.start()] + block(site) + text[end + len(END):]


def reference(text: str, site) -> str:
    """The model answer for ``site``: its block, and the tasks, CPUs and GPUs per node it asks for."""
    tasks, cpus, gpus = shape(site)
    text = render(text, site)
    text = re.sub(r"(?m)^#SBATCH --ntasks-per-node=\d+$", f"#SBATCH --ntasks-per-node={tasks}", text)
    text = re.sub(r"(?m)^#SBATCH --cpus-per-task=\d+$",
                  f"#SBATCH --cpus-per-task={cpus}" + (f"\n{gpu_line(site, gpus)}" if gpus else ""), text)
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.sbatch.site_lines",
                                description="write the site block of job-script exercises from a site profile")
    p.add_argument("paths", nargs="+", type=Path)
    p.add_argument("--site", default=None, help="site profile (default: $COURSE_SITE, else generic)")
    args = p.parse_args(argv)
    site = load_site(args.site)
    for path in args.paths:
        try:
            write_text(path, render(path.read_text(), site))
        except (OSError, ValueError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 2
        print(f"{path}: site lines written for '{site.name}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
