"""The exercises of the course, in one place: name -> file, checker or cases, notebook, how to recognise a stray file.

``check``, ``grade``, ``release``, ``bench`` and the notebooks look exercises up here; nothing else lists them.
"""
import importlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePath


@dataclass(frozen=True)
class Exercise:
    name: str            # what the commands call it: course check NAME
    file: str            # the same path under exercises/ and solutions/
    checker: str         # module with ``check(path, **options) -> Report``: its own, or a cases module (``cases``)
    notebook: str        # the notebook that teaches it
    name_tokens: tuple   # a lone file whose name holds one of these is this exercise
    defines: str         # ... else a file whose text matches this regex
    cases: bool = False  # ``checker`` holds cases that course_lib.checking runs (README: "Add an exercise")
    title: str = ""      # what it asks for, in a few words (course check --help, course --help)
    slurm_cpus: int = 2  # CPUs a check job asks for on Slurm: the most ranks its checker runs at once
    # a checker not run by course_lib.checking: (launches one after the other at most, the default ``timeout`` of
    # each): the local check's overall deadline (course_lib.check_local); cases modules give theirs themselves
    rounds: tuple = ()
    deadlock: str = ""   # the case of tests/<name>_faulty/cases.py that deadlocks (tools/bench_checks.py --deadlock)
    strict_launchers: bool = False   # its checker takes strict_launchers= (course check/grade --strict-launchers)
    runs_here: bool = False  # its check submits a job of its own: never run as a check job on Slurm

    @property
    def folder(self) -> str:
        """Its folder under exercises/ and solutions/ (which may hold more of its files: ckpt's requeue.sbatch)."""
        return PurePath(self.file).parent.as_posix()

    def check(self, path, **options):
        """Run this exercise's checker on ``path``; returns a course_lib.core.report.Report."""
        return importlib.import_module(self.checker).check(str(path), **options)

    def cases_module(self):
        """The module of this exercise's cases (``ITEMS``, ``FILE``, ``GUARD``, ``cases(world)``), its protocol
        attributes checked as it is imported (course_lib.checking.protocol: a misspelt one is a ProtocolError)."""
        if not self.cases:
            raise ValueError(f"{self.name} has a checker of its own, not a cases module")
        from course_lib.checking.protocol import plugin
        module = importlib.import_module(self.checker)
        plugin(module)
        return module

    def recognises_name(self, filename: str) -> bool:
        """A word of the file's name is one of the tokens, or the name holds a long one (mnist_v2, tensor_par)."""
        name = filename.lower()
        words = set(re.split(r"[^a-z0-9]+", PurePath(name).stem))
        return any(t in words or (len(t) > 3 and t in name) for t in self.name_tokens)


# in the order of the course
EXERCISES: dict[str, Exercise] = {e.name: e for e in (
    Exercise("step", "01_tuning/step.py", "course_lib.lessons.step_check", "01_serial_mnist",
             ("step",), r"def\s+time_steps\s*\(", title="time a training step; mixed precision",
             slurm_cpus=1, rounds=(1, 120.0)),
    Exercise("ddp", "02_ddp/mnist_classify_ddp.py", "course_lib.ddp.check", "02_ddp_six_steps",
             ("ddp", "mnist"), r"DistributedDataParallel|def\s+train\s*\(", title="the six steps to DDP",
             slurm_cpus=3, rounds=(3, 120.0), deadlock="hang_allreduce_rank0", strict_launchers=True),
    Exercise("sbatch", "03_jobs/ddp.sbatch", "course_lib.sbatch.check", "03_launching_jobs",
             ("sbatch",), r"(?m)^#SBATCH", title="a Slurm job script for the DDP training", rounds=(1, 180.0),
             runs_here=True),
    Exercise("schedule", "04_scaling/schedule.py", "course_lib.lessons.schedule_check", "04_scaling_study",
             ("schedule",), r"def\s+lr_at\s*\(", title="learning-rate warm-up, scaling rows, GPU hours",
             slurm_cpus=1, rounds=(1, 120.0)),
    Exercise("allreduce", "05_allreduce/allreduce.py", "course_lib.allreduce.cases", "05_allreduce_algorithms",
             ("allreduce",), r"def\s+ring_allreduce", cases=True, title="ring and tree all-reduce",
             slurm_cpus=5, deadlock="ring_send_before_recv"),
    Exercise("tp", "06_tensor_parallel/tp.py", "course_lib.tp.cases", "06_tensor_parallelism",
             ("tp", "tensor"), r"class\s+ColumnParallelLinear", cases=True, title="tensor-parallel linear layers",
             slurm_cpus=4, deadlock="init_groups_rank0_only"),
    Exercise("cp", "11_context_parallel/cp.py", "course_lib.cp.cases", "11_context_parallelism",
             ("cp", "context"), r"def\s+ring_attention", cases=True, title="ring attention"),
    Exercise("ownddp", "10_own_ddp/own_ddp.py", "course_lib.owndp.cases", "10_write_ddp_yourself",
             ("ownddp", "own_ddp"), r"class\s+BucketedDDP", cases=True, title="DDP with gradient buckets",
             slurm_cpus=3),
    Exercise("ckpt", "08_checkpoint/snapshot.py", "course_lib.ckpt.cases", "08_checkpoint_restart",
             ("ckpt", "checkpoint", "snapshot"), r"def\s+save_snapshot\s*\(", cases=True,
             title="save and resume a snapshot", slurm_cpus=2, rounds=(3, 240.0), deadlock="gather_on_rank0_only"),
    Exercise("zero", "09_zero/zero.py", "course_lib.zero.cases", "09_sharded_data_parallel",
             ("zero",), r"class\s+ZeroOptimizer", cases=True, title="a ZeRO-1 sharded optimizer",
             slurm_cpus=4, deadlock="all_gather_blocking_send"),
    Exercise("pp", "12_pipeline/pp.py", "course_lib.pp.cases", "12_pipeline_parallelism",
             ("pp", "pipeline"), r"def\s+one_f_one_b\s*\(", cases=True, title="a 1F1B pipeline schedule"),
)}


# solutions/ also holds folders that are no exercise, never released: the serial script notebooks 01 and 02 start
# from (a solution only: the DDP exercise is its diff) and the quiz keys.
SERIAL = "01_serial/mnist_classify.py"
SOLUTIONS_ONLY = (PurePath(SERIAL).parts[0], "answers")
# files the notebooks hand the learner that nothing checks or grades, by the name a notebook calls them: the serial
# script, and notebook 07's scripts, bugs the learner runs and diagnoses in the notebook
UNCHECKED = {"serial": SERIAL, "bughunt": "07_bughunt"}


# The order in which a lone file is matched. By name: "allreduce" and "ckpt" before "ddp", since a learner's
# ddp_allreduce.py is the all-reduce exercise and ddp_ckpt.py the checkpoint one (it checkpoints a DDP training).
# By text: the DDP pattern (a train function) is the loosest, so it comes last.
# A job script (ddp.sbatch, #SBATCH lines) is the sbatch exercise whatever else its name says.
# own_ddp.py (and its text, which names DistributedDataParallel) is the write-DDP-yourself exercise, not "ddp".
NAME_ORDER = ("sbatch", "allreduce", "ckpt", "ownddp", "ddp", "tp")
TEXT_ORDER = ("sbatch", "allreduce", "tp", "ckpt", "ownddp", "ddp")


def _ordered(first: tuple) -> list[Exercise]:
    return sorted(EXERCISES.values(), key=lambda e: first.index(e.name) if e.name in first else len(first))


def guess(filename: str, text: str | None) -> tuple[str | None, str]:
    """Which exercise a lone file is, and how that was seen: by its name, else (given its text) by what it defines."""
    for ex in _ordered(NAME_ORDER):
        if ex.recognises_name(filename):
            return ex.name, "its name"
    for ex in _ordered(TEXT_ORDER) if text is not None else ():
        if re.search(ex.defines, text):
            return ex.name, "what it defines"
    return None, ""


def get(name: str) -> Exercise:
    try:
        return EXERCISES[name]
    except KeyError:
        raise KeyError(f"no exercise {name!r}: choose one of {', '.join(EXERCISES)}") from None


def file_of(name: str) -> str:
    """The path under exercises/ and solutions/ of exercise ``name``, or of an UNCHECKED file or folder."""
    return UNCHECKED[name] if name in UNCHECKED else get(name).file


def reference(name: str) -> Path:
    """The install's reference file (or folder) of exercise ``name`` or of an UNCHECKED one: the course's
    solutions/, whatever workspace the caller is in."""
    from course_lib.core.paths import course_root
    return course_root() / "solutions" / file_of(name)
