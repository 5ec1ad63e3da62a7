"""The `drawing` gate (drawing_gate.py) and renderer (drawing_render.py): escapes refused, references accepted,
random text never raises and never renders when refused, rendering deterministic."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.tasks import drawing_data as D
from posttrain.tasks.drawing_gate import DRAW_CALLS, check_program
from posttrain.tasks.drawing_render import PALETTE, RenderError, color, image_distance, render

ESCAPES = {
    "import": "import os\nfill('red')",
    "from import": "from os import system\nsystem('ls')",
    "__import__": "__import__('os').system('ls')",
    "dunder call": "x = __import__",
    "class attribute": "fill(().__class__.__name__)",
    "subclasses": "x = ().__class__.__bases__[0].__subclasses__()",
    "attribute on a name": "x = 1\nfill(x.real)",
    "attribute call": "fill.__globals__",
    "eval": "eval('1+1')",
    "exec": "exec('import os')",
    "compile": "compile('1', 'f', 'eval')",
    "getattr": "getattr(fill, '__globals__')",
    "open": "open('/etc/passwd')",
    "globals string-built name": "globals()['ev' + 'al']('1')",
    "string-built name in arithmetic": "x = 'ev' + 'al'",
    "string repeat": "x = 'a' * 1000000",
    "subscript": "x = 1\ny = x[0]",
    "lambda": "f = lambda: 1",
    "list comprehension": "x = [circle(i, i, 1, 'red') for i in range(3)]",
    "generator": "x = (i for i in range(3))",
    "huge loop": "for i in range(1000000):\n    fill('red')",
    "fractional loop": "for i in range(2.5):\n    fill('red')",
    "nested loops too deep": "for i in range(2):\n    for j in range(2):\n        for k in range(2):\n            fill('red')",
    "while": "while True:\n    fill('red')",
    "walrus": "circle((x := 5), 5, 5, 'red')",
    "f-string calling": "fill(f'{eval(\"1\")}')",
    "f-string": "fill(f'red')",
    "decorator": "@fill\ndef f():\n    pass",
    "def": "def f():\n    fill('red')",
    "nested def": "def f():\n    def g():\n        pass",
    "class": "class A:\n    pass",
    "with": "with open('x') as f:\n    pass",
    "try": "try:\n    fill('red')\nexcept Exception:\n    pass",
    "keyword argument": "line(0, 0, 10, 10, 'red', width=3)",
    "starred": "args = 1\ncircle(*args)",
    "unknown call": "print('hi')",
    "variable call": "x = 1\nx()",
    "reassign a drawing call": "fill = 1",
    "underscore name": "_x = 1",
    "dunder assign": "__builtins__ = 1",
    "comparison": "x = 1 < 2",
    "boolean op": "x = 1 and 2",
    "power": "x = 9 ** 9 ** 9",
    "bitwise": "x = 1 << 1000",
    "if": "if 1:\n    fill('red')",
    "return": "return 1",
    "global": "global x",
    "assert": "assert False",
    "del": "x = 1\ndel x",
    "raise": "raise SystemExit",
    "unknown name": "fill(red)",
    "bytes": "fill(b'red')",
    "none": "fill(None)",
    "tuple": "x = (1, 2)",
    "list": "x = [1, 2]",
    "dict": "x = {}",
    "set": "x = {1}",
    "ternary": "x = 1 if 1 else 2",
    "async": "async def f():\n    pass",
    "await": "await fill('red')",
    "yield": "yield 1",
    "multiple targets": "x = y = 1",
    "tuple unpacking": "x, y = 1, 2",
    "for-else": "for i in range(2):\n    fill('red')\nelse:\n    fill('blue')",
    "loop over a non-range": "for i in 'abc':\n    fill('red')",
    "range with keywords": "for i in range(stop=3):\n    fill('red')",
    "call used as a value": "x = fill('red')",
    "too many arguments": "circle(1, 2, 3, 'red', 5)",
    "too long": "fill('red')\n" * 300,
    "match": "match 1:\n    case 1:\n        pass",
    "empty": "",
    "syntax error": "fill('red'",
    "prose": "Here is my drawing of the sun.",
    "null byte": "fill('red')\x00",
    "huge number": "x = 10000000000",
    "long string": "fill('" + "a" * 100 + "')",
}


def test_gate_refuses_every_escape() -> None:
    for name, source in ESCAPES.items():
        g = check_program(source)
        assert not g.ok and g.reason and g.tree is None, name
        with pytest.raises(RenderError, match="refused by the gate"):
            render(source)


def test_gate_accepts_and_renders_every_reference() -> None:
    for description, program in D.TRAIN + D.HELD_OUT:
        g = check_program(program)
        assert g.ok, (description, g.reason)
        img = render(program)
        assert img.size == (64, 64) and img.mode == "RGB"
        pixels = {img.tobytes()[i:i + 3] for i in range(0, 64 * 64 * 3, 3)}
        assert len(pixels) > 1, f"{description}: a reference should be more than one flat colour"


def test_references_are_distinct_and_descriptions_split() -> None:
    train, held = {d for d, _ in D.TRAIN}, {d for d, _ in D.HELD_OUT}
    assert len(train) == len(D.TRAIN) >= 40 and len(held) == len(D.HELD_OUT) >= 15 and not train & held


def test_render_is_deterministic() -> None:
    for _, program in D.TRAIN[:10]:
        assert render(program).tobytes() == render(program).tobytes()
    a, b = render(D.TRAIN[0][1]), render(D.TRAIN[1][1])
    assert image_distance(a, a) == 0.0 and 0.0 < image_distance(a, b) <= 1.0


@pytest.mark.parametrize("program,why", [
    ("for i in range(100000 // 10):\n    fill('red')", "iterations"),  # the count is computed, so checked at run time
    ("n = 60\nfor i in range(n):\n    for j in range(n):\n        circle(i, j, 1, 'red')", "drawing calls"),
    ("x = 0\nfor i in range(64):\n    for j in range(64):\n        x = x + 1 + 1 + 1", "steps"),
    ("x = 1 / 0", "division by zero"),
    ("x = 1000000 * 1000000 * 1000000", "out of range"),
    ("fill('nocolour')", "unknown colour"),
    ("fill(3)", "colour"),
    ("circle(50, 50, 'red', 'red')", "circle"),
    ("n = 2.5\nfor i in range(n):\n    fill('red')", "whole numbers"),
    ("for i in range(0):\n    y = 1\nfill(y)", "before it is assigned"),
    ("canvas(0, 10)", "canvas size"),
    ("wash('red', 2)", "alpha"),
])
def test_runtime_limits(program: str, why: str) -> None:
    assert check_program(program).ok, program
    with pytest.raises(RenderError, match=why):
        render(program)


def test_gate_and_painter_agree_and_colours() -> None:
    from posttrain.tasks.drawing_render import _Painter

    assert set(DRAW_CALLS) == {n for n in vars(_Painter) if not n.startswith("_")}
    assert len(DRAW_CALLS) == 10
    assert color("#ff0000") == (255, 0, 0) == color("#F00") and color("Red") == PALETTE["red"]


# Text made of the pieces programs are made of (so the fuzzing reaches deep into the checker), plus any text.
_PIECES = ["fill(", "circle(", "rect(", "range(", "for i in ", ":\n    ", "\n", "(", ")", ",", " ", "'red'", "\"#fff\"",
           "1", "50", "-", "+", "*", "/", "//", "%", "x", "i", " = ", "__", ".", "[", "]", "import ", "lambda",
           "eval", "open", "getattr", "while ", "def ", "@", ":=", "f'", "{", "}", "**", "9", "'", "\\", "#"]
source_text = st.one_of(st.text(max_size=300), st.lists(st.sampled_from(_PIECES), max_size=60).map("".join))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source_text)
def test_random_text_never_raises_and_refused_never_renders(source: str) -> None:
    g = check_program(source)  # must not raise
    if not g.ok:
        assert g.tree is None
        with pytest.raises(RenderError):
            render(source)
    else:
        try:
            img = render(g.tree)  # an accepted program either draws or fails with RenderError, nothing else
        except RenderError:
            pass
        else:
            assert img.size == (64, 64)
