"""The README's promises: command 1 serves the course, the CLI answers, exercises are current."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from conftest import ROOT

from course_lib.runtime.launch import free_port


def test_readme_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[:4] == ["```", "make lab", "make test", "```"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow
def test_make_lab_serves_jupyterlab_on_localhost():
    port = free_port()
    proc = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS=--port={port} --IdentityProvider.token=course-test",
                             f"PYTHON={sys.executable}", f"VENV={sys.prefix}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, status = time.monotonic() + 90, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token=course-test", timeout=2) as r:
                    status = json.load(r)
                break
            except OSError:
                time.sleep(0.5)
        assert status is not None, f"JupyterLab did not answer on port {port}: {proc.stdout.read1(4000)!r}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab/tree/notebooks/00_welcome.ipynb"
                                    "?token=course-test", timeout=10) as r:
            assert r.status == 200 and b"JupyterLab" in r.read()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_course_help_lists_exit_codes_and_imports_no_torch():
    from course_lib.cli import COMMANDS

    probe = textwrap.dedent("""\
        import sys
        from course_lib.cli import main
        for argv in [["--help"]] + [[command, "--help"] for command in sys.argv[1:]]:
            try:
                main(argv)
            except SystemExit:
                pass
        print("torch imported:", "torch" in sys.modules)
    """)
    p = subprocess.run([sys.executable, "-c", probe, *COMMANDS], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.rstrip().endswith("torch imported: False"), "`course --help` must stay fast: no torch"
    for code in ("0 ", "1 ", "2 ", "130 "):
        assert f"\n  {code}" in p.stdout, f"exit code {code}not in `course --help`"
    for var in ("COURSE_SITE", "COURSE_ENGINE", "COURSE_RUNS_DIR", "COURSE_DATA_DIR", "COURSE_HOME"):
        assert var in p.stdout


def test_check_and_grade_help_list_the_registry_and_the_same_engines(capsys):
    from course_lib.check import ENGINES
    from course_lib.cli import main
    from course_lib.registry import EXERCISES

    helps = {}
    for command in ("check", "grade"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        helps[command] = " ".join(capsys.readouterr().out.split())     # argparse's wrapping undone
    for command, text in helps.items():
        assert f"--engine {{{','.join(ENGINES)}}}" in text and "auto" in ENGINES, command
    for e in EXERCISES.values():
        assert f"{e.name}: {e.file}" in helps["check"], f"`course check --help` does not list {e.name}"
    assert f"({', '.join(EXERCISES)})" in helps["grade"], "`course grade --help` does not list the registry"


def test_course_env_reports_this_machine():
    out = subprocess.run([sys.executable, "-m", "course_lib.cli", "env"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    facts = dict(line.split(None, 1) if "  " not in line else [p.strip() for p in line.split("  ", 1)]
                 for line in out.stdout.splitlines())
    import torch
    assert facts["torch"] == torch.__version__
    from course_lib.instructor.envreport import _backend
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert facts["backend"] == _backend(gpus, torch.distributed.is_nccl_available())
    assert gpus or facts["backend"] == "gloo (CPU)"


@pytest.mark.slow   # a multi-process run: make test, not test-fast
def test_a_reader_that_goes_away_gets_no_traceback():
    """`course ... | head`: when the pipe's reader has gone, the command exits 1 without a BrokenPipeError traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)   # closed before the command starts: its first write fails for sure
    p = subprocess.run([sys.executable, "-m", "course_lib", "data", "info"], stdout=write_end,
                       stderr=subprocess.PIPE, text=True, timeout=300)
    os.close(write_end)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
