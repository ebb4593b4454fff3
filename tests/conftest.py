"""Shared fixtures. Slurm fixtures are added by the jobs tests' owner; keep others in their own test files."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(autouse=True, scope="session")
def _offline_defaults():
    # the tests never download: pin the data dir to an empty folder unless one is given
    os.environ.setdefault("COURSE_DATA_DIR", str(ROOT / "out" / "test-data"))
    yield
