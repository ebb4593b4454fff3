"""Follow a job live: an ipywidgets panel in Jupyter, a tqdm bar in a terminal.

Both show the same things: state, time since submission, epochs done (parsed from the log) out of the
``--epochs`` the job was given, and, in Jupyter, the log's last lines. At the end a job that did not
complete shows its state, reason and the log's tail. Not tqdm.auto alone: its notebook bar has no room for the
job's state, reason and last log lines.
"""
from __future__ import annotations

import html
import sys

from course_lib.runtime.waiting import wait

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


def _headline(job) -> str:
    state = job.state
    text = f"job {job.id} ({job.name}, {job.engine}): {state}, {job.elapsed:.0f} s"
    if job.reason and state != "COMPLETED":
        text += f" ({job.reason})"
    return text


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
        colour = COLOURS.get(state, "#cf222e")
        self.head.value = f"<b style='color:{colour}'>{html.escape(_headline(job))}</b>"
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
