"""Which isolation the sandbox chooses (course_lib.grading.cgroups), on made-up hosts.

The hierarchy this machine really has is exercised by test_grading_sandbox.py (fork bomb, memory hog); here
the choice itself is checked for the others: a pure cgroup v2 host with a delegated subtree, one with systemd
and no subtree, a v1 host, a Slurm job's cgroup, nothing. Cgroup folders are plain folders here, so the
test reads back what the grader wrote into them.
"""
import os

import pytest

from course_lib.grading.cgroups import DELEGATED_VAR, Cgroups, Host
from course_lib.grading.sandbox import Limits

LIMITS = Limits(max_processes=64, memory_mb=100)


def fake_v2(folder, controllers="cpu memory pids", enabled="memory pids"):
    folder.mkdir(parents=True)
    (folder / "cgroup.controllers").write_text(controllers + "\n")
    (folder / "cgroup.subtree_control").write_text(enabled + "\n")
    return folder


@pytest.fixture(autouse=True)
def no_delegation(monkeypatch):
    monkeypatch.delenv(DELEGATED_VAR, raising=False)


def test_what_the_host_offers_is_read_from_mounts_and_proc_self_cgroup():
    hybrid = Host.parse([("cgroup", "/sys/fs/cgroup/pids", "rw,relatime,pids"),
                         ("cgroup", "/sys/fs/cgroup/memory", "rw,memory"),
                         ("cgroup2", "/sys/fs/cgroup/unified", "rw")],
                        "8:pids:/\n4:memory:/box/a\n0::/\n", systemd=False)
    assert hybrid.v1 == {"pids": hybrid.v1["pids"], "memory": hybrid.v1["memory"]}
    assert str(hybrid.v1["memory"]) == "/sys/fs/cgroup/memory/box/a" and str(hybrid.v2) == "/sys/fs/cgroup/unified"
    pure = Host.parse([("cgroup2", "/sys/fs/cgroup", "rw,nsdelegate")],
                      "0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0\n", systemd=True)
    assert pure.v1 == {} and str(pure.v2) == "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_12/step_0/user/task_0"
    assert pure.slurm_cgroup.endswith("task_0") and pure.systemd


def test_a_delegated_v2_subtree_comes_first(tmp_path):
    own = fake_v2(tmp_path / "own")
    cg = Cgroups(LIMITS, Host(v2=own, systemd=True, v1={"pids": tmp_path}))
    assert cg.kind == "cgroup v2" and cg.prefix == []
    (d,) = cg.dirs
    assert d.parent == own and (d / "pids.max").read_text() == "64"
    assert (d / "memory.max").read_text() == str(100 * 2**20) and (d / "memory.swap.max").read_text() == "0"
    assert "cgroup v2" in cg.describe() and "64 processes" in cg.describe()


def test_the_delegated_folder_named_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(DELEGATED_VAR, str(fake_v2(tmp_path / "given", "cpu pids", "pids")))
    cg = Cgroups(LIMITS, Host(v2=fake_v2(tmp_path / "own", controllers="cpu")))
    assert cg.kind == "cgroup v2" and cg.dirs[0].parent == tmp_path / "given"
    assert not (cg.dirs[0] / "memory.max").exists()      # memory is not offered there: pids only


def test_systemd_scope_where_v2_hands_out_no_subtree(tmp_path):
    cg = Cgroups(LIMITS, Host(v2=fake_v2(tmp_path / "own", controllers="cpu memory"), systemd=True))
    assert cg.kind == "systemd scope" and cg.dirs == []
    assert cg.prefix[:2] == ["systemd-run", "--scope"] and cg.prefix[-1] == "--"
    assert "TasksMax=64" in cg.prefix and "MemoryMax=100M" in cg.prefix
    assert ("--user" in cg.prefix) == (os.getuid() != 0)


def test_v1_then_slurm_then_nothing(tmp_path):
    (tmp_path / "pids").mkdir()
    (tmp_path / "memory").mkdir()
    cg = Cgroups(LIMITS, Host(v1={"pids": tmp_path / "pids", "memory": tmp_path / "memory"}))
    assert cg.kind == "cgroup v1" and cg.controllers == ["pids", "memory"]
    assert (cg.dirs[0] / "pids.max").read_text() == "64"
    assert (cg.dirs[1] / "memory.limit_in_bytes").read_text() == str(100 * 2**20)
    slurm = Cgroups(LIMITS, Host(v2=fake_v2(tmp_path / "own", controllers="cpu"), slurm_cgroup="x/job_3/step_0"))
    assert slurm.kind == "slurm cgroup" and "Slurm job's own cgroup" in slurm.describe()
    nothing = Cgroups(LIMITS, Host())
    assert nothing.kind == "sweep" and "no cgroup" in nothing.describe()
    assert Cgroups(Limits(cgroups=False), Host(v2=fake_v2(tmp_path / "v2"))).kind == "sweep"
