"""The package layers hold: no module imports from a higher layer, and no two modules (or packages) import each
other, directly or round a loop. Every import counts: top level, inside functions, under TYPE_CHECKING, and
`importlib.import_module("posttrain....")` with a literal name. docs/architecture.md shows the same table.

A package may import from its own layer or any layer below it; within a layer, packages may use each other only
one way (the package graph has no cycle either)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import posttrain

SRC = Path(posttrain.__file__).parent

# Lowest first. A module belongs to the longest prefix listed; "posttrain" alone is the package's own __init__.
LAYERS: list[tuple[str, list[str]]] = [
    ("core", ["posttrain.types", "posttrain.bounded", "posttrain.bounded_regex", "posttrain._regex_worker",
              "posttrain.aio", "posttrain.errors", "posttrain.bounded_files", "posttrain.worker_pool",
              "posttrain.owned", "posttrain.rows"]),
    ("algorithms", ["posttrain.algos"]),
    ("configuration", ["posttrain.config"]),
    ("models", ["posttrain.models"]),
    ("services", ["posttrain.sampling", "posttrain.rewards", "posttrain.sandbox", "posttrain.obs"]),
    ("environments", ["posttrain.envs"]),
    ("tasks and trainers", ["posttrain.tasks", "posttrain.training"]),
    ("run plug-ins", ["posttrain.guidance", "posttrain.cluster"]),
    ("the loop", ["posttrain.loop"]),
    ("drivers", ["posttrain.auto"]),
    ("entry points", ["posttrain.cli", "posttrain"]),
]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, known: set[str]) -> list[tuple[str, int]]:
    """(imported posttrain module, line) for every import in the file, wherever it sits."""
    is_pkg = path.name == "__init__.py"
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from pkg import mod` imports the module pkg.mod; `from pkg import name` imports pkg
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) \
                == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            targets = [node.args[0].value]
        for t in targets:
            if t != "posttrain" and not t.startswith("posttrain."):
                continue
            while t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in known and t != name:
                found.append((t, node.lineno))
    return found


def import_graph(root: Path) -> dict[str, list[tuple[str, int]]]:
    files = {module_name(p, root): p for p in root.rglob("*.py") if "__pycache__" not in p.parts}
    known = set(files)
    return {m: imports_of(p, m, known) for m, p in files.items()}


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> tuple[int, str]:
    best = (-1, "", "")
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            # "posttrain" names the package's own __init__ only, never everything under it
            if (module == p or (p != "posttrain" and module.startswith(p + "."))) and len(p) > len(best[2]):
                best = (i, p, p)
    if best[0] < 0:
        raise KeyError(f"{module} is in no layer: add its package to LAYERS (and to docs/architecture.md)")
    return best[0], best[1]


def upward_imports(graph, layers) -> list[str]:
    out = []
    for m, targets in sorted(graph.items()):
        lm, _ = layer_of(m, layers)
        for t, line in targets:
            lt, _ = layer_of(t, layers)
            if lt > lm:
                out.append(f"{m}:{line} imports {t} ({layers[lm][0]} -> {layers[lt][0]}: up a layer)")
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (cyc := visit(m)):
                return cyc
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state and (cyc := visit(n)):
            return cyc
    return None


def module_cycle(graph) -> list[str] | None:
    return find_cycle({m: {t for t, _ in ts} for m, ts in graph.items()})


def package_cycle(graph, layers) -> list[str] | None:
    pkgs: dict[str, set[str]] = {}
    for m, ts in graph.items():
        a = layer_of(m, layers)[1]
        pkgs.setdefault(a, set()).update(b for t, _ in ts if (b := layer_of(t, layers)[1]) != a)
    return find_cycle(pkgs)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / "posttrain" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / "posttrain"


TOY_LAYERS = [("low", ["posttrain.types"]), ("mid", ["posttrain.a", "posttrain.b"]), ("top", ["posttrain.c", "posttrain"])]


def test_the_checker_catches_an_upward_import_inside_a_function(tmp_path):
    root = _write(tmp_path, {"__init__.py": "", "types.py": "", "a/__init__.py": "", "c/__init__.py": "",
                             "a/x.py": "def f():\n    from posttrain.c import y\n", "c/y.py": "import posttrain.types\n"})
    bad = upward_imports(import_graph(root), TOY_LAYERS)
    assert bad == ["posttrain.a.x:2 imports posttrain.c.y (mid -> top: up a layer)"]


def test_the_checker_catches_cycles_between_modules_and_between_packages(tmp_path):
    root = _write(tmp_path, {"__init__.py": "", "types.py": "", "a/__init__.py": "", "b/__init__.py": "",
                             "a/x.py": "from posttrain.b.y import g\n",
                             "b/y.py": "import importlib\ndef g():\n    importlib.import_module('posttrain.a.z')\n",
                             "a/z.py": "from posttrain.a import x\n"})
    graph = import_graph(root)
    assert upward_imports(graph, TOY_LAYERS) == []
    assert module_cycle(graph) == ["posttrain.a.x", "posttrain.b.y", "posttrain.a.z", "posttrain.a.x"]
    assert package_cycle(graph, TOY_LAYERS) == ["posttrain.a", "posttrain.b", "posttrain.a"]


def test_the_checker_resolves_relative_imports_and_refuses_an_unlisted_package(tmp_path):
    root = _write(tmp_path, {"__init__.py": "", "types.py": "", "a/__init__.py": "", "c/__init__.py": "",
                             "a/x.py": "from ..c import y\n", "c/y.py": "", "d.py": ""})
    graph = import_graph(root)
    assert ("posttrain.c.y", 1) in graph["posttrain.a.x"]
    with pytest.raises(KeyError, match="posttrain.d is in no layer"):
        upward_imports(graph, TOY_LAYERS)


@pytest.fixture(scope="module")
def graph():
    return import_graph(SRC)


def test_every_module_is_in_a_layer(graph):
    for m in graph:
        layer_of(m, LAYERS)


def test_no_import_goes_up_a_layer(graph):
    bad = upward_imports(graph, LAYERS)
    assert not bad, "\n".join(bad)


def test_no_import_cycle_between_modules(graph):
    cyc = module_cycle(graph)
    assert cyc is None, " -> ".join(cyc)


def test_no_import_cycle_between_packages(graph):
    cyc = package_cycle(graph, LAYERS)
    assert cyc is None, " -> ".join(cyc)


def test_architecture_doc_shows_this_table():
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    for name, prefixes in LAYERS:
        row = next((ln for ln in doc.splitlines() if ln.startswith("|") and f"| {name} |" in ln), None)
        assert row is not None, f"docs/architecture.md's layer table has no row for {name!r}"
        for p in prefixes:
            short = p.removeprefix("posttrain.") if p != "posttrain" else "posttrain"
            assert f"`{short}" in row, f"docs/architecture.md's {name!r} row does not name {short}"
