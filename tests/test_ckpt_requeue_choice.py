"""Notebook 08's choice to run its requeue job (course_lib.ckpt.requeue.should_run) where Slurm's client is installed
but no controller answers (a laptop with the client): the real sinfo, given a slurm.conf whose controller port
nobody listens on. The notebook goes on and says why; with SLURM = True it stops, saying to set SLURM = False."""
import shutil
import socket

import pytest

from course_lib.ckpt import requeue

pytestmark = pytest.mark.skipif(shutil.which("sinfo") is None or shutil.which("sbatch") is None,
                                reason="needs Slurm's client (sinfo, sbatch) installed")


@pytest.fixture
def no_controller(tmp_path, monkeypatch):
    with socket.socket() as s:            # a port free now: nobody answers there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=nobody\nSlurmctldHost=localhost\nSlurmctldPort={port}\nMessageTimeout=2\n"
                    "NodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=localhost Default=YES\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.delenv("COURSE_ENGINE", raising=False)


def test_no_controller_skips_the_job_and_says_why(no_controller):
    run, why = requeue.should_run(None, quick=False)
    assert not run and "no Slurm controller answers" in why, why


def test_no_controller_with_slurm_true_says_to_set_it_false(no_controller):
    with pytest.raises(requeue.RequeueError, match="set SLURM = False in the parameters cell"):
        requeue.should_run(True, quick=False)


def test_quick_and_false_never_ask_slurm(no_controller):
    assert requeue.should_run(None, quick=True) == (False, "a quick run")
    assert requeue.should_run(False, quick=False) == (False, "SLURM = False")
