"""Why a check was stopped, in words a learner can act on: the process, memory and file-size limits, the deadline
(docs/grading.md, "When a limit stopped the check"). ``limits_hit`` finds the cause from the cgroup's counters
where there is a cgroup, else from the symptom's text; ``annotate`` puts it in front of each failing verdict and
keeps only the verdict's first line (the tracebacks, with the grader's paths, stay in logs/).
"""
import re
import signal

PROCESSES, MEMORY, FILE_SIZE, DEADLINE = "processes", "memory", "file size", "deadline"

# what a refused fork or thread looks like: EAGAIN from fork/clone (Python, gloo's std::system_error, glibc)
_NO_PROCESS = re.compile(r"Resource temporarily unavailable|BlockingIOError: \[Errno 11\]|can't start new thread"
                         r"|fork failed|Cannot allocate thread|pthread_create failed")
_TOO_LARGE = re.compile(r"File too large|\[Errno 27\]")
# what a refused allocation looks like; read only where a memory limit holds and no counter can be read (a
# systemd scope): elsewhere the cgroup's oom_kill counter decides, and without a cgroup there is no memory limit
# (a checker's "out of memory?" guess about a killed rank, or CUDA's, is no sign of this limit)
_NO_MEMORY = re.compile(r"\bMemoryError\b|Cannot allocate memory|std::bad_alloc")


def limits_hit(outcome, texts: str = "") -> list[str]:
    """The limits that stopped this check: PROCESSES, MEMORY, FILE_SIZE, DEADLINE (in that order, each once).

    ``outcome``: a sandbox Outcome (events, timed_out, returncode, output); ``texts``: the verdicts' messages."""
    seen = outcome.output + "\n" + texts
    events = outcome.events or {}
    hit = []
    if events.get("pids", 0) > 0 or ("pids" not in events and _NO_PROCESS.search(seen)):
        hit.append(PROCESSES)
    if events.get("oom", 0) > 0 or (outcome.isolation == "systemd scope" and _NO_MEMORY.search(seen)):
        hit.append(MEMORY)
    if _TOO_LARGE.search(seen) or outcome.returncode == -signal.SIGXFSZ:
        hit.append(FILE_SIZE)
    if outcome.timed_out:
        hit.append(DEADLINE)
    return hit


def explain(limit: str, limits) -> str:
    """One limit, for the learner: which, how much, and what to look for in their code."""
    if limit == PROCESSES:
        return (f"Stopped by the grader's process limit: a check may have at most {limits.max_processes} processes "
                "and threads together, and yours reached it, so the next one could not start (the operating system "
                "answers \"Resource temporarily unavailable\", Python \"can't start new thread\"). Look for processes "
                "or threads started in a loop or at import time (os.fork, subprocess, multiprocessing, threading): "
                "the checker starts the ranks itself, your code should start none.")
    if limit == MEMORY:
        return (f"Stopped by the grader's memory limit: {limits.memory_mb} MB for the whole check, all ranks "
                "together, and a process that asked for more was refused or killed. Look for tensors that grow at "
                "every step, copies kept in a list, or a buffer far larger than the tensor being reduced.")
    if limit == FILE_SIZE:
        return (f"Stopped by the grader's file-size limit: no file may grow past {limits.max_file_mb} MB "
                "(\"File too large\"). Your code wrote more than that: write only what the exercise asks for.")
    return (f"Stopped by the grader's deadline: the check did not finish within {limits.deadline:.0f} s and was "
            "stopped. Your code may wait forever (a recv nobody sends to, a collective not every rank calls, an "
            "input() at import) or loop.")


def annotate(rows: list[dict], outcome, limits) -> list[dict]:
    """The rows with the cause in front of each failing one (and its first line only); unchanged when no limit
    stopped the check."""
    hit = [h for h in limits_hit(outcome, "\n".join(r["message"] for r in rows)) if h != DEADLINE or outcome.verdicts]
    if not hit:
        return rows
    cause = "\n".join(explain(h, limits) for h in hit)
    out = []
    for r in rows:
        if r["result"] == "fail":
            first = r["message"].strip().splitlines()[0] if r["message"].strip() else ""
            r = {**r, "message": cause + (f"\nWhat the check saw: {first}" if first else "")}
        out.append(r)
    return out
