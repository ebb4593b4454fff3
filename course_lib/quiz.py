"""Predict, then run; a short quiz at the end of each notebook.

    from course_lib import quiz
    quiz.predict("02-speedup", "How many times faster will 2 ranks train than 1?")            # a number
    quiz.predict("01-workers", "Two loader workers will make an epoch ...", ["faster", "the same", "slower"])
    ... the run ...
    quiz.reveal("02-speedup", measured_speedup, unit="x")  # your prediction next to what happened
    quiz.ask("05-ring-bytes", "How many bytes does each rank send in a ring all-reduce?", [...])  # keyed

A prediction is committed with a button before the run and cannot be changed afterwards. Run All does not wait
for a click, so the widget says up front to run the cells one by one, and a reveal without a prediction says the
same (and closes that question's widget: its answer is out). The learner's answers
go to ``out/answers/<notebook>.json`` in their workspace. Questions with a fixed answer (``ask``) have their key
and explanation in ``solutions/answers/<notebook>.toml`` (read from the course install, never shown before the
learner commits); ``course release --check`` checks that every key exists (``sync_problems``). A ``predict``
may have a key too: with an ``answer`` when the outcome is fixed (it is then scored), or only a ``why`` that
``reveal`` prints next to the measured truth.

Headless runs (papermill, CI) cannot click: ``quiz.AUTO = "key"`` commits the key's answer for every question
(the solutions run), ``"first"`` commits the first choice (the exercises run); a ``predict`` without choices then
commits 0. Notebooks set it from their ``ANSWERS`` parameter.
"""
import ast
import json
import re

from course_lib.core import atomic
from course_lib.core.paths import course_root, out_dir

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

AUTO: str | None = None          # None: widgets; "key" or "first": commit without a click (headless runs)
QID = re.compile(r"^(\d\d)-[a-z0-9-]+$")
RUN_ALL = "Run All does not wait for your answer: run the cells one by one (Shift+Enter) to predict first."
_open: dict = {}                 # qid -> (close, the widget's output) of a question shown and not yet committed
_told: set = set()               # (notebook, "widget" or "reveal") where RUN_ALL was said: once each, not every time


def _notebook(qid: str) -> str:
    m = QID.match(qid)
    if not m:
        raise ValueError(f"question id {qid!r} must look like '02-speedup' (notebook number, then a name)")
    return m.group(1)


def keys(notebook: str) -> dict:
    """The answer key of one notebook ("02"): {qid: {"answer": ..., "why": ...}} (empty when there is none)."""
    path = course_root() / "solutions" / "answers" / f"{notebook}.toml"
    return tomllib.loads(path.read_text()) if path.exists() else {}


def _answers_file(notebook: str):
    return out_dir() / "answers" / f"{notebook}.json"


def answers(notebook: str) -> dict:
    """What this learner committed in one notebook: {qid: answer}."""
    path = _answers_file(notebook)
    return json.loads(path.read_text()) if path.exists() else {}


def _commit(qid: str, value) -> None:
    notebook = _notebook(qid)
    done = answers(notebook)
    done[qid] = value
    path = _answers_file(notebook)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(done, indent=1))


def _auto_value(qid: str, choices):
    if AUTO == "key":
        key = keys(_notebook(qid)).get(qid, {})
        if "answer" in key:
            return key["answer"]
    return choices[0] if choices else 0.0


def _verdict(qid: str, value) -> str:
    key = keys(_notebook(qid)).get(qid)
    if key is None or "answer" not in key:
        return key.get("why", "") if key else ""
    mark = "right" if value == key["answer"] else f"not quite: the answer is {key['answer']!r}"
    return f"{mark}. {key.get('why', '')}".strip()


def _widget(qid, question, choices, on_commit):
    """Radio buttons (or a number box) and a Commit button; the answer is frozen once committed."""
    import ipywidgets as w
    from IPython.display import display

    box = (w.RadioButtons(options=list(choices), value=None, layout={"width": "max-content"}) if choices
           else w.FloatText(description="your guess"))
    button, out = w.Button(description="Commit", button_style="primary"), w.Output()

    def close():
        box.disabled = button.disabled = True
        _open.pop(qid, None)

    def click(_):
        if choices and box.value is None:
            with out:
                print("choose an answer first")
            return
        close()
        with out:
            on_commit(box.value)
    button.on_click(click)
    _open[qid] = (close, out)
    display(w.VBox([w.HTML(f"<b>{question}</b>" + _once(qid, "widget", f"<br><i>{RUN_ALL}</i>")), box, button, out]))


def _once(qid: str, where: str, text: str) -> str:
    """``text`` the first time in this kernel for ``qid``'s notebook and ``where``, "" after: the same line under
    every question and every reveal was read once and then skipped."""
    said = (_notebook(qid), where)
    if said in _told:
        return ""
    _told.add(said)
    return text


def _ask(qid, question, choices, on_commit):
    _notebook(qid)          # a malformed id fails here, not after the learner's click
    if AUTO is None:
        try:
            return _widget(qid, question, choices, on_commit)
        except ImportError:
            pass
    value = _auto_value(qid, choices)
    print(f"{question}\n  committed: {value!r}")
    on_commit(value)


def predict(qid: str, question: str, choices=None) -> None:
    """Ask for a prediction before the run; ``reveal`` shows it next to what happened."""
    _ask(qid, question, choices, lambda v: (_commit(qid, v), print("committed; now run the next cells")))


def ask(qid: str, question: str, choices) -> None:
    """A question with a fixed answer (in the key): right or not, and why, right after the commit."""
    _ask(qid, question, choices, lambda v: (_commit(qid, v), print(_verdict(qid, v) or "committed")))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def figure(value, unit: str = "") -> str:
    """A number as a person reads it: three significant digits and its unit ("2.21 s", "57%", "1.84x"); a choice
    in quotes, so that it stands out from the sentence around it."""
    if not _is_number(value):
        return repr(value) if isinstance(value, str) else str(value)
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"    # 12,345 images, not 1.23e+04
    return text + ("" if not unit else unit if unit in ("%", "x") else f" {unit}")


def reveal(qid: str, truth, note: str = "", unit: str = "") -> None:
    """Print the committed prediction next to ``truth`` (a number, in ``unit``, or one of the choices).

    Prints and returns nothing, so that a reveal on a cell's last line is not shown a second time as its value.
    A question still open (Run All went past it) is closed: its answer is out now."""
    print(reveal_text(qid, truth, note, unit))
    if qid in _open:
        close, out = _open[qid]
        close()
        with out:
            print("closed: its answer is out below. Run this cell again to predict, then the next ones one by one.")


def reveal_text(qid: str, truth, note: str = "", unit: str = "") -> str:
    """What ``reveal`` prints."""
    guess = answers(_notebook(qid)).get(qid)
    if guess is None:
        told = _once(qid, "reveal", " (Run All does not wait for an answer: run the cells one by one to predict first)")
        text = f"you made no prediction for this one{told}\nWhat happened: {figure(truth, unit)}"
    elif _is_number(truth) and _is_number(guess):
        off = abs(guess - truth) / abs(truth) if truth else abs(guess)
        text = f"you predicted {figure(guess, unit)}; measured {figure(truth, unit)} ({off:.0%} off)"
    else:
        text = f"you predicted {figure(guess, unit)}; what happened: {figure(truth, unit)}"
        text += " (right)" if guess == truth else ""
    key = keys(_notebook(qid)).get(qid, {})
    return text + "".join(f"\n{t}" for t in (note, key.get("why", "")) if t)


def quiz(questions) -> None:
    """The end-of-notebook quiz: ``questions`` is a list of (qid, question, choices), each checked on commit."""
    for qid, question, choices in questions:
        ask(qid, question, choices)


def score(notebook: str) -> tuple[int, int]:
    """(right, keyed questions) for this learner in one notebook."""
    key, done = keys(notebook), answers(notebook)
    scored = {q: k for q, k in key.items() if "answer" in k}
    return sum(done.get(q) == k["answer"] for q, k in scored.items()), len(scored)


def _literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return None      # built at run time (an f-string, a variable): not checkable here


def questions(source: str) -> dict:
    """{qid: (kind, choices)} for the literal ``quiz.predict/ask/quiz`` calls in one notebook's code."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "quiz"):
            continue
        args = [_literal(a) for a in node.args]
        if node.func.attr in ("predict", "ask") and args and isinstance(args[0], str):
            found[args[0]] = (node.func.attr, args[2] if len(args) > 2 else None)
        elif node.func.attr == "quiz" and node.args and isinstance(node.args[0], ast.List):
            for item in node.args[0].elts:      # (qid, question, choices); the question may be an f-string
                parts = [_literal(e) for e in item.elts] if isinstance(item, ast.Tuple) else []
                if len(parts) == 3 and isinstance(parts[0], str):
                    found[parts[0]] = ("ask", parts[2])
    return found


def _notebook_code(path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c["cell_type"] == "code"]
    return "\n".join(line for line in "\n".join(code).splitlines() if not line.lstrip().startswith(("%", "!")))


def sync_problems(notebooks_dir, answers_dir) -> list[str]:
    """What is out of step between the notebooks' questions and the keys in ``answers_dir``: a quiz question
    without a key, a key answer that is not one of the choices, a key that no notebook asks."""
    problems, asked = [], set()
    for nb_path in sorted(notebooks_dir.glob("[0-9][0-9]_*.ipynb")):
        number = nb_path.name[:2]
        key_path = answers_dir / f"{number}.toml"
        key = tomllib.loads(key_path.read_text()) if key_path.exists() else {}
        for qid, (kind, choices) in questions(_notebook_code(nb_path)).items():
            asked.add(qid)
            where = f"{nb_path.name}: {qid}"
            if not qid.startswith(number + "-"):
                problems.append(f"{where}: the id must start with {number}- (its notebook)")
            entry = key.get(qid)
            if entry is None:
                if kind == "ask":
                    problems.append(f"{where}: no key in {key_path.name} (answer and why)")
                continue
            if "answer" in entry and choices is not None and entry["answer"] not in choices:
                problems.append(f"{where}: the key's answer {entry['answer']!r} is not one of the choices")
            if kind == "ask" and not entry.get("why"):
                problems.append(f"{where}: the key has no 'why' (the explanation shown after the commit)")
    for key_path in sorted(answers_dir.glob("*.toml")):
        problems += [f"{key_path.name}: {qid} is asked in no notebook" for qid in tomllib.loads(key_path.read_text())
                     if qid not in asked]
    return problems
