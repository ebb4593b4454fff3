"""Waiting for a job: ``wait``, the course's one loop that waits for a job (a run's, a check's, a grading array's,
one a notebook follows), and ``follow``, which shows it live: an ipywidgets panel in Jupyter (with the log's last
lines), a tqdm bar in a terminal (state, time since submission, epochs done out of the job's ``--epochs``). Not
submitit's Job.wait()/result(): they block until the end; what is said while queued and the deadlines are this
loop's. Not tqdm.auto alone: its notebook bar has no room for the job's state, reason and last log lines.
It imports nothing of the course's, so that Job.wait can use it.
"""
import html
import sys
import time

POLL = 1.0   # seconds between two looks at the job (squeue: a controller serves a whole room)
PLACE_EVERY = 10.0   # seconds between two looks at a pending job's place in the queue (two more squeue calls)


class JobError(RuntimeError):
    """The job gave no answer (refused, cancelled at a deadline, ended early); the message says why."""


def say_on_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cancel(job, why: str, error=JobError, queued: bool = False) -> JobError:
    """scancel ``job``; the error that says why and what it was (``.queued``: it never started)."""
    state, reason = job.state, job.reason
    job.cancel()
    e = error(f"job {job.id} cancelled (scancel {job.id}): {why}; it was {state}"
              + (f" (reason {reason})" if reason else "") + f", now {job.state}. Its folder: {job.run_dir}")
    e.queued = queued
    return e


def wait(job, queue_timeout: float = float("inf"), say=say_on_stderr, run_timeout: float | None = None,
         on_poll=None, stop=None, error=JobError, poll: float = POLL, timeout: float | None = None,
         interrupt_cancels: bool = True) -> None:
    """Until the job ends. Cancelled (``error`` raised) after ``queue_timeout`` s in the queue, ``run_timeout`` s
    running (None: its time limit + 60 s), or when ``stop`` (a threading.Event) is set. ``on_poll()`` runs at every
    look, every ``poll`` s (e.g. to pass on new lines); a true answer ends the wait (e.g. every task of an array has
    ended). ``timeout``: return after that many seconds, the job left as it is. ``say=None``: silent. Ctrl-C
    cancels the job, or, with ``interrupt_cancels=False``, only stops the waiting (raised either way)."""
    if run_timeout is None:
        run_timeout = job.spec.time_limit_s + 60 if job.spec is not None else float("inf")
    give_up = float("inf") if timeout is None else time.monotonic() + timeout
    started = None
    reason_said = place_said = None
    place_at = 0.0
    try:
        while True:
            state, now = job.state, time.monotonic()
            if job.done:   # the state just read (a Job keeps it a moment), or an end since: no TERMINAL import
                return
            if state == "PENDING":
                if say is not None:   # a silent wait asks nothing more of the controller
                    reason = job.reason or "None"
                    place = place_said
                    if now >= place_at:
                        place, place_at = job.queue_place(), now + PLACE_EVERY
                    if reason_said is None:
                        say(f"queued as job {job.id} (state PENDING, reason {reason}"
                            + (f"; {place})" if place else ")"))
                    elif reason != reason_said or place != place_said:   # the scheduler's first look comes later
                        say(f"job {job.id} still queued (reason {reason}" + (f"; {place})" if place else ")"))
                    reason_said, place_said = reason, place
                if now - job.submitted > queue_timeout:
                    raise cancel(job, f"it waited in the queue longer than {queue_timeout:.0f} s. The cluster is "
                                      "busy: try again later, or ask your instructor (a reservation?)", error, True)
            elif started is None:
                started = now
                if say is not None:
                    say(f"job {job.id} started ({state}); its log: {job.log_path}")
            elif now - started > run_timeout:
                raise cancel(job, f"it ran past its deadline ({run_timeout:.0f} s)", error)
            if stop is not None and stop.is_set():
                raise cancel(job, "stopped", error)
            if on_poll is not None and on_poll():
                return
            if now >= give_up:
                return
            time.sleep(poll)
    except KeyboardInterrupt:
        if interrupt_cancels:
            job.cancel()
            if say is not None:
                say(f"interrupted: job {job.id} cancelled")
        raise


COLOURS = {"COMPLETED": "#1a7f37", "RUNNING": "#0969da", "PENDING": "#9a6700"}
DEFAULT_EPOCHS = 14   # the training scripts' default --epochs


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where widgets can be shown), False in a terminal or plain python."""
    try:
        from IPython import get_ipython  # deferred: optional (a notebook's), as are the widgets below
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def follow(job, timeout: float | None = None, poll: float = 0.5, display: bool = True, tail: int = 8) -> None:
    """Poll ``job`` until it ends or ``timeout`` seconds pass, updating a display; Ctrl-C stops following."""
    view = (_Widget if in_notebook() else _Text)(job, tail) if display else None
    try:
        # watching only: no deadline cancels the job here, and Ctrl-C leaves it running
        wait(job, say=None, run_timeout=float("inf"), on_poll=view.update if view else None, poll=poll,
            timeout=timeout, interrupt_cancels=False)
    except KeyboardInterrupt:
        print(f"stopped following job {job.id}; it goes on (job.cancel() stops it)", file=sys.stderr)
    finally:
        if view:
            view.update()
            view.close()


class _Widget:
    def __init__(self, job, tail):
        import ipywidgets as w  # deferred: only in a notebook
        from IPython.display import display

        self.job, self.tail = job, tail
        self.total = job.spec.epochs(DEFAULT_EPOCHS)
        self.head = w.HTML()
        self.bar = w.IntProgress(value=0, min=0, max=self.total, description="epochs",
                                 layout=w.Layout(width="60%"))
        self.count = w.Label()
        self.lines = w.HTML()
        display(w.VBox([self.head, w.HBox([self.bar, self.count]), self.lines]))
        self.update()

    def update(self):
        job = self.job
        state = job.state
        head = f"job {job.id} ({job.name}, {job.engine}): {state}, {job.elapsed:.0f} s" + (
            f" ({job.reason})" if job.reason and state != "COMPLETED" else "")
        self.head.value = f"<b style='color:{COLOURS.get(state, '#cf222e')}'>{html.escape(head)}</b>"
        done = job.epochs_done()
        self.bar.value = min(done, self.total)
        self.bar.bar_style = {"COMPLETED": "success", "RUNNING": "info", "PENDING": ""}.get(state, "danger")
        self.count.value = f"{done}/{self.total}"
        text = job.summary() if job.done and state != "COMPLETED" else job.log(tail=self.tail)
        self.lines.value = f"<pre style='font-size:11px;line-height:1.2'>{html.escape(text)}</pre>"

    def close(self):
        pass   # the panel stays, showing how the job ended


class _Text:
    def __init__(self, job, tail):
        from tqdm import tqdm  # deferred: only in a terminal

        self.job = job
        self.bar = tqdm(total=job.spec.epochs(DEFAULT_EPOCHS), unit="epoch", desc=f"job {job.id}",
                        file=sys.stderr, dynamic_ncols=True, leave=True)

    def update(self):
        self.bar.n = min(self.job.epochs_done(), self.bar.total)
        self.bar.set_postfix_str(f"{self.job.state} {self.job.elapsed:.0f} s", refresh=True)

    def close(self):
        self.bar.close()
        if self.job.done:
            print(self.job.summary(), file=sys.stderr if self.job.state != "COMPLETED" else sys.stdout)
