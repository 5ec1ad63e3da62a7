"""What reasoning-gym's scorers may see, and how long they may take (tasks/reasoning_gym.py).

Nine of reasoning-gym's scorers evaluate the answer itself: four `eval()` it, five parse it with sympy's
`parse_expr` (an eval after token transforms). A policy writes whatever makes its host run code or loop in C, so
those scorers see an answer only after `screen` has parsed it with `ast` and found nothing but what the scorer needs
(literals; integer arithmetic; small symbolic expressions). Two expand it: rubiks_cube writes each move's repeat
count out, rush_hour loops once per step, so their counts are bounded. No scorer sees a NaN or an infinity in any
spelling a number parser reads (a NaN compares false with everything: complex_arithmetic scores
`min(1.0, exp(-nan))`, which is 1.0), nor an exponent that would make Fraction or sympy compute a huge number.

Every scorer runs in a worker process (`score_in_worker`, on `scorer_pool()`: _reasoning_gym_worker.py on
worker_pool.WorkerPool, like the `math` reward's checker), where one that runs past its timeout is killed: its
sample scores 0, and the scores after it are unaffected.
"""

from __future__ import annotations

import ast
import atexit
import math
import re
import threading
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

from posttrain.bounded import BoundedError, BoundedTimeout
from posttrain.worker_pool import WorkerPool

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
_CONSTANTS = frozenset({"pi", "E", "I"})  # not sympy's infinity `oo`: no answer needs it
_MAX_EXPONENT = 32  # one power's constant exponent (the datasets' own answers stay under 11)
_MAX_EXPONENT_SUM = 256  # all of them: (x+1)**32 * (x+1)**32 * ... combines into one power
_MAX_DEPTH = 64
# A number written with an exponent of 100 or more: Fraction('1e999999999') (coin_flip) and sympy's Float compute
# 10**999999999 in C, holding the interpreter lock. No answer needs one. On `_normal` text: any decimal digits
# (float and Fraction read '1e٩٩٩'), no underscores between them (float reads '1e9_99').
_BIG_EXPONENT = re.compile(r"[\d.]e\s*[-+]?\s*0*\d{3}")
# NaN and infinity as float(), complex(), Decimal(), json and numpy read them, on `_normal` text: any case, signed,
# `snan` (Decimal), as an imaginary part (`nanj`; complex_arithmetic reads `i` as `j`), and the symbol. Not inside
# a word (banana, info, Fernando: a letter of any script on either side; `[^\W\d_]` is a letter).
_NON_FINITE = re.compile(r"∞|(?<![^\W\d_])s?(?:nan|inf(?:inity)?)[ij]?(?![^\W\d_])")
# A number too large for a float (float() makes it inf): its integer digits plus its exponent past 308.
_NUMBER = re.compile(r"(?<![\d.])0*(\d+)(?:\.\d*)?(?:e\s*([-+]?)\s*(\d{1,6}))?")
_MAX_MAGNITUDE = 308
_UNDERSCORE = re.compile(r"(?<=\d)_(?=\d)")


# What a scorer drops before it reads a number: complex_arithmetic reads 'n a n' as nan, number_format '9,999' as 9999.
_DROPPED = {
    "complex_arithmetic": " ",
    "number_format": ",",
    "chain_sum": ",",
    "products": ",",
    "coin_flip": ",",
    "advanced_geometry": "°()",
}


def _normal(text: str) -> str:
    """`text` as a number parser may read it: NFKC (fullwidth letters and digits become ASCII), case folded, the
    underscores between digits dropped."""
    return _UNDERSCORE.sub("", unicodedata.normalize("NFKC", text).casefold())


def _non_finite(text: str) -> bool:
    """Whether `text` (normalized) holds a NaN or an infinity in a spelling some scorer reads as a number."""
    if _NON_FINITE.search(text):
        return True
    for m in _NUMBER.finditer(text):
        digits, sign, exponent = m.groups()
        if len(digits) + (int(sign + exponent) if exponent else 0) > _MAX_MAGNITUDE:
            return True
    return False


# Scorers that expand the answer: rubiks_cube writes `R9999999` out as ten million moves (minutes of numpy),
# rush_hour's `A+99999999999` loops once per step. A solution needs a few hundred moves at most.
MAX_EXPANDED_MOVES = 1000
_CUBE_MOVE = re.compile(r"([^\d]*)(\d*)")  # expand_moves' own split: a face, then how many times (any digits)
_CAR_MOVE = re.compile(r"([A-Z])([+-])(\d+)")  # perform_moves' own: a car, a direction, how many steps


def _counts_ok(counts: Sequence[str]) -> bool:
    """Whether repeat counts (digit strings; '' is once) add up to at most MAX_EXPANDED_MOVES."""
    total = 0
    for digits in counts:
        if len(digits) > 6:
            return False
        total += int(digits) if digits else 1
        if total > MAX_EXPANDED_MOVES:
            return False
    return True


def _cube_moves_ok(text: str) -> bool:
    moves = (_CUBE_MOVE.fullmatch(move) for move in text.split())
    return _counts_ok([m.group(2) for m in moves if m is not None])  # a move that does not match is dropped


def _car_moves_ok(text: str) -> bool:
    return _counts_ok([m.group(3) for m in _CAR_MOVE.finditer(text)])


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


_SCREENS = {
    **dict.fromkeys(EVALS_LITERAL, _literal_ok),
    **dict.fromkeys(EVALS_ARITHMETIC, _arithmetic_ok),
    **dict.fromkeys(EVALS_SYMBOLIC, _symbolic_ok),
    "rubiks_cube": _cube_moves_ok,
    "rush_hour": _car_moves_ok,
}


def screen(dataset: str, answer: str, reference: Any = None) -> bool:
    """Whether `dataset`'s scorer may see `answer` (False: it scores 0 without being called). The reference answer
    itself always may: the dataset wrote it (intermediate_integration's can hold an unevaluated Integral); a NaN,
    `inf` or a huge number only where the reference holds one too (family_relationships' `Nan`)."""
    if isinstance(reference, str) and answer.strip() == reference.strip():
        return True
    text = _normal(answer)
    if dataset in _DROPPED:
        text += "\n" + text.translate(dict.fromkeys(map(ord, _DROPPED[dataset])))
    if _BIG_EXPONENT.search(text) or (_non_finite(text) and not _non_finite(_normal(str(reference or "")))):
        return False
    check = _SCREENS.get(dataset)
    return check is None or check(answer)


# ------------------------------------------------------------------------------------------- the scorers' worker

_WORKER = Path(__file__).with_name("_reasoning_gym_worker.py")
SCORER_MEMORY_BYTES = 2 << 30  # a worker's address space: reasoning-gym and a few datasets take ~300 MiB
SCORER_CPU_S = 3600  # a worker's own CPU over its life (it builds datasets and forks; each child has its batch's)
SCORER_POOL_SIZE = 4  # reward calls scored at once
SCORER_START_S = 120.0  # importing reasoning-gym takes seconds, more on a loaded machine
BUILD_ALLOWANCE_S = 60.0  # on top of a batch's scoring budget: a worker's first build of a dataset (data files)
_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def scorer_pool(new: bool = False) -> WorkerPool:
    """The process's scorer workers, made on first use; `new=True`: a pool of its own. Each is closed at exit."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None and not new:
            return _POOL
        pool = WorkerPool(
            _WORKER,
            "reasoning-gym scorer",
            size=SCORER_POOL_SIZE,
            memory_bytes=SCORER_MEMORY_BYTES,
            cpu_s=SCORER_CPU_S,
            start_timeout_s=SCORER_START_S,
        )
        atexit.register(pool.close)
        if not new:
            _POOL = pool
        return pool


def close_scorer_pool() -> None:
    """End the process's scorer workers now (a later score starts new ones); at exit this happens by itself."""
    with _POOL_LOCK:
        pool = _POOL
    if pool is not None:
        pool.close()


_VERDICTS = ("timeout", "error", "nonfinite")


def score_in_worker(
    pool: Any, rows: Sequence[tuple[str, str, str]], timeout_s: float, batch_timeout_s: float
) -> list[float | str]:
    """Each row's score, a row being (spec JSON, entry JSON, answer): a finite number from the dataset's
    score_answer, or "timeout", "error", "nonfinite" (_reasoning_gym_worker.py). Each row may take `timeout_s`, all
    of them `batch_timeout_s`; the rows left when that is up, or all of them when no worker answered in time, are
    "timeout". Raises BoundedError when no worker could start."""
    if not rows:
        return []
    budget = max(0.0, min(batch_timeout_s, timeout_s * len(rows) + 1.0))
    specs = list(dict.fromkeys(spec for spec, _, _ in rows))
    at = {spec: k for k, spec in enumerate(specs)}
    request = {
        "specs": specs,
        "rows": [[at[spec], entry, answer] for spec, entry, answer in rows],
        "timeout": timeout_s,
        "budget": budget,
    }
    try:
        reply = pool.request(request, budget + BUILD_ALLOWANCE_S, 64 + 32 * len(rows), died="the scorer died")
    except BoundedTimeout:
        return ["timeout"] * len(rows)
    results = reply.get("results")
    if reply.get("error") == "memory":  # the worker ran out building a dataset; the pool replaces it
        return ["error"] * len(rows)
    if not isinstance(results, list) or len(results) != len(rows):
        raise BoundedError(f"the reasoning-gym scorer sent a bad reply: {str(reply)[:200]}")
    return [r if _is_result(r) else "error" for r in results]


def _is_result(r: Any) -> bool:
    if isinstance(r, str):
        return r in _VERDICTS
    return type(r) in (int, float) and math.isfinite(r)
