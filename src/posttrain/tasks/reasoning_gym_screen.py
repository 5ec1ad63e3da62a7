"""What reasoning-gym's scorers may see, and how long they may take (tasks/reasoning_gym.py).

Nine of reasoning-gym's scorers evaluate the answer itself: four `eval()` it, five parse it with sympy's
`parse_expr` (an eval after token transforms). A policy writes whatever makes its host run code or loop in C, so
those scorers see an answer only after `screen` has parsed it with `ast` and found nothing but what the scorer needs
(literals; integer arithmetic; small symbolic expressions). A scorer that still raises or runs long is run by
`run_with_timeout` in a daemon thread: its sample scores 0, and at most a few such threads are left running.
"""

from __future__ import annotations

import ast
import re
import threading
from typing import Any, TypeGuard

# Scorers that `eval` the answer (reading a Python list back): they may see only a Python literal, a bare name, or
# text that is no Python expression at all (eval raises on it, and the scorer's own except gives 0).
EVALS_LITERAL = frozenset({"string_insertion", "spiral_matrix", "binary_matrix", "n_queens"})
# Scorers that run sympy's parse_expr (an eval after token transforms) and then int() / float() the result: only
# arithmetic on integers (int(exp(10**100)) would compute a googol-digit number).
EVALS_ARITHMETIC = frozenset({"countdown", "puzzle24"})
# Scorers that parse_expr the answer and compare or differentiate it symbolically: arithmetic, single-letter
# symbols, a few functions (not Integral: diff(Integral(f)) is f, so an unsolved integral would pass), and powers
# that stay small (9**9**9 runs in C, past any thread timeout).
EVALS_SYMBOLIC = frozenset({"polynomial_multiplication", "simple_integration", "intermediate_integration"})

_LITERAL_NODES = (
    ast.Expression,
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.UnaryOp,
    ast.USub,
    ast.UAdd,
    ast.Load,
)
_ARITHMETIC_NODES = (
    ast.Expression,
    ast.Constant,
    ast.BinOp,
    ast.UnaryOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.USub,
    ast.UAdd,
)
_SYMBOLIC_NODES = _ARITHMETIC_NODES + (ast.Name, ast.Load, ast.Call, ast.Pow)
_FUNCTIONS = frozenset(
    {
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "tanh",
        "exp",
        "log",
        "ln",
        "sqrt",
        "Abs",
        "abs",
    }
)
_CONSTANTS = frozenset({"pi", "E", "I", "oo"})
_MAX_EXPONENT = 32  # one power's constant exponent (the datasets' own answers stay under 11)
_MAX_EXPONENT_SUM = 256  # all of them: (x+1)**32 * (x+1)**32 * ... combines into one power
_MAX_DEPTH = 64
# A number written with an exponent of 100 or more: Fraction('1e999999999') (coin_flip) and sympy's Float compute
# 10**999999999 in C, holding the interpreter lock, so no thread timeout stops them. No answer needs one.
_BIG_EXPONENT = re.compile(r"[0-9.][eE]\s*[-+]?\s*0*[0-9]{3}")
# NaN compares false with everything: complex_arithmetic's min(1.0, exp(-distance)) scores 'nan' 1.0.
_NAN = re.compile(r"(?<![A-Za-z])nan(?![A-Za-z])", re.IGNORECASE)


def _parse_expr(text: str) -> ast.Expression | None:
    """The expression `eval(text)` would run (eval strips leading spaces and tabs), or None when it is no Python
    expression. Bounded by MAX_ANSWER_CHARS and the parser's own nesting limit."""
    try:
        return ast.parse(text.lstrip(" \t"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _nodes(tree: ast.AST | None) -> list[ast.AST] | None:
    """Every node of `tree`, or None when there is none or it nests deeper than _MAX_DEPTH (a deep tree can
    overflow the C stack of the scorer's compile or sympy's recursive walks). Iterative: no recursion here."""
    if tree is None:
        return None
    out, todo = [], [(tree, 0)]
    while todo:
        node, depth = todo.pop()
        if depth > _MAX_DEPTH:
            return None
        out.append(node)
        todo.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return out


def _literal_ok(text: str) -> bool:
    tree = _parse_expr(text)
    if tree is None or isinstance(tree.body, ast.Name):  # eval raises, or only looks a word up (ABBA)
        return True
    nodes = _nodes(tree)
    return nodes is not None and all(isinstance(n, _LITERAL_NODES) for n in nodes)


def _number(node: ast.AST) -> TypeGuard[ast.Constant]:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _arithmetic_ok(text: str) -> bool:
    """Only what parse_expr reads as plain Python arithmetic (its transforms, 5! or 0.[3], are refused)."""
    nodes = _nodes(_parse_expr(text))
    return nodes is not None and all(
        isinstance(n, _ARITHMETIC_NODES) and (not isinstance(n, ast.Constant) or _number(n)) for n in nodes
    )


def _small_exponent(node: ast.AST) -> float | None:
    """The size of an exponent that keeps numbers small (a name counts 1; a constant up to _MAX_EXPONENT; -e; e/f
    of those), else None."""
    if isinstance(node, ast.Name):
        return 1.0
    if _number(node) and isinstance(node.value, (int, float)):  # the second test only tells the type checker
        return abs(node.value) if abs(node.value) <= _MAX_EXPONENT else None
    if isinstance(node, ast.UnaryOp):
        return _small_exponent(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        top, bottom = _small_exponent(node.left), _small_exponent(node.right)
        return top if top is not None and bottom is not None else None
    return None


def _symbolic_node_ok(n: ast.AST) -> bool:
    if not isinstance(n, _SYMBOLIC_NODES) or (isinstance(n, ast.Constant) and not _number(n)):
        return False
    if isinstance(n, ast.Name):
        return len(n.id) == 1 or n.id in _CONSTANTS or n.id in _FUNCTIONS
    if isinstance(n, ast.Call):
        return not n.keywords and isinstance(n.func, ast.Name) and n.func.id in _FUNCTIONS
    return True


def _symbolic_ok(text: str) -> bool:
    nodes = _nodes(_parse_expr(text))
    if nodes is None or not all(_symbolic_node_ok(n) for n in nodes):
        return False
    total = 0.0
    for n in nodes:
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow):
            size = _small_exponent(n.right)
            if size is None or any(isinstance(m, ast.Pow) for m in ast.walk(n.left)):
                return False  # (9**32)**32**... still builds a huge number: one power per path
            total += size
    return total <= _MAX_EXPONENT_SUM


def screen(dataset: str, answer: str, reference: Any = None) -> bool:
    """Whether `dataset`'s scorer may see `answer` (False: it scores 0 without being called). The reference answer
    itself always may: the dataset wrote it (intermediate_integration's can hold an unevaluated Integral)."""
    if isinstance(reference, str) and answer.strip() == reference.strip():
        return True
    if _BIG_EXPONENT.search(answer) or (_NAN.search(answer) and not _NAN.search(str(reference or ""))):
        return False
    if dataset in EVALS_LITERAL:
        return _literal_ok(answer)
    if dataset in EVALS_ARITHMETIC:
        return _arithmetic_ok(answer)
    if dataset in EVALS_SYMBOLIC:
        return _symbolic_ok(answer)
    return True


_STUCK: set[threading.Thread] = set()  # scorer threads that ran past their timeout (Python cannot stop them)
_STUCK_LOCK = threading.Lock()  # reward calls run in the rubric's threads, several at once


def stuck_threads() -> int:
    with _STUCK_LOCK:
        _STUCK.difference_update([t for t in _STUCK if not t.is_alive()])
        return len(_STUCK)


def run_with_timeout(fn, timeout_s: float) -> tuple[str, Any]:
    """("ok", value) | ("error", exception) | ("timeout", None): fn() in a daemon thread, waited on for timeout_s."""
    box: list[tuple[str, Any]] = []

    def target() -> None:
        try:
            box.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - a scorer on hostile text may raise anything
            box.append(("error", e))

    t = threading.Thread(target=target, name="rg-score", daemon=True)
    t.start()
    t.join(max(timeout_s, 0.0))
    if t.is_alive():
        with _STUCK_LOCK:
            _STUCK.add(t)
        return "timeout", None
    return box[0]
