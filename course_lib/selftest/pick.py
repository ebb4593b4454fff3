"""Which python runs the GPU self-check (the Makefile's side; standard library only: it runs before anything is
installed). A venv made with ``--system-site-packages`` from a python that is itself a venv sees the base's
site-packages, not that venv's torch, hence ``--see-site`` (docs/gpu-check.md):

    python -m course_lib.selftest.pick PYTHON...     # the first PYTHON whose torch has CUDA (where a GPU is)
    python -m course_lib.selftest.pick --see-site VENV_PYTHON SITE_PYTHON
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

PTH = "course-site-torch.pth"
SITE = ("import json, sys, sysconfig\n"
        "out = {'venv': sys.prefix != sys.base_prefix, 'prefix': sys.prefix, "
        "'site': sorted({sysconfig.get_path('purelib'), sysconfig.get_path('platlib')})}\n")
ASK = (SITE + "try:\n    import torch\n"
       "except Exception as e:\n    out['torch'] = ''; out['error'] = f'{type(e).__name__}: {e}'\n"
       "else:\n    out.update(torch=torch.__version__, cuda_build=torch.version.cuda or '',"
       " cuda=torch.cuda.is_available(), gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)\n"
       "print(json.dumps(out))\n")


def smi(*args: str, timeout: float = 60) -> tuple[str, str]:
    """(what ``nvidia-smi ARGS`` printed, ""), or ("", why) without nvidia-smi or when it fails."""
    path = shutil.which("nvidia-smi")
    if not path:
        return "", "nvidia-smi is not on PATH"
    try:
        p = subprocess.run([path, *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "", f"nvidia-smi {' '.join(args)}: {e}"
    text = (p.stdout + p.stderr).strip()
    if p.returncode != 0:
        return "", f"nvidia-smi {' '.join(args)} exited {p.returncode}: {text[-300:]}"
    return text, ""


def smi_gpus(timeout: float = 60) -> tuple[int, str]:
    """(GPUs that ``nvidia-smi -L`` lists, what it said); (0, why) without nvidia-smi or when it fails."""
    text, why = smi("-L", timeout=timeout)
    return (0, why) if why else (sum(line.startswith("GPU ") for line in text.splitlines()), text)


def ask(python: str, timeout: float = 180, torch: bool = True) -> dict:
    """What ``python`` is: a venv or not, its site-packages, and (``torch``) its torch: version, CUDA build,
    CUDA usable (importing torch takes seconds: ``torch=False`` leaves it out)."""
    code = ASK if torch else SITE + "print(json.dumps(out))\n"
    try:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "PYTHONNOUSERSITE": "1"})
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"torch": "", "error": str(e)}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"torch": "", "error": (p.stderr or p.stdout).strip()[-300:] or f"exit code {p.returncode}"}


def describe(info: dict) -> str:
    if not info.get("torch"):
        return f"torch does not import ({info.get('error', '?')})"
    return (f"torch {info['torch']}, CUDA build {info.get('cuda_build') or 'none'}, "
            f"CUDA {'usable' if info.get('cuda') else 'not usable'}")


def choose(candidates: list[str], gpus: int, infos: dict) -> tuple[str, str]:
    """(python, "") to run the check with, or ("", why not). ``infos``: python -> ``ask(python)``."""
    if not candidates:
        return "", "no python given"
    if gpus == 0:
        return candidates[0], ""
    for python in candidates:
        if infos[python].get("cuda"):
            return python, ""
    tried = "; ".join(f"{py}: {describe(infos[py])}" for py in candidates)
    return "", (f"nvidia-smi lists {gpus} GPU(s), but no python here has a torch that can use them ({tried}). "
                "The check would only say NOT POSSIBLE. Name a python whose torch has CUDA "
                "(make gpu-check GPU_CHECK_PYTHON=/path/to/python), or rebuild the venv from it "
                "(make clean venv SITE_TORCH=1 PYTHON=/path/to/python).")


def see_site(venv_python: str, site_python: str) -> str:
    """Let the venv of ``venv_python`` import what ``site_python`` has when that is itself a venv (a ``.pth``
    naming its site-packages); returns what was done, in one line."""
    site, own = ask(site_python, torch=False), ask(venv_python, torch=False)
    if not site.get("venv"):
        return f"{site_python} is no venv: --system-site-packages already shows its packages"
    lines = [d for d in site.get("site", []) if Path(d).is_dir()]
    target = Path(next(d for d in own["site"] if "site-packages" in d)) / PTH
    target.write_text("".join(f"{d}\n" for d in lines), encoding="utf-8")
    return f"{site_python} is a venv ({site['prefix']}): {target} adds its site-packages {', '.join(lines)}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--see-site"] and len(argv) == 3:
        print(see_site(argv[1], argv[2]), file=sys.stderr)
        return 0
    candidates = list(dict.fromkeys(a for a in argv if a))
    gpus, _said = smi_gpus()
    infos = {py: ask(py) for py in candidates} if gpus else {}
    python, why = choose(candidates, gpus, infos)
    if not python:
        print(f"gpu-check: {why}", file=sys.stderr)
        return 2
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
