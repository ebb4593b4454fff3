"""course_lib.quiz: predictions and quizzes in the notebooks, their keys in solutions/answers/, kept in step."""
import json
from pathlib import Path

import pytest
from conftest import ROOT

from course_lib import quiz

NOTEBOOK_CODE = '''
from course_lib import quiz
quiz.predict("07-speedup", "How many times faster?")
quiz.predict("07-order", "Which comes first?", ["a", "b"])
quiz.quiz([
    ("07-bytes", "How many bytes?", ["n", "2n"]),
    ("07-groups", f"built at {1 + 1}", ["x", "y"]),
])
'''


def write_notebook(folder: Path, name: str, code: str) -> None:
    cell = {"cell_type": "code", "metadata": {}, "source": code, "outputs": [], "execution_count": None}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


@pytest.fixture
def learner(tmp_path, monkeypatch):
    """Answers go to a temporary workspace; the keys are the real ones of notebook 08."""
    monkeypatch.setattr(quiz, "out_dir", lambda: tmp_path / "out")
    monkeypatch.setattr(quiz, "AUTO", None)
    monkeypatch.setattr(quiz, "_told", set())     # a fresh kernel: the Run All line not said yet
    return tmp_path


def test_questions_finds_literal_calls_and_their_choices():
    found = quiz.questions(NOTEBOOK_CODE)
    assert found["07-speedup"] == ("predict", None)
    assert found["07-order"] == ("predict", ["a", "b"])
    assert found["07-bytes"] == ("ask", ["n", "2n"])
    assert found["07-groups"] == ("ask", ["x", "y"])


def test_sync_problems_names_each_kind_of_mismatch(tmp_path):
    notebooks, answers = tmp_path / "notebooks", tmp_path / "answers"
    write_notebook(notebooks, "07_demo.ipynb", NOTEBOOK_CODE)
    answers.mkdir()
    (answers / "07.toml").write_text('["07-bytes"]\nanswer = "3n"\nwhy = "."\n\n'
                                     '["07-order"]\nwhy = "a first"\n\n["07-gone"]\nanswer = "x"\nwhy = "."\n')
    problems = quiz.sync_problems(notebooks, answers)
    assert any("07-bytes" in p and "not one of the choices" in p for p in problems), problems
    assert any("07-groups" in p and "no key" in p for p in problems), problems
    assert any("07-gone" in p and "asked in no notebook" in p for p in problems), problems
    assert not any("07-order" in p or "07-speedup" in p for p in problems), problems   # a prediction needs no answer
    (answers / "07.toml").write_text('["07-bytes"]\nanswer = "2n"\nwhy = "two halves"\n\n'
                                     '["07-groups"]\nanswer = "y"\nwhy = "."\n')
    assert quiz.sync_problems(notebooks, answers) == []


def test_every_question_of_the_course_has_its_key():
    """What `course release --check` runs: every notebook's quiz keyed, every key asked somewhere."""
    assert quiz.sync_problems(ROOT / "notebooks", ROOT / "solutions" / "answers") == []


@pytest.mark.parametrize("number", [f"{n:02d}" for n in range(7)])
def test_notebooks_00_to_06_predict_twice_and_end_with_a_quiz(number):
    nb_path = next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
    found = quiz.questions(quiz._notebook_code(nb_path))
    predictions = [q for q, (kind, _) in found.items() if kind == "predict"]
    keyed = [q for q, (kind, _) in found.items() if kind == "ask"]
    assert len(predictions) >= 2, f"{nb_path.name}: predictions {predictions}"
    assert len(keyed) >= 3, f"{nb_path.name}: quiz questions {keyed}"
    cells = json.loads(nb_path.read_text())["cells"]
    top = [c for c in cells[:3] if c["cell_type"] == "markdown"]
    text = "".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in top)
    assert "**You will**" in text and "**Time:**" in text, f"{nb_path.name}: objectives and time at the top"
    code = quiz._notebook_code(nb_path)
    for qid in predictions:
        assert f'quiz.reveal("{qid}"' in code, f"{nb_path.name}: {qid} is predicted but never revealed"


def test_headless_key_run_commits_the_key_and_says_right(learner, capsys):
    quiz.AUTO = "key"
    quiz.ask("08-atomic", "What is left?", ["the previous snapshot", "half a file that does not load"])
    assert quiz.answers("08") == {"08-atomic": "half a file that does not load"}
    assert "right." in capsys.readouterr().out
    right, total = quiz.score("08")
    assert (right, total) == (1, len(quiz.keys("08")))


def test_headless_first_run_commits_the_first_choice_and_shows_the_key(learner, capsys):
    quiz.AUTO = "first"
    quiz.ask("08-atomic", "What is left?", ["the previous snapshot", "half a file that does not load"])
    out = capsys.readouterr().out
    assert quiz.answers("08") == {"08-atomic": "the previous snapshot"}
    assert "not quite: the answer is 'half a file that does not load'" in out


def test_reveal_puts_a_numeric_prediction_next_to_the_measurement(learner, capsys):
    quiz.AUTO = "first"
    quiz.predict("08-number", "How many?")          # no choices: a headless run commits 0
    capsys.readouterr()
    assert quiz.reveal("08-number", 2.212373791999653, unit="s") is None     # nothing for a cell to echo
    assert "you predicted 0 s; measured 2.21 s" in capsys.readouterr().out
    text = quiz.reveal_text("08-never-asked", 57, unit="%")
    assert text.startswith("you made no prediction for this one (Run All does not wait for an answer: run the cells "
                           "one by one to predict first)")
    assert text.splitlines()[1] == "What happened: 57%"
    again = quiz.reveal_text("08-never-asked-either", 3)     # said once per notebook, not under every reveal
    assert again.splitlines()[0] == "you made no prediction for this one", again


@pytest.mark.parametrize("value, unit, shown", [(2.212373791999653, "s", "2.21 s"), (57, "%", "57%"),
                                                (1.8361, "x", "1.84x"), (12345.6, "images/s", "12,346 images/s"),
                                                (0.00012345, "", "0.000123"), ("Gloo", "", "'Gloo'"),
                                                (True, "", "True")])
def test_figures_are_rounded_and_carry_their_unit(value, unit, shown):
    assert quiz.figure(value, unit) == shown


def test_run_all_past_a_question_closes_its_widget_and_says_how_to_predict(learner, capsys):
    pytest.importorskip("ipywidgets")
    quiz.predict("08-number", "How many?")          # widgets (AUTO None): nothing committed yet
    assert "08-number" in quiz._open
    capsys.readouterr()
    quiz.reveal("08-number", 3.0)
    assert "run the cells one by one" in capsys.readouterr().out and "08-number" not in quiz._open
    assert quiz.answers("08") == {}


def test_a_why_only_key_explains_a_prediction_without_scoring_it(learner, monkeypatch):
    monkeypatch.setattr(quiz, "keys", lambda nb: {"01-x": {"why": "because"}, "01-y": {"answer": "a", "why": "."}})
    quiz.AUTO = "key"
    quiz.predict("01-x", "Guess", ["a", "b"])       # no answer in the key: the first choice
    assert quiz.answers("01")["01-x"] == "a"
    assert quiz.reveal_text("01-x", "b").endswith("because")
    assert quiz.score("01") == (0, 1)


def test_a_malformed_id_is_refused():
    with pytest.raises(ValueError, match="must look like"):
        quiz.predict("speedup", "?")
