"""The loop package's shape: no import cycle among its modules (imports inside functions count too)."""

import ast
from pathlib import Path

import posttrain.loop

LOOP = Path(posttrain.loop.__file__).parent


def _loop_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("posttrain.loop."):
            out.add(node.module.split(".")[2])
        elif isinstance(node, ast.ImportFrom) and node.module == "posttrain.loop":
            out.update(a.name for a in node.names if (LOOP / f"{a.name}.py").exists())
            out.add("__init__")
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[2] for a in node.names if a.name.startswith("posttrain.loop."))
    return out


def import_graph() -> dict[str, set[str]]:
    return {p.stem: _loop_imports(p) - {p.stem} for p in LOOP.glob("*.py")}


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


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_loop():
    graph = import_graph()
    assert {"run", "pg_stepper", "es_stepper", "collect", "batch", "schedule"} <= set(graph)
    assert find_cycle(graph) is None, find_cycle(graph)
