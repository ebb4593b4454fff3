"""environment.yml (the conda way in) takes everything from conda-forge and agrees with pyproject.toml's pins.

No conda here to resolve it: these checks read the two files (a dry run needs conda and the network)."""
import re

import tomllib
import yaml
from conftest import ROOT
from packaging.requirements import Requirement

ENV = yaml.safe_load((ROOT / "environment.yml").read_text())
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CONDA_NAME = {"torch": "pytorch"}          # a PyPI name -> its conda-forge name where the two differ


def conda_specs() -> dict:
    """name -> version spec of each conda dependency ('' when unpinned)."""
    out = {}
    for dep in ENV["dependencies"]:
        if isinstance(dep, str):
            name, spec = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", dep).groups()
            out[name] = spec.strip()
    return out


def test_everything_comes_from_conda_forge():
    assert ENV["channels"] == ["conda-forge"], ENV["channels"]
    specs = conda_specs()
    assert "cpuonly" not in specs and "pytorch-cuda" not in specs, "the pytorch channel's variant packages"
    assert "pytorch-cpu" in specs and "pytorch" in specs


def test_pins_agree_with_pyproject():
    specs = conda_specs()
    python = specs["python"].lstrip("=")
    assert Requirement(f"python{PROJECT['requires-python']}").specifier.contains(python)
    for text in PROJECT["dependencies"]:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"python_version": python}):
            continue            # e.g. tomli, for Pythons older than the environment's
        name = CONDA_NAME.get(req.name, req.name)
        assert name in specs, f"{req.name} (pyproject.toml) is not in environment.yml"
        assert specs[name].replace(" ", "") == str(req.specifier), f"{name}: {specs[name]!r} vs {req.specifier}"
    pytest = Requirement(next(t for t in PROJECT["optional-dependencies"]["test"] if t.startswith("pytest<")))
    assert specs["pytest"] == str(pytest.specifier)
