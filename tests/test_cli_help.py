"""``course --help`` and every command's help (issue 57 item 4, issue 53 item 7): one grammar, ``course VERB [NOUN]
[PATH]``; learner commands first, then the instructor's, each in its group; a command's help is its module's whole
docstring, not the first line cut, and every argument says what it is; one list syntax; the environment variables and
the site profile's keys that change behaviour are listed; today's spellings still work."""
import argparse
import dataclasses
import importlib
import re

import pytest
from conftest import ROOT

from course_lib.cli import ALIASES, COMMANDS, INSTRUCTOR, LEARNER, TABLE, VERBS, command_parser, main

GROUPS = {"learner commands": ["check", "show env", "show data", "download", "init", "update", "restore",
                                "diagnose"],
          "instructor commands": ["grade", "release exercises", "release nbgrader", "release gradescope",
                                  "bench allreduce", "run notebooks", "write jobs", "write lab-settings",
                                  "selftest gpu"]}


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_course_help_lists_learner_commands_first_then_the_instructors(capsys):
    text = _help(capsys)
    assert list(LEARNER) == GROUPS["learner commands"] and list(INSTRUCTOR) == GROUPS["instructor commands"]
    learner, instructor = text.index("learner commands:"), text.index("instructor commands:")
    assert learner < instructor
    # each command once, at the start of a line in its group, in this order, spelt VERB [NOUN] ARGUMENTS
    listing = text[:text.index("\npositional")]
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"(?m)^  ([a-z-]+(?: [a-z-]+)?)(?: [A-Z\[]|$)", listing)]
    assert [name for _, name in starts] == [*GROUPS["learner commands"], *GROUPS["instructor commands"]]
    assert all(learner < at < instructor for at, name in starts if name in LEARNER)
    assert all(at > instructor for at, name in starts if name in INSTRUCTOR)
    assert "usage: course VERB [NOUN] [PATH] [--OPTIONS]" in text
    for alias in ALIASES:        # today's spellings work but are not listed
        assert not re.search(rf"(?m)^  {re.escape(alias)}\b", listing) or alias in VERBS, alias


def test_course_help_lists_environment_and_site_keys(capsys):
    from course_lib.core.site import Site
    text = _help(capsys)
    for var in ("COURSE_HOME", "COURSE_WORKSPACE", "COURSE_SITE", "COURSE_ENGINE", "COURSE_CHECKS", "COURSE_RUNS_DIR",
                "COURSE_OUT_DIR", "COURSE_DATA_DIR", "COURSE_QUICK"):
        assert f"\n  {var} " in text, var
    site = text[text.index("site profile keys"):]
    keys = [f.name for f in dataclasses.fields(Site) if f.name not in ("name", "path", "description")]
    missing = [k for k in keys if not re.search(rf"\b{k}\b", site)]
    assert missing == [], f"site profile keys not in `course --help`: {missing}"


def _read_variables() -> set[str]:
    """The COURSE_* variables course_lib names: every string that is one, read or set."""
    return {m for path in (ROOT / "course_lib").rglob("*.py")
            for m in re.findall(r"""["'](COURSE_[A-Z_]+)["']""", path.read_text(encoding="utf-8"))}


def test_every_variable_course_lib_reads_is_in_course_help(capsys):
    """A COURSE_* variable named anywhere in course_lib is named in ``course --help`` (the ones the course sets for
    its own processes by their prefix: COURSE_PROBE_*, COURSE_GRADE_*); COURSE_RUNS was missing."""
    text = _help(capsys)
    env = text[text.index("environment:"):text.index("site profile keys")]
    prefixes = re.findall(r"(COURSE_[A-Z_]+)\*", env)
    missing = sorted(v for v in _read_variables() if v not in env and not v.startswith(tuple(prefixes)))
    assert missing == [], f"variables course_lib reads that `course --help` does not list: {missing}"


def _all_help(capsys) -> dict[str, str]:
    return {spelling: _help(capsys, *spelling.split()) for spelling in TABLE}


@pytest.mark.parametrize("spelling", list(TABLE))
def test_a_commands_help_is_its_whole_docstring_and_says_what_each_argument_is(capsys, spelling):
    command = TABLE[spelling]
    module = importlib.import_module(command.module)
    text = _help(capsys, *spelling.split())
    assert text.startswith(f"usage: course {spelling} "), text[:200]
    words = " ".join(text.split())
    doc = " ".join(module.__doc__.split())
    assert doc in words, f"`course {spelling} --help` does not hold {command.module}'s docstring whole"
    # every argument and option has a help text (argparse prints none for one without)
    parser = command_parser(spelling, command)
    parsers = [parser, *(p for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                         for p in a.choices.values())]
    bare = [a.option_strings or a.dest for p in parsers for a in p._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not a.help]
    assert bare == [], f"`course {spelling} --help`: arguments without a help text: {bare}"


# the spellings of the grammars before this one: noun-verb, a bare noun that acts, a flag as a mode
OLD = re.compile(r"course (?:workspace|data|env|notebooks|jobs|lab-settings)\b"
                 r"|course release --(?:nbgrader|gradescope|check)\b|course selftest --gpu\b")


def second_grammar(text: str) -> list[str]:
    """``course WORD ...`` in ``text`` that is not the one grammar: an old spelling, or a verb that wants a noun
    without one."""
    found = [m.group(0) for m in OLD.finditer(text)]
    old_at = {m.start() for m in OLD.finditer(text)}
    for m in re.finditer(r"\bcourse ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", text):
        verb, noun = m.group(1), m.group(2)
        if m.start() in old_at:
            continue
        nouns = [s.split()[1] for s in TABLE if s.startswith(f"{verb} ") and " " in s]
        if verb in VERBS and nouns and noun not in nouns:
            found.append(m.group(0))
    return found


def test_every_help_speaks_one_grammar(capsys):
    helps = {"course": _help(capsys), **_all_help(capsys)}
    found = {name: second_grammar(text) for name, text in helps.items() if second_grammar(text)}
    assert found == {}, f"help texts in another grammar: {found}"


def test_no_cut_sentence_in_a_help(capsys):
    """A command's line in the listing and each option's help end where their sentence ends: no docstring's first
    line cut mid-sentence (it ended in a word that continues, like 'the' or 'of')."""
    text = _help(capsys)
    for spelling, c in TABLE.items():
        assert c.does in " ".join(text.split()), spelling
        assert not re.search(r"\b(?:the|a|an|of|to|and|or|with|for|in)$", c.does), f"{spelling}: {c.does!r}"


def test_the_grammar_scan_finds_a_second_grammar():
    """The scan is a test that can fail: the old spellings, a verb without its noun."""
    assert second_grammar("run `course workspace init DIR`, then course data download mnist") == [
        "course workspace", "course data"]
    assert second_grammar("course release --nbgrader DIR; course write; course show env") == [
        "course release --nbgrader", "course write"]
    assert second_grammar("course init DIR, course release nbgrader DIR, course selftest gpu") == []


def test_readme_and_docs_speak_the_grammar():
    texts = {p.name: p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    found = {name: second_grammar(text) for name, text in texts.items() if second_grammar(text)}
    assert found == {}, f"README/docs in another grammar: {found}"


@pytest.mark.parametrize("argv", [["workspace", "init", "--help"], ["data", "info", "--help"],
                                  ["release", "--check", "--help"], ["selftest", "--gpu", "--help"],
                                  ["jobs", "--check", "--help"], ["notebooks", "--help"], ["env", "--help"],
                                  ["lab-settings", "--help"]])
def test_todays_spellings_still_parse(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: course {argv[0]} ")


def test_a_verb_without_its_noun_names_the_nouns(capsys):
    assert main(["write"]) == 2
    assert "jobs, lab-settings" in capsys.readouterr().err
    assert set(COMMANDS) == set(VERBS) | set(ALIASES)
    # a mode's flag that takes a value (release nbgrader: --nbgrader DIR) does not need it for --help
    assert _help(capsys, "release", "nbgrader").startswith("usage: course release nbgrader ")
    # ... and without --help its value comes right after the noun, or the command says so (not argparse's words)
    assert main(["release", "nbgrader", "--exercise", "tp", "DIR"]) == 2
    assert "course release nbgrader: DIR comes first" in capsys.readouterr().err


def test_one_list_syntax(capsys, tmp_path):
    """Comma lists: course grade --exercise ddp,tp and --format gradescope,lms parse to lists; a wrong item is named."""
    p = command_parser("grade", TABLE["grade"])
    args = p.parse_args([str(tmp_path), "--exercise", "ddp,tp", "--exercise", "zero", "--format", "gradescope,lms"])
    assert args.exercise == ["ddp", "tp", "zero"] and args.formats == ["gradescope", "lms"]
    with pytest.raises(SystemExit):
        p.parse_args([str(tmp_path), "--exercise", "ddp,nope"])
    assert "--exercise nope: choose from" in capsys.readouterr().err
    n = command_parser("run notebooks", TABLE["run notebooks"]).parse_args(["--only", "01,02"])
    assert n.only == ["01", "02"]
