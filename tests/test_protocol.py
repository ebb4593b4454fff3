"""The harness's plug-in protocol is typed (issue 57, item 2): a cases module's misspelt or mistyped protocol
attribute fails when the module is imported for a check, with a message that names it, instead of silently being
the default."""
import sys

import pytest

from course_lib.checking.protocol import NAMES, Plugin, ProtocolError, plugin
from course_lib.registry import EXERCISES, Exercise

GOOD = '''
FILE = LOAD_ITEM = "hello.py"
ITEMS = ("double",)
WORLDS = (2,)
GUARD = (("all_reduce",), "forbid")
PARALLEL = 2


def cases(world):
    return []
'''


def _entry(tmp_path, monkeypatch, text: str, name: str) -> Exercise:
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return Exercise("hello", "00_hello/hello.py", name, "00_welcome", ("hello",), r"def\s+double", cases=True)


def test_a_good_module_reads_as_a_plugin(tmp_path, monkeypatch):
    ex = _entry(tmp_path, monkeypatch, GOOD, "hello_cases_good")
    p = plugin(ex.cases_module())
    assert isinstance(p, Plugin)
    assert (p.FILE, p.ITEMS, p.PARALLEL, p.STOP_ITEM, p.TIMEOUT, p.HANG_HINTS) == \
        ("hello.py", ("double",), 2, False, 180.0, {})


@pytest.mark.parametrize("line, said", [
    ("STOP_ITME = True", "STOP_ITME is not a name the harness reads: did you mean STOP_ITEM?"),
    ("stop_item = True", "stop_item is not a name the harness reads: did you mean STOP_ITEM?"),
    ("HANG_HINT = {None: 'x'}", "HANG_HINT is not a name the harness reads: did you mean HANG_HINTS?"),
    ("FRESH_AFTER_FAILUR = True", "did you mean FRESH_AFTER_FAILURE?"),
    ("PARALLEL = '2'", "PARALLEL is of type str, not int"),
    ("STOP_ITEM = 1", "STOP_ITEM is of type int, not bool"),
    ("hint = 'text'", "hint is of type str, not a function"),
])
def test_a_misspelt_or_mistyped_attribute_fails_at_import(tmp_path, monkeypatch, line, said):
    name = f"hello_cases_{abs(hash(line))}"
    ex = _entry(tmp_path, monkeypatch, GOOD + line + "\n", name)
    with pytest.raises(ProtocolError) as e:
        ex.cases_module()
    assert said in str(e.value) and name in str(e.value), str(e.value)


def test_a_missing_required_attribute_is_named(tmp_path, monkeypatch):
    ex = _entry(tmp_path, monkeypatch, GOOD.replace('ITEMS = ("double",)\n', ""), "hello_cases_noitems")
    with pytest.raises(ProtocolError, match="it has no ITEMS"):
        ex.cases_module()


def test_a_name_of_its_own_beside_the_protocol_one_is_not_a_typo(tmp_path, monkeypatch):
    """ckpt's WORLD next to WORLDS is a constant of its own."""
    ex = _entry(tmp_path, monkeypatch, GOOD + "WORLD = 2\n", "hello_cases_world")
    assert plugin(ex.cases_module()).WORLDS == (2,)


def test_every_cases_module_of_the_course_follows_the_protocol():
    read = {}
    for ex in EXERCISES.values():
        if ex.cases:
            p = plugin(ex.cases_module())
            read[ex.name] = (p.STOP_ITEM, p.PARALLEL, p.FIRST_WORLDS, p.STOP_AT_FAILURE)
    # what each declares (a typo would read as the default)
    assert read["allreduce"] == (True, 2, (), False)
    assert read["tp"][2] == (1,) and read["cp"][1:3] == (2, (1,))
    assert read["ckpt"][3] is True and read["pp"][0] is True
    assert "STOP_ITEM" in NAMES and "HANG_HINTS" in NAMES and len(NAMES) >= 13
