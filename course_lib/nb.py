"""What every notebook of the course shares: where the files are, and how a check is shown.

Notebook protocol (papermill ``parameters`` cell in each notebook)::

    TREE = "exercises"                          # "solutions": run against the reference files
    QUICK = os.environ.get("COURSE_QUICK") == "1"   # small settings (CI, a first look)
    STRICT = False                              # True: a failing check stops the notebook (CI on solutions)
"""
import contextlib
import html
import importlib
import io
from pathlib import Path

from course_lib import quiz  # noqa: F401 - the notebooks' questions: nb.quiz.ask(...), quiz.AUTO

# what a notebook needs of course_lib's core, in one place: notebooks import these from here, not from core
from course_lib.core.loader import import_path  # noqa: F401 - for notebooks and the scripts they write
from course_lib.core.paths import out_dir, tree_dir  # noqa: F401
from course_lib.core.report import Report  # noqa: F401
from course_lib.registry import EXERCISES, file_of, get

TREES = ("exercises", "solutions")


def exercise_path(tree: str, relative: str) -> Path:
    """``exercise_path("exercises", "02_ddp/mnist_classify_ddp.py")`` -> the absolute path of that file."""
    if tree not in TREES:
        raise ValueError(f"TREE must be one of {TREES}, not {tree!r}")
    return tree_dir(tree) / relative


def exercise(name: str, tree: str = "exercises") -> Path:
    """The file (or folder) of exercise ``name`` (course_lib.registry) in the notebook's tree: ``exercise("zero",
    TREE)``. A notebook names its exercise, never its path."""
    return exercise_path(tree, file_of(name))


# course_lib's topics that no exercise of the registry names: a notebook reaches them by these names
TOPICS = ("bughunt", "instructor", "jobs", "lessons", "runs", "trace")


def topic(name: str):
    """The helpers a notebook uses around a topic, one call per topic: ``tp = nb.topic("tp")``, then ``tp.plots``,
    ``tp.grid.reference_rank_groups``. ``name`` is an exercise of the registry (its checker's package) or one of
    ``TOPICS``; the package's modules are imported when first named."""
    if name in EXERCISES:
        package = EXERCISES[name].checker.rsplit(".", 1)[0]
    elif name in TOPICS:
        package = f"course_lib.{name}"
    else:
        raise ValueError(f"no topic {name!r}: choose an exercise ({', '.join(EXERCISES)}) or one of {TOPICS}")
    module = importlib.import_module(package)
    return _Topic(module) if hasattr(module, "__path__") else module


class _Topic:
    """A package whose modules are its attributes, each imported when first used (``import course_lib.tp`` alone
    does not import course_lib.tp.plots)."""

    def __init__(self, package):
        self._package = package

    def __getattr__(self, attr: str):
        try:
            return getattr(self._package, attr)
        except AttributeError:
            if attr.startswith("_"):      # IPython's probes (_repr_html_, ...) are no modules
                raise
        name = f"{self._package.__name__}.{attr}"
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:            # the module is there but needs one that is not
                raise
            raise AttributeError(f"{self._package.__name__} has no {attr!r}") from None

    def __repr__(self) -> str:
        return f"<topic {self._package.__name__}>"


def mine_or_reference(name: str, path, report):
    """(module, the path it came from) for a lesson's small exercise file: the learner's when ``report`` passed,
    else the reference solution's, saying so (course_lib.lessons.use)."""
    from course_lib.lessons.use import learner_or_reference
    return learner_or_reference(path, report, get(name).file)


def launch(script_args, nprocs: int = 2, **options):
    """Run ``python *script_args`` as ``nprocs`` ranks, here or as a Slurm job where the site profile says
    ``runs = "slurm"``: course_lib.runs.launch (its options and its LaunchResult)."""
    from course_lib.runs import launch as run
    return run(script_args, nprocs, **options)


def check(name: str, path, **options):
    """``course check NAME PATH`` from a notebook: course_lib.check.check, its Report (show it with ``show``)."""
    from course_lib.check import check as run_check
    return run_check(name, str(path), **options)


def show(report, strict: bool = False):
    """Display a check report (a table in Jupyter, text elsewhere); with ``strict`` a failure raises."""
    try:
        from IPython.display import display
        display(report)
    except ImportError:
        print(report.text())
    if strict and not report.passed:
        raise AssertionError("check failed (STRICT=True):\n" + report.text())
    return report


def warn(text: str) -> None:
    """A warning the learner reads before what follows it: a framed box in Jupyter, a ``WARNING:`` line elsewhere."""
    plain = f"WARNING: {text}"
    try:
        from IPython.display import display
    except ImportError:
        print(plain)
        return
    box = ("<div style='border-left:4px solid #9a6700;background:#fff8c5;padding:6px 10px;margin:4px 0'>"
           f"<b>Warning.</b> {html.escape(text)}</div>")
    display({"text/html": box, "text/plain": plain}, raw=True)


def figure_widget(draw, **controls) -> None:
    """Call ``draw(**values)`` under one control per keyword and show its figure and printout; redraw on change.

    ``controls``: name -> ``(options, value)``; a ``range`` gives a slider, a list a drop-down. ``draw`` makes one
    matplotlib figure and does not call ``plt.show()``. The figure goes into an Image widget, not through
    ``ipywidgets.interact``: interact prints into an Output widget, and nbclient (papermill, CI) answers each
    Output-widget output on the kernel's shell channel while it waits on that channel for the cell's reply; the
    run can then hang (jupyter/nbclient#312, reproduced here). Without ipywidgets it draws once.
    """
    try:
        from IPython.display import display
        panel = figure_panel(draw, **controls)
    except ImportError:
        import matplotlib.pyplot as plt
        draw(**{name: value for name, (_, value) in controls.items()})
        plt.show()
        return
    display(panel)


def figure_panel(draw, **controls):
    """The widgets of ``figure_widget``, not displayed: a row of controls, the image, the printout."""
    import ipywidgets as w
    boxes = {name: (w.IntSlider(value=value, min=options.start, max=options.stop - 1, description=name)
                    if isinstance(options, range) else w.Dropdown(options=list(options), value=value, description=name))
             for name, (options, value) in controls.items()}
    image, text = w.Image(format="png"), w.HTML()

    def redraw(_=None):
        image.value, printed = _render(draw, {name: box.value for name, box in boxes.items()})
        text.value = f"<pre>{html.escape(printed)}</pre>" if printed else ""
    for box in boxes.values():
        box.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox(list(boxes.values()), layout={"flex_flow": "row wrap"}), image, text])


def _render(draw, values) -> tuple[bytes, str]:
    """PNG bytes of the figure ``draw(**values)`` makes, and what it printed; the figure is closed."""
    import matplotlib.pyplot as plt
    printed = io.StringIO()
    with plt.ioff(), contextlib.redirect_stdout(printed):
        draw(**values)
        fig = plt.gcf()
    png = io.BytesIO()
    fig.savefig(png, format="png", bbox_inches="tight")
    plt.close(fig)
    return png.getvalue(), printed.getvalue()
