"""Notebook 07's bug hunt: the broken files fail as the notebook says, and the run's summary names the rank whose
failure is the cause, or says that the errors cannot tell (real ranks, gloo, a deadline; course_lib.runs.launch
as the notebook calls it, on this machine's processes)."""
import pytest
from conftest import ROOT

from course_lib import bughunt
from course_lib.runs import launch

HUNT = ROOT / "exercises" / "07_bughunt"


def run(name: str, **env):
    env = {"BUG_TIMEOUT": "5", "COURSE_ENGINE": "local", **env}
    return launch([f"{name}.py"], nprocs=2, timeout=90, env=env, cwd=HUNT, on_line=None, engine="local")


@pytest.mark.parametrize("name, head", [
    ("collective", "every rank that failed only waited for another"),      # both time out: no rank is the cause
    ("rendezvous", "rank 1 failed on its own"),                            # rank 0's timeout follows from it
    ("oom", "rank 1 failed on its own"),                                   # rank 0 lost its peer
])
def test_the_summary_names_the_rank_whose_failure_is_the_cause(name, head):
    result = run(name)
    text = bughunt.summary(result)
    assert not result.ok and text.startswith(head), text
    assert "failed first" not in text.splitlines()[0], text


def test_the_files_name_no_cause():
    """The exercise files' comments and docstrings do not state the bug (notebook 07 cell 0's promise)."""
    told = {"collective.py": "only rank 0", "sampler.py": "nothing tells the sampler",
            "rendezvous.py": "does not export", "oom.py": "the rest", "gpu_job.sbatch": "cuda:LOCAL_RANK"}
    for name, giveaway in told.items():
        assert giveaway not in (HUNT / name).read_text(), name
    assert "solutions/" not in (HUNT / "gpu_job.sbatch").read_text()


def test_no_cause_before_the_learner_has_named_it():
    """Notebook 07 (and the README's course table) name no bug's cause before the question that asks for it:
    no cell before a quiz question holds its answer, and bug 5's fix (--gpus-per-node, --gpu-bind, cuda:0) and
    the checker's output on its job script come only after quiz 07-gpus."""
    import json

    import tomllib

    cells = json.loads((ROOT / "notebooks" / "07_bug_hunt.ipynb").read_text())["cells"]
    texts = ["".join(c["source"]) for c in cells]
    key = tomllib.loads((ROOT / "solutions" / "answers" / "07.toml").read_text())
    for qid, entry in key.items():
        asked = next((i for i, t in enumerate(texts) if f'"{qid}"' in t), None)
        if asked is None or len(entry.get("answer", "")) < 12:      # "yes", "no": words any text holds
            continue
        before = "\n".join(texts[:asked])
        assert entry["answer"] not in before, (qid, entry["answer"])
    gpus = next(i for i, t in enumerate(texts) if '"07-gpus"' in t)
    for giveaway in ("--gpus-per-node", "gpu-bind", "cuda:LOCAL_RANK", "the one visible GPU", "sbatch_check.check("):
        assert giveaway not in "\n".join(texts[:gpus]), giveaway
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `07_bug_hunt`"))
    for cause in ("set_epoch", "MASTER_ADDR", "rank-0", "--gpus-per-task", "out of memory"):
        assert cause not in row, cause
