"""The `drawing` task's gate: a static allow-list over the program's syntax tree. Nothing here runs the program.

A drawing program is Python syntax restricted to: calls of the drawing functions (DRAW_CALLS), numbers, short
strings (colours), names of the program's own variables, arithmetic (+ - * / // %, unary -), assignments to a
plain name, and `for NAME in range(...)` loops (at most MAX_LOOP_DEPTH deep, a constant count of at most MAX_RANGE
when it is a literal; the interpreter bounds it again at run time). Everything else is refused: attributes
(`().__class__`), subscripts, imports, lambdas, comprehensions, defs, classes, decorators, `while`, `with`, `try`,
walrus, f-strings, keyword arguments, starred arguments, comparisons, boolean operators, any name with an
underscore prefix, and calling anything that is not a drawing function (`eval`, `exec`, `open`, `getattr`,
`globals`, `__import__`, a variable...). Program size is bounded (MAX_CHARS, MAX_NODES).

    check_program(source) -> GateResult(ok, reason, tree)      never raises, whatever the text
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass
from typing import NoReturn

# name -> (min args, max args); all positional. Kept in step with drawing_render.DRAW (a test checks).
DRAW_CALLS: dict[str, tuple[int, int]] = {
    "canvas": (2, 2),  # canvas(w, h): the logical size the coordinates refer to (default 100 x 100)
    "fill": (1, 1),  # fill(color): paint the whole canvas
    "gradient": (2, 2),  # gradient(top_color, bottom_color): a vertical sky-like gradient
    "rect": (5, 5),  # rect(x, y, w, h, color)
    "circle": (4, 4),  # circle(x, y, r, color)
    "ellipse": (5, 5),  # ellipse(x, y, rx, ry, color)
    "line": (5, 6),  # line(x1, y1, x2, y2, color[, width])
    "polygon": (7, 41),  # polygon(color, x1, y1, x2, y2, x3, y3, ...): 3 to 20 points
    "stroke": (6, 6),  # stroke(x1, y1, x2, y2, color, width): a soft, half-transparent brush stroke
    "wash": (2, 2),  # wash(color, alpha): a translucent layer over everything (the watercolour wash)
}
LOOP_CALL = "range"
MAX_CHARS = 2000
MAX_NODES = 600
MAX_RANGE = 64
MAX_LOOP_DEPTH = 2
MAX_STRING = 24
_NAME = re.compile(r"[a-z][a-z0-9_]{0,19}\Z")

_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)
_UNARY = (ast.USub, ast.UAdd)


@dataclass(frozen=True)
class GateResult:
    ok: bool
    reason: str = ""
    tree: ast.Module | None = None  # the parsed program, when ok


class _Refused(Exception):
    pass


def _refuse(node: ast.AST, why: str) -> NoReturn:
    raise _Refused(f"line {getattr(node, 'lineno', '?')}: {why}")


def check_program(source: str) -> GateResult:
    """Parse and check `source`. Never raises: any failure is a refusal with a reason."""
    if not isinstance(source, str):
        return GateResult(False, f"program must be text, got {type(source).__name__}")
    if len(source) > MAX_CHARS:
        return GateResult(False, f"program is {len(source)} characters; at most {MAX_CHARS}")
    if "\x00" in source:
        return GateResult(False, "program contains a NUL byte")
    try:
        with warnings.catch_warnings():  # random text makes the parser warn ("invalid escape sequence", ...)
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            tree = ast.parse(source, mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return GateResult(False, f"not valid syntax: {type(e).__name__}: {str(e)[:80]}")
    try:
        n = sum(1 for _ in ast.walk(tree))
        if n > MAX_NODES:
            _refuse(tree, f"program has {n} syntax nodes; at most {MAX_NODES}")
        if not tree.body:
            _refuse(tree, "program is empty")
        variables: set[str] = set()
        for stmt in tree.body:
            _stmt(stmt, variables, depth=0)
    except _Refused as e:
        return GateResult(False, str(e))
    except RecursionError:
        return GateResult(False, "program is nested too deeply")
    return GateResult(True, "", tree)


def _stmt(node: ast.stmt, variables: set[str], depth: int) -> None:
    if isinstance(node, ast.Expr):
        if not isinstance(node.value, ast.Call):
            _refuse(node, "a statement must be a drawing call, an assignment or a for loop")
        _call(node.value, variables, statement=True)
    elif isinstance(node, ast.Assign):
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
            _refuse(node, "assign to one plain name only")
        _expr(node.value, variables)
        variables.add(_own_name(node.targets[0]))
    elif isinstance(node, ast.AugAssign):
        if not isinstance(node.target, ast.Name) or not isinstance(node.op, _ARITH):
            _refuse(node, "augmented assignment must be NAME op= value with + - * / // %")
        if node.target.id not in variables:
            _refuse(node, f"{node.target.id!r} is used before it is assigned")
        _expr(node.value, variables)
    elif isinstance(node, ast.For):
        if depth >= MAX_LOOP_DEPTH:
            _refuse(node, f"loops nest at most {MAX_LOOP_DEPTH} deep")
        if node.orelse:
            _refuse(node, "for-else is not allowed")
        if not isinstance(node.target, ast.Name):
            _refuse(node, "the loop variable must be one plain name")
        it = node.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == LOOP_CALL):
            _refuse(node, "loops must be `for NAME in range(...)`")
        if it.keywords or not 1 <= len(it.args) <= 3:
            _refuse(node, "range takes 1 to 3 positional arguments")
        for a in it.args:
            _expr(a, variables)
        for a in it.args:
            if isinstance(a, ast.Constant) and (not isinstance(a.value, int) or isinstance(a.value, bool)):
                _refuse(node, f"range needs whole numbers, got {a.value!r}")
        if (
            len(it.args) == 1
            and isinstance(it.args[0], ast.Constant)
            and isinstance(it.args[0].value, int)  # always, past the check above
            and it.args[0].value > MAX_RANGE
        ):
            _refuse(node, f"range({it.args[0].value!r}): at most {MAX_RANGE} iterations")
        variables.add(_own_name(node.target))
        if not node.body:
            _refuse(node, "empty loop")
        for s in node.body:
            _stmt(s, variables, depth + 1)
    elif isinstance(node, ast.Pass):
        pass
    else:
        _refuse(node, f"{type(node).__name__} statements are not allowed")


def _own_name(node: ast.Name) -> str:
    name = node.id
    if not _NAME.match(name):
        _refuse(node, f"variable {name[:30]!r}: lowercase letters, digits and _ only, starting with a letter")
    if name in DRAW_CALLS or name == LOOP_CALL:
        _refuse(node, f"{name!r} is a drawing function; it cannot be reassigned")
    return name


def _call(node: ast.Call, variables: set[str], statement: bool) -> None:
    if not isinstance(node.func, ast.Name):
        _refuse(node, "only drawing functions can be called, by their plain name")
    name = node.func.id
    if name not in DRAW_CALLS:
        _refuse(node, f"{name[:30]!r} is not a drawing function; allowed: {', '.join(DRAW_CALLS)}")
    if not statement:
        _refuse(node, f"{name}() draws; it has no value to use in an expression")
    if node.keywords:
        _refuse(node, "keyword arguments are not allowed")
    lo, hi = DRAW_CALLS[name]
    if not lo <= len(node.args) <= hi:
        _refuse(node, f"{name} takes {lo}{'' if lo == hi else f' to {hi}'} arguments, got {len(node.args)}")
    for a in node.args:
        _expr(a, variables)


def _expr(node: ast.expr, variables: set[str]) -> None:
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            _refuse(node, f"constants are numbers or colour strings, got {type(v).__name__}")
        if isinstance(v, str) and len(v) > MAX_STRING:
            _refuse(node, f"strings are colour names, at most {MAX_STRING} characters")
        if isinstance(v, int) and abs(v) > 10**6:
            _refuse(node, "numbers are at most 1e6 in size")
    elif isinstance(node, ast.Name):
        if not isinstance(node.ctx, ast.Load) or node.id not in variables:
            _refuse(node, f"unknown name {node.id[:30]!r} (only the program's own variables, assigned earlier)")
    elif isinstance(node, ast.BinOp):
        if not isinstance(node.op, _ARITH):
            _refuse(node, f"operator {type(node.op).__name__} is not allowed (only + - * / // %)")
        for side in (node.left, node.right):
            if isinstance(side, ast.Constant) and isinstance(side.value, str):
                _refuse(node, "arithmetic is on numbers only (no building strings)")
        _expr(node.left, variables)
        _expr(node.right, variables)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, _UNARY):
            _refuse(node, f"operator {type(node.op).__name__} is not allowed")
        _expr(node.operand, variables)
    elif isinstance(node, ast.Call):
        _call(node, variables, statement=False)
    else:
        _refuse(node, f"{type(node).__name__} expressions are not allowed")
