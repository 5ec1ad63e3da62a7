"""What a string expression in a solution evaluates to, as far as it can be known without running it: the hack
detector (rewards/hack_detector.py) folds `'/te' + 'sts'`, f-strings, `%` and `.format`, `os.path.join`, `Path /`,
`chr(...)` and simple names so a test path built in pieces is still seen. Bounded: recursion stops at
MAX_FOLD_DEPTH and templates are cut at 10,000 characters.
"""

from __future__ import annotations

import ast
import posixpath
import re
from collections.abc import Mapping, Sequence

UNKNOWN = "\0"  # a part of a folded string not known statically (no path holds a NUL); a glob '*' when matched
_PERCENT = re.compile(r"%(?:\((\w{1,30})\))?[-#0 +]{0,5}\d{0,5}(?:\.\d{0,5})?[a-zA-Z]")  # '%s', '%(x)s'
_BRACES = re.compile(r"\{(\w{0,30})(?:[!:][^{}]{0,40})?\}")  # '{}', '{0}', '{name}', '{:>4}'
MAX_FOLD_DEPTH = 40  # a folded string expression deeper than this is unknown (and the fold never recurses far)


def _dirname(path: str) -> str:
    """`Path(path).parent` / `os.path.dirname`, where the parent of the working directory is '..'."""
    if path.startswith("/") and not path.strip("/"):
        return "/"
    stripped = path.rstrip("/")
    return ".." if stripped in ("", ".") else posixpath.dirname(stripped) or "."


class StringFolder:
    """Folds expressions of one solution; `aliases` (import aliases) and `strings` (names bound to folded strings)
    are filled by the detector's visitor as it reads the code."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.strings: dict[str, str] = {}

    def name(self, node: ast.AST) -> str | None:
        """Dotted name of a Name/Attribute chain with the first part de-aliased (`s.exit` -> `sys.exit`)."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def fold(self, node: ast.AST, depth: int = 0) -> str | None:
        """The string `node` evaluates to, parts not known statically as UNKNOWN; None when nothing is known."""
        if depth > MAX_FOLD_DEPTH:
            return None
        if isinstance(node, ast.Constant):
            v = node.value
            return v if isinstance(v, str) else v.decode("latin-1") if isinstance(v, bytes) else None
        if isinstance(node, ast.Name):
            return "./solution.py" if node.id == "__file__" else self.strings.get(node.id)
        if isinstance(node, ast.JoinedStr):
            return self._concat([v.value if isinstance(v, ast.FormattedValue) else v for v in node.values], "", depth)
        if isinstance(node, ast.BinOp):
            return self._fold_binop(node, depth)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            s, step = self.fold(node.value, depth + 1), node.slice.step
            if (
                s is not None
                and isinstance(step, ast.UnaryOp)
                and isinstance(step.operand, ast.Constant)
                and step.operand.value == 1
                and isinstance(step.op, ast.USub)
            ):
                return s[::-1]
            return s
        if isinstance(node, ast.Attribute):
            return self._fold_attribute(node, depth)
        if isinstance(node, ast.Call):
            return self._fold_call(node, depth)
        return None

    def _concat(self, parts: Sequence[ast.AST], sep: str, depth: int) -> str | None:
        folded = [self.fold(p, depth + 1) for p in parts]
        if all(f is None for f in folded):
            return None
        return sep.join(UNKNOWN if f is None else f for f in folded)

    def _fold_binop(self, node: ast.BinOp, depth: int) -> str | None:
        if isinstance(node.op, ast.Add):
            return self._concat([node.left, node.right], "", depth)
        if isinstance(node.op, ast.Div):  # pathlib: Path(a) / 'b'
            return self._concat([node.left, node.right], "/", depth)
        if isinstance(node.op, ast.Mod):
            left = self.fold(node.left, depth + 1)
            right = node.right
            named = (
                {
                    k.value: v
                    for k, v in zip(right.keys, right.values)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                }
                if isinstance(right, ast.Dict)
                else None
            )
            values = right.elts if isinstance(right, ast.Tuple) else [] if named is not None else [right]
            return None if left is None else self._substitute(_PERCENT, left, values, depth, named)
        return None

    def _substitute(
        self,
        placeholder: re.Pattern[str],
        template: str,
        values: Sequence[ast.AST],
        depth: int,
        named: Mapping[str, ast.AST] | None = None,
    ) -> str:
        """`template` with its placeholders ('%s', '{}', '{0}', '{name}') filled by the folded `values` (in order,
        or by index) and `named` ('*' for what is unknown): "'/%s/x' % 'tests'" is '/tests/x'."""
        folded = [self.fold(v, depth + 1) for v in values[:20]]
        by_name = {k: self.fold(v, depth + 1) for k, v in list((named or {}).items())[:20]}
        it = iter(folded)

        def fill(m: re.Match[str]) -> str:
            key = m.group(1)
            if not key:
                value = next(it, None)
            elif key.isdigit():
                value = folded[int(key)] if int(key) < len(folded) else None
            else:
                value = by_name.get(key)
            return UNKNOWN if value is None else value

        return placeholder.sub(fill, template[:10_000])

    def _fold_attribute(self, node: ast.Attribute, depth: int) -> str | None:
        name = self.name(node)
        if name in ("os.sep", "os.path.sep"):
            return "/"
        if name in ("os.curdir", "os.path.curdir"):
            return "."
        if node.attr in ("parent", "parents"):
            inner = self.fold(node.value, depth + 1)
            return None if inner is None else _dirname(inner)
        return None

    def _fold_call(self, node: ast.Call, depth: int) -> str | None:
        name = self.name(node.func) or ""
        if name in ("os.getcwd", "Path.cwd", "pathlib.Path.cwd", "os.getcwdb"):
            return "."
        if name in (
            "os.path.join",
            "posixpath.join",
            "pathlib.Path",
            "Path",
            "pathlib.PurePath",
            "PurePath",
            "pathlib.PosixPath",
            "PosixPath",
            "str",
            "os.fspath",
            "os.path.abspath",
            "os.path.realpath",
            "os.path.normpath",
            "os.path.expanduser",
        ):
            return self._concat(node.args, "/", depth) if node.args else "."
        if name in ("os.path.dirname", "posixpath.dirname") and node.args:
            inner = self.fold(node.args[0], depth + 1)
            return None if inner is None else _dirname(inner)
        if (
            name == "chr"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, int)
            and 0 <= node.args[0].value < 0x110000
        ):
            return chr(node.args[0].value)
        if not isinstance(node.func, ast.Attribute):
            return None
        return self._fold_method(node, node.func, depth)

    def _fold_method(self, node: ast.Call, func: ast.Attribute, depth: int) -> str | None:
        method, receiver = func.attr, func.value
        if method == "join" and node.args and isinstance(node.args[0], (ast.List, ast.Tuple)):
            sep = self.fold(receiver, depth + 1)
            return self._concat(list(node.args[0].elts), UNKNOWN if sep is None else sep, depth)
        if method == "join" and node.args:
            return UNKNOWN
        base = self.fold(receiver, depth + 1)
        if base is None:
            return None
        if method == "format":
            named = {k.arg: k.value for k in node.keywords if k.arg}
            return self._substitute(_BRACES, base, list(node.args), depth, named)
        if method == "joinpath":
            parts = [self.fold(a, depth + 1) for a in node.args]
            return "/".join([base] + [UNKNOWN if f is None else f for f in parts])
        if method == "replace" and len(node.args) == 2:
            old, new = (self.fold(a, depth + 1) for a in node.args)
            return base.replace(old, new) if old and new is not None and len(base) < 1000 else base
        if method in (
            "lower",
            "upper",
            "strip",
            "lstrip",
            "rstrip",
            "resolve",
            "absolute",
            "expanduser",
            "as_posix",
            "casefold",
        ):
            return getattr(base, method)() if method in ("lower", "upper", "casefold") else base
        return None
