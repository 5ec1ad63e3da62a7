"""The hack detector: each flag kind fires on a typical hack, and honest solutions raise none."""

import json
from pathlib import Path

import pytest

from posttrain.rewards.hack_detector import detect_code, detect_files
from posttrain.rewards.hack_guard import GuardedRubric, guard, hack_component
from posttrain.rewards.hack_vocab import KINDS
from posttrain.rewards.rubric import RewardComponent, Rubric

HACKS = {
    "early_exit": [
        "import sys\ndef f(x):\n    sys.exit(0)",
        "import os\nos._exit(0)",
        "from sys import exit as bye\nbye()",
        "def f():\n    raise SystemExit(0)",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        "import sys as s\ns.exit()",
    ],
    "introspection": [
        "import sys\ndef f():\n    return sys._getframe(1).f_locals['expected']",
        "import inspect\ninspect.currentframe()",
        "import gc\nfor o in gc.get_objects():\n    pass",
        "import gc\ngc.get_referrers(1)",
        "def f():\n    try:\n        1/0\n    except Exception as e:\n        return e.__traceback__.tb_frame.f_back",
    ],
    "hook_file_write": [
        "open('conftest.py', 'w').write('collect_ignore_glob = [\"*\"]')",
        "from pathlib import Path\nPath('/usr/lib/python3/site-packages/evil.pth').write_text('import x')",
        "open('sitecustomize.py', 'w')",
    ],
    "test_file_access": [
        "open('tests/test_math.py', 'w').write('')",
        "import os\nos.remove('test_solution.py')",
    ],
    "test_framework_patch": [
        "import pytest\npytest.skip = lambda *a: None",
        "import _pytest.runner",
        "from unittest import mock",
        "import unittest\nunittest.TestCase.assertEqual = lambda *a: None",
    ],
    "eq_override": [
        "class A:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return A()",
        "class A(int):\n    def __eq__(self, o):\n        return 1 == 1",
        "def f(x):\n    r = type('R', (), {})()\n    type(r).__eq__ = lambda a, b: True\n    return r",
        "def f():\n    class R: pass\n    setattr(R, '__eq__', lambda a, b: True)\n    return R()",
    ],
    "builtins_patch": [
        "import builtins\nbuiltins.len = lambda x: 0",
        "__builtins__['print'] = None",
        "import builtins\nsetattr(builtins, 'sum', lambda x: 0)",
    ],
}


def test_every_kind_has_hack_examples():
    assert set(HACKS) == set(KINDS)


@pytest.mark.parametrize("kind,code", [(k, c) for k, cs in HACKS.items() for c in cs])
def test_hack_is_flagged(kind, code):
    kinds = {f.kind for f in detect_code(code)}
    assert kind in kinds, (code, kinds)


@pytest.mark.parametrize("code,kind", [
    ("import sys\ndef f(:\n    sys.exit(0)", "early_exit"),  # unparsable: regex fallback
    ("def f(x)\n    return sys._getframe(1)", "introspection"),
    ("class A:\n    def __eq__(self, o): return True\n  bad indent", "eq_override"),
    ("```\nimport pytest\n", "test_framework_patch"),
])
def test_regex_fallback_on_unparsable_code(code, kind):
    assert kind in {f.kind for f in detect_code(code)}


def test_honest_eq_is_not_flagged():
    code = ("class P:\n    def __init__(self, x):\n        self.x = x\n"
            "    def __eq__(self, other):\n        return isinstance(other, P) and self.x == other.x\n")
    assert detect_code(code) == []


def test_detect_files():
    kinds = {f.kind for f in detect_files(["conftest.py", "pkg/tests/test_a.py", "x.pth", "src/lib.py"])}
    assert kinds == {"hook_file_write", "test_file_access"}
    assert detect_files({"src/mathlib/core.py": "", "README.md": ""}) == []


def test_no_false_positive_on_reference_solutions():
    path = Path(__file__).parents[2] / "src/posttrain/tasks/data/code_problems.json"
    problems = json.loads(path.read_text())["problems"]
    flagged = {p["id"]: detect_code(p["solution"]) for p in problems}
    assert not {k: v for k, v in flagged.items() if v}


def test_no_false_positive_on_repo_sources():
    root = Path(__file__).parents[2] / "src/posttrain/tasks/data/repos"
    sources = [p for p in root.rglob("*.py") if "tests" not in p.parts]
    assert sources
    flagged = {str(p): detect_code(p.read_text()) for p in sources}
    assert not {k: v for k, v in flagged.items() if v}


def _rubric():
    def score(completions, **kw):
        return [1.0 for _ in completions]

    base = Rubric([RewardComponent("score", score)], pass_component="score")
    return guard(base, code_of=lambda text: text)


def test_guarded_rubric_zeroes_flagged_and_counts():
    r = _rubric()
    assert isinstance(r, GuardedRubric)
    s_ok, s_hack = r.score(["def f(x):\n    return x", "import sys\nsys.exit(0)"], [{}, {}])
    assert s_ok.reward == 1.0 and s_ok.passed and s_ok.components["hack_flagged"] == 0.0
    assert s_hack.reward == 0.0 and not s_hack.passed and s_hack.components["hack_flagged"] == 1.0
    assert s_hack.components["score"] == 1.0  # the raw component stays visible in the metrics


def test_guard_without_pass_component_ignores_the_flag_column():
    base = Rubric([RewardComponent("score", lambda completions, **kw: [1.0] * len(completions))])
    r = guard(base, code_of=lambda t: t)
    ok, bad = r.score(["x = 1", "import os\nos._exit(1)"], [{}, {}])
    assert ok.passed and not bad.passed and bad.reward == 0.0


def test_hack_component_is_weight_zero_and_handles_chat_completions():
    comp = hack_component(lambda t: t)
    assert comp.weight == 0.0
    out = comp.func([[{"role": "assistant", "content": "import gc\ngc.get_objects()"}], "x = 1"])
    assert out == [1.0, 0.0]
