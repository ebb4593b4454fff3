"""``course --help`` and every command's help (issue 57 item 4, issue 53 item 7): learner commands first, then the
instructor's, each in its group; a command's help is its module's whole docstring, not the first line cut;
the environment variables and the site profile's keys that change behaviour are listed; today's spellings work."""
import dataclasses
import importlib
import re

import pytest

from course_lib.cli import COMMANDS, INSTRUCTOR, LEARNER, main

GROUPS = {"learner commands": ["check", "env", "data", "workspace"],
          "instructor commands": ["grade", "release", "bench", "notebooks", "jobs", "selftest", "lab-settings"]}


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
    # each command once, at the start of a line in its group, in this order
    listing = text[:text.index("\npositional")]
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"(?m)^  ([a-z-]+)(?: |$)", listing)]
    assert [name for _, name in starts] == [*GROUPS["learner commands"], *GROUPS["instructor commands"]]
    assert all(learner < at < instructor for at, name in starts if name in LEARNER)
    assert all(at > instructor for at, name in starts if name in INSTRUCTOR)


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


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_commands_help_is_its_whole_docstring(capsys, command):
    module = importlib.import_module(COMMANDS[command][0])
    text = _help(capsys, command)
    assert text.startswith(f"usage: course {command} ")
    words = " ".join(text.split())
    doc = " ".join(module.__doc__.split())
    assert doc in words, f"`course {command} --help` does not hold {COMMANDS[command][0]}'s docstring whole"


@pytest.mark.parametrize("argv", [["workspace", "init", "--help"], ["data", "info", "--help"],
                                  ["release", "--check", "--help"], ["selftest", "--gpu", "--help"],
                                  ["jobs", "--check", "--help"]])
def test_todays_spellings_still_parse(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: course {argv[0]} ")
