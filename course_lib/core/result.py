"""What a multi-process run gives back, wherever it ran (here, or as a Slurm job: course_lib.runs): each rank's exit
code and last lines, the deadline, the first rank that failed.

A run in a job sends its ranks' lines to the submitter through a file in the job's folder, one ``RANK<TAB>text``
line per line (rank -1: the launcher's own messages), and its outcome as JSON (``to_dict``/``from_dict``).
"""
from collections import deque
from dataclasses import dataclass, field

LINES_NAME = "ranks.log"      # the job's rank lines, as they come
RESULT_NAME = "result.json"   # the job's LaunchResult, at its end


@dataclass
class RankResult:
    rank: int
    returncode: int | None = None     # None: still running when stopped (deadline or another rank failed)
    lines: deque = field(default_factory=lambda: deque(maxlen=200))

    def tail(self, n: int = 10) -> list[str]:
        return list(self.lines)[-n:]


@dataclass
class LaunchResult:
    style: str
    nprocs: int
    ranks: list[RankResult]
    timed_out: bool = False
    failed_rank: int | None = None    # the first rank seen failing
    elapsed: float = 0.0
    returncode: int | None = None     # torchrun's own exit code (style="torchrun")
    launcher_lines: deque = field(default_factory=lambda: deque(maxlen=200))   # torchrun's own messages
    partial: dict = field(default_factory=dict, repr=False)   # torchrun: rank -> a line cut short
    job: str = ""                     # the Slurm job that ran it (course_lib.runs); "" here

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(r.returncode == 0 for r in self.ranks)

    @property
    def stuck_ranks(self) -> list[int]:
        return [r.rank for r in self.ranks if r.returncode is None]

    def output(self, rank: int | None = None) -> str:
        """The kept lines of one rank (or all, prefixed) as text."""
        if rank is not None:
            return "\n".join(self.ranks[rank].lines)
        return "\n".join(f"[rank {r.rank}] {line}" for r in self.ranks for line in r.lines)

    def summary(self, tail: int = 5) -> str:
        """One line on the outcome, then the last lines of each rank that did not finish cleanly."""
        if self.ok:
            return f"{self.nprocs} ranks ({self.style}) finished in {self.elapsed:.1f} s"
        if self.timed_out:
            head = (f"deadline of {self.elapsed:.0f} s reached; ranks {self.stuck_ranks} were still running "
                    "(a collective that not every rank calls, or a send without a matching receive, waits forever)")
        else:
            codes = ", ".join(f"rank {r.rank}: {'stopped' if r.returncode is None else r.returncode}"
                              for r in self.ranks)
            head = f"rank {self.failed_rank} failed first (exit codes: {codes})"
        parts = [head]
        for r in self.ranks:
            if r.returncode != 0 and r.lines:
                parts.append(f"--- last lines of rank {r.rank}:")
                parts.extend("    " + line for line in r.tail(tail))
        return "\n".join(parts)

    def to_dict(self) -> dict:
        return {"style": self.style, "nprocs": self.nprocs, "timed_out": self.timed_out,
                "failed_rank": self.failed_rank, "elapsed": self.elapsed, "returncode": self.returncode,
                "codes": [r.returncode for r in self.ranks]}

    def deliver(self, rank: int, text: str, on_line=None) -> None:
        """Keep ``text`` as a line of ``rank`` (-1: the launcher's) and show it to ``on_line``."""
        if 0 <= rank < self.nprocs:
            self.ranks[rank].lines.append(text)
        else:
            self.launcher_lines.append(text)
        if on_line is not None:
            on_line(rank, text)


def line_record(rank: int, text: str) -> str:
    """One line of LINES_NAME."""
    return f"{rank}\t{text}\n"


def parse_record(line: str) -> tuple[int, str] | None:
    """``(rank, text)`` of one LINES_NAME line, None for anything else."""
    rank, sep, text = line.rstrip("\n").partition("\t")
    try:
        return (int(rank), text) if sep else None
    except ValueError:
        return None
