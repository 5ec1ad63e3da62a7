"""The house's rules that a reader would otherwise have to trust (docs/architecture.md, issue #53): the trainer is
driven through its protocol (nothing outside it assigns its attributes, no capability probes, nothing it measured
written back into its input), and no module of the package outgrows the house's size."""

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "posttrain"
# the coding tasks' repositories are task data (the model edits them), not the package's code
DATA = (SRC / "tasks" / "data", SRC / "tasks" / "coding_agent" / "data")
MAX_LINES = 450


def _modules() -> list[Path]:
    return [p for p in SRC.rglob("*.py") if not any(d in p.parents for d in DATA)]


def test_the_modules_are_found():
    assert len(_modules()) > 200


def test_no_module_is_over_the_house_size():
    big = {str(p.relative_to(SRC)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"over {MAX_LINES} lines: {big}"


def test_the_trainer_writes_nothing_into_its_input_and_is_not_probed():
    """What forward_backward measured comes back in its Update; a trainer says whether it is sharded."""
    pattern = re.compile(r"captures_logprobs|trainer_logprobs|capture_logprobs|getattr\(.*sharded")
    hits = [f"{p.relative_to(SRC)}:{i}" for p in _modules() for i, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line)]
    assert not hits, hits


def _is_trainer(node: ast.expr) -> bool:
    """`trainer`, `self.trainer`, `x.trainer`: an expression that names a trainer from outside it."""
    if isinstance(node, ast.Name):
        return node.id == "trainer"
    return isinstance(node, ast.Attribute) and node.attr == "trainer"


def _trainer_assignments(source: str) -> list[int]:
    """Lines that assign an attribute of a trainer (`trainer.x = `, `self.trainer.x, y = `, `setattr(trainer, ...)`)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(el, ast.Attribute) and _is_trainer(el.value):
                    lines.append(node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and node.args and _is_trainer(node.args[0])):
            lines.append(node.lineno)
    return lines


def test_nothing_outside_a_trainer_assigns_its_attributes():
    """Per-step settings are arguments (StepSettings), not attribute assignments on the trainer."""
    found = [f"{p.relative_to(SRC)}:{n}" for p in _modules() for n in _trainer_assignments(p.read_text())]
    assert not found, found


def test_the_assignment_check_sees_each_form():
    src = "trainer.lr_scale = 0.5\nself.trainer.temperature, x = 1.0, 2\nsetattr(trainer, 'a', 1)\nt.x = 1\n"
    assert _trainer_assignments(src) == [1, 2, 3]


def _foreign_private_calls(source: str) -> list[str]:
    """`x._name(...)` calls where `x` is not `self`/`cls`, nor an instance a classmethod just made (`x = cls(...)`),
    nor a module (`os._exit`): another object's private method, which that object's public surface should offer
    instead (issue 62)."""
    tree = ast.parse(source)
    modules = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    made = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == "cls"
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        attr = node.func.attr
        if not attr.startswith("_") or attr.startswith("__"):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id in ({"self", "cls"} | modules | made):
            continue
        found.append(f"line {node.lineno}: {ast.unparse(node.func)}")
    return found


def test_no_cluster_module_calls_another_objects_private_method():
    """The transports talk to their pool through its public protocol (cluster/group_broadcast.py), not `pool._x()`."""
    bad = {
        str(p.relative_to(SRC)): calls
        for p in sorted((SRC / "cluster").glob("*.py"))
        if (calls := _foreign_private_calls(p.read_text()))
    }
    assert not bad, bad


def test_the_private_call_check_sees_each_form():
    assert _foreign_private_calls("pool._recover(slot)\nx.y._lock()\nf()._z()") == [
        "line 1: pool._recover",
        "line 2: x.y._lock",
        "line 3: f()._z",
    ]
    assert not _foreign_private_calls(
        "import os\nself._a()\ncls._b()\nos._exit(0)\nx.__len__()\nx.public()\np = cls(1)\np._spawn()"
    )


def _bench_imports() -> dict[str, set[str]]:
    """For each bench/ script, the sibling scripts it imports (bench/ is a folder of scripts run as `python
    bench/x.py`, so a sibling is imported by its bare name)."""
    bench = SRC.parents[1] / "bench"
    names = {p.stem for p in bench.glob("*.py")}
    out: dict[str, set[str]] = {}
    for p in bench.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                deps.add(node.module.split(".")[0])
        out[p.stem] = deps & names - {p.stem}
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of `graph`, each as the path that closes it (depth-first)."""
    found, state = [], dict.fromkeys(graph, 0)  # 0 unseen, 1 on the path, 2 done

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                found.append([*path[path.index(m) :], m])
            elif state.get(m) == 0:
                visit(m, [*path, m])
        state[n] = 2

    for n in sorted(graph):
        if state[n] == 0:
            visit(n, [n])
    return found


def test_bench_scripts_import_no_circle():
    graph = _bench_imports()
    assert len(graph) > 20
    assert not _cycles(graph), _cycles(graph)


def test_the_circle_check_sees_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]
    assert not _cycles({"a": {"b"}, "b": set()})


# ---- issue 62: records flow one way (a frozen Trajectory) ----------------------------------------------------------

# Objects of other types that share a field name with Trajectory, assigned where they live (module, variable).
_NOT_TRAJECTORIES = {
    ("rewards/hack_guard.py", "s"): "a rubric Score, the guard's own result",
    ("sampling/vllm_engine.py", "p"): "a pending weight push, handed its error",
}


def _trajectory_fields() -> set[str]:
    import dataclasses

    from posttrain.types import Trajectory

    return {f.name for f in dataclasses.fields(Trajectory)}


def _trajectory_field_assignments(source: str, module: str, fields: set[str]) -> list[str]:
    """'line: target' of every assignment to one of Trajectory's field names outside its constructor:
    `x.reward = `, `x.reward += `, `a, x.passed = `, `setattr(x, "reward", v)`, `object.__setattr__(x, ...)`. Not a
    trajectory, so not counted: `self` inside a class of its own (other than Trajectory), a name the same function
    bound to another class's constructor (`ep = _Episode()`), and `_NOT_TRAJECTORIES`."""
    found: list[str] = []

    def other_type(obj: ast.expr, cls: str | None, constructed: dict[str, str]) -> bool:
        if not isinstance(obj, ast.Name):
            return False
        if obj.id == "self":
            return cls is not None and cls != "Trajectory"
        return constructed.get(obj.id, "Trajectory") != "Trajectory" or (module, obj.id) in _NOT_TRAJECTORIES

    def visit(node: ast.AST, cls: str | None, constructed: dict[str, str]) -> None:
        if isinstance(node, ast.ClassDef):
            cls = node.name
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            constructed = {
                t.id: n.value.func.id
                for n in ast.walk(node)
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
                and n.value.func.id.lstrip("_")[:1].isupper()
                for t in n.targets
                if isinstance(t, ast.Name)
            }
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for el in ast.walk(t):
                if (isinstance(el, ast.Attribute) and isinstance(el.ctx, ast.Store) and el.attr in fields
                        and not other_type(el.value, cls, constructed)):
                    found.append(f"{node.lineno}: {ast.unparse(el)}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr", "object.__setattr__"):
            args = node.args
            if (len(args) >= 2 and isinstance(args[1], ast.Constant) and args[1].value in fields
                    and not other_type(args[0], cls, constructed)):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, cls, constructed)

    visit(ast.parse(source), None, {})
    return found


def test_nothing_assigns_a_trajectory_field_outside_its_constructor():
    """A record flows one way: scoring returns scores joined into new trajectories (envs/scoring.py), shaping and
    numbering return new ones; nothing edits a trajectory in place (issue 62: ~20 modules did)."""
    fields = _trajectory_fields()
    found = {
        rel: hits
        for p in _modules()
        if (hits := _trajectory_field_assignments(p.read_text(), rel := str(p.relative_to(SRC)), fields))
    }
    assert not found, found


def test_the_trajectory_assignment_check_sees_each_form_and_not_other_types():
    fields = _trajectory_fields()
    src = (
        "def f(t, ts):\n"
        "    t.reward = 1.0\n"
        "    t.reward += 2\n"
        "    a, ts[0].passed = 1, True\n"
        "    setattr(t, 'row', {})\n"
        "    object.__setattr__(t, 'error', 'x')\n"
        "    t.metrics['x'] = 1.0\n"  # a container inside: not an assignment of the field
        "    t.other = 1\n"
        "    ep = _Episode()\n"
        "    ep.error = 'x'\n"
        "class Slot:\n"
        "    def __init__(self):\n"
        "        self.row = {}\n"
    )
    assert [h.split(":")[0] for h in _trajectory_field_assignments(src, "m.py", fields)] == ["2", "3", "4", "5", "6"]
    assert _trajectory_field_assignments("def g(s):\n    s.passed = False\n", "rewards/hack_guard.py", fields) == []


def test_a_trajectory_is_frozen():
    import dataclasses

    import pytest

    from posttrain.types import Trajectory, Turn

    t = Trajectory(turns=[Turn([1], [2], [-0.1], 0)])
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.reward = 1.0  # pyright: ignore[reportAttributeAccessIssue] - the assignment a frozen dataclass refuses
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(t, "passed", True)  # noqa: B010 - the setattr form is the one under test
    assert dataclasses.replace(t, reward=1.0).reward == 1.0 and t.reward == 0.0


# ---- issue 62, third pass: typed values are not probed, nothing edits another object, private names stay home ------


def _class_name(e: ast.expr) -> str | None:
    """`Protocol`, `typing.Protocol`, `Generic[T]`, `dataclass(frozen=True)`: the name a base or decorator is."""
    if isinstance(e, (ast.Subscript, ast.Call)):
        return _class_name(e.value if isinstance(e, ast.Subscript) else e.func)
    return e.id if isinstance(e, ast.Name) else e.attr if isinstance(e, ast.Attribute) else None


def _typed_classes() -> set[str]:
    """The package's classes whose shape is declared: a Protocol, a @dataclass, a pydantic model (BaseModel, the
    config's _Strict), and their subclasses. A name defined twice counts only when every definition is typed, so a
    plain class of the same name elsewhere is never taken for one."""
    defs: dict[str, list[tuple[set[str], bool]]] = {}
    for p in _modules():
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ClassDef):
                bases = {b for b in map(_class_name, n.bases) if b}
                declared = bool(bases & {"Protocol", "BaseModel"}) or "dataclass" in map(_class_name, n.decorator_list)
                defs.setdefault(n.name, []).append((bases, declared))
    typed: set[str] = set()
    while True:
        more = {c for c, ds in defs.items() if c not in typed and all(d or bases & typed for bases, d in ds)}
        if not more:
            return typed
        typed |= more


def _annotated(a: ast.expr | None) -> set[str]:
    """The classes an annotation says a value is: `Task`, `Task | None`, `Optional[Task]`, `"Task"` (not a
    container of them: `list[Task]` is a list)."""
    if isinstance(a, ast.Constant) and isinstance(a.value, str):
        try:
            return _annotated(ast.parse(a.value, mode="eval").body)
        except SyntaxError:
            return set()
    if isinstance(a, ast.BinOp) and isinstance(a.op, ast.BitOr):
        return _annotated(a.left) | _annotated(a.right)
    if isinstance(a, ast.Subscript) and _class_name(a.value) == "Optional":
        return _annotated(a.slice)
    return {n} if isinstance(a, (ast.Name, ast.Attribute)) and (n := _class_name(a)) else set()


def _self_types(cls: ast.ClassDef) -> dict[str, set[str]]:
    """What a class says its attributes are: its annotated fields, `self.x: T = ...`, and `self.x = p` in
    `__init__` where the parameter `p` is annotated."""
    out: dict[str, set[str]] = {}
    for n in ast.walk(cls):
        if isinstance(n, ast.AnnAssign):
            if isinstance(n.target, ast.Name) and n in cls.body:
                out[n.target.id] = _annotated(n.annotation)
            elif isinstance(n.target, ast.Attribute) and ast.unparse(n.target.value) == "self":
                out[n.target.attr] = _annotated(n.annotation)
    for f in cls.body:
        if isinstance(f, ast.FunctionDef) and f.name == "__init__":
            params = {a.arg: _annotated(a.annotation) for a in f.args.args + f.args.kwonlyargs}
            for n in ast.walk(f):
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id in params:
                    for t in n.targets:
                        if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self":
                            out.setdefault(t.attr, params[n.value.id])
    return out


def _typed_probes(source: str, typed: set[str]) -> list[str]:
    """'line: call' of every `getattr(x, "name", ...)` / `hasattr(x, "name")` where `x` is a parameter, or a `self.`
    attribute, that its annotation says is one of `typed`: a probe for a capability the type already says it has
    or has not. `getattr(x, field)` with a variable name reads fields by name (a diff, a copy): not a probe."""
    found: list[str] = []

    def visit(node: ast.AST, known: dict[str, set[str]], own: dict[str, set[str]]) -> None:
        if isinstance(node, ast.ClassDef):
            own = _self_types(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            params = {p.arg: _annotated(p.annotation) for p in a.posonlyargs + a.args + a.kwonlyargs}
            known = {k: v for k, v in known.items() if k not in params} | params  # a parameter shadows an outer one
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            x = node.args[0]
            types = (known.get(x.id, set()) if isinstance(x, ast.Name)
                     else own.get(x.attr, set()) if isinstance(x, ast.Attribute) and ast.unparse(x.value) == "self"
                     else set())
            if types & typed:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, known, own)

    visit(ast.parse(source), {}, {})
    return found


# Probes left to fix (nothing joins; remove a line when it is fixed).
_PROBES_TO_FIX: set[str] = set()


def test_no_capability_probe_on_a_typed_value():
    """A value typed with the package's Protocol, dataclass or pydantic model is read by its declared attributes:
    what may be missing is a declared optional field or a protocol member with a default, never a `getattr` with a
    fallback (issue 62: task, env and sampler were probed for what their types already say)."""
    typed = _typed_classes()
    found = {
        f"{p.relative_to(SRC)}: {hit.split(': ', 1)[1]}"
        for p in _modules()
        for hit in _typed_probes(p.read_text(), typed)
    }
    assert not found - _PROBES_TO_FIX, sorted(found - _PROBES_TO_FIX)
    assert not _PROBES_TO_FIX - found, f"fixed: take these off _PROBES_TO_FIX: {sorted(_PROBES_TO_FIX - found)}"


def test_the_probe_check_sees_each_form_and_not_the_rest():
    typed = _typed_classes()
    assert {"Task", "Env", "Sampler", "Config", "Trajectory"} <= typed
    src = (
        "def f(task: Task, env: 'Env | None', s: Optional[Sampler], rows: list[Task], x, cfg: Config):\n"
        "    getattr(task, 'feedback', None)\n"
        "    hasattr(env, 'task')\n"
        "    getattr(s, 'tokenizer', None)\n"
        "    getattr(rows, 'x', 1)\n"  # a list of them: not one
        "    getattr(x, 'y', 2)\n"  # untyped
        "    getattr(cfg, name)\n"  # a field read by name
        "    def g(task):\n"
        "        return getattr(task, 'a', 0)\n"  # an untyped parameter of its own
        "class C:\n"
        "    task: Task\n"
        "    def __init__(self, sampler: Sampler):\n"
        "        self.sampler = sampler\n"
        "    def m(self):\n"
        "        return hasattr(self.task, 'judges') or getattr(self.sampler, 'context', None)\n"
    )
    assert [h.split(":")[0] for h in _typed_probes(src, typed)] == ["2", "3", "4", "15", "15"]


def _constructed(fn: ast.AST) -> set[str]:
    """Names a function binds to an object it makes itself: `x = Name(...)` with a class's capitalised name (or
    `_Name`), `x = cls(...)`, or a function it defines (`def inner(...)`, then `inner.__name__ = ...`). Setting up
    what it just made is the maker's own business."""
    made = {n.name for n in ast.walk(fn) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not fn}
    return made | {
        t.id
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
        and (name := _class_name(n.value.func)) is not None and (name == "cls" or name.lstrip("_")[:1].isupper())
        for t in n.targets
        if isinstance(t, ast.Name)
    }


def _foreign_assignments(source: str) -> list[tuple[str, str]]:
    """(function, target) of every assignment to another object's attribute: `a.b = `, `a.b += `, `a.b: T = `,
    `x, a.b = `, `setattr(a, ...)`, `object.__setattr__(a, ...)`; where `a` is not `self`/`cls`, not what the same
    function made (`_constructed`), and not a module or the module's own global (`torch.x`, `_local.event`: a
    module's state, not another object's attribute)."""
    tree = ast.parse(source)
    globals_ = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    globals_ |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    found: list[tuple[str, str]] = []

    def own(obj: ast.expr, made: set[str]) -> bool:
        base = obj
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(obj, ast.Name) and obj.id in {"self", "cls"} | made:
            return True
        return isinstance(base, ast.Name) and base.id in globals_

    def visit(node: ast.AST, fn: str, made: set[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn, made = node.name, _constructed(node)
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for el in ast.walk(t):
                if isinstance(el, ast.Attribute) and isinstance(el.ctx, ast.Store) and not own(el.value, made):
                    found.append((fn, ast.unparse(el)))
        if (isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr", "object.__setattr__") and node.args
                and not own(node.args[0], made)):
            found.append((fn, f"setattr({ast.unparse(node.args[0])})"))
        for child in ast.iter_child_nodes(node):
            visit(child, fn, made)

    visit(tree, "<module>", set())
    return found


# Objects of other libraries whose own API is setting their attributes (a tokenizer's pad token, an HF config, a
# torch autograd context, uvicorn's exit flag, Starlette's app.state, a logging record): not ours to give methods.
_LIBRARY_OBJECTS = {
    ("models/default.py", "_convert", "model.hf_quantizer"),
    ("models/default.py", "_convert", "model.config._name_or_path"),
    ("models/load.py", "load_model", "model.hf_quantizer"),
    ("models/load.py", "ensure_pad_token", "tok.pad_token"),
    ("models/matmul.py", "forward", "ctx.has_bias"),  # torch.autograd.Function's ctx
    ("models/matmul.py", "route_linears_", "m.__class__"),  # a torch Linear swapped for the oneDNN one in place
    ("rewards/judges/openai_backend.py", "bound_replies", "client.event_hooks"),  # httpx
    ("rewards/judges/openai_backend.py", "__call__", "response.stream"),  # httpx
    ("rewards/reward_model.py", "__init__", "self.tok.pad_token"),
    ("rewards/reward_model.py", "__init__", "self.tok.padding_side"),
    ("rewards/reward_model.py", "__init__", "self.model.config.pad_token_id"),
    ("sampling/http_logs.py", "filter", "record.args"),  # a logging.Filter edits the record it is given
    ("sampling/http_serve.py", "stop", "self.server.should_exit"),  # uvicorn.Server
    ("sampling/http_serve.py", "stop", "self.server.force_exit"),
    *(("sampling/kv_cache.py", "cache_from_rows", f"layer.{a}") for a in
      ("_k", "_v", "device", "length", "is_initialized", "keys", "values")),  # an HF cache layer, filled in place
    ("sampling/openai_server.py", "create_app", "app.state.posttrain"),  # Starlette's app.state
    ("sampling/openai_server.py", "create_app", "app.state.recorder"),
    ("sampling/packed_linear.py", "pack_linears_", "setattr(parent)"),  # a torch module's child replaced
    ("sampling/precision.py", "low_precision_copy", "setattr(parent)"),
    ("sampling/vllm_engine.py", "_sample_rows", "sp.structured_outputs"),  # vLLM's SamplingParams
    ("sampling/vllm_engine.py", "_hook_steps", "engine.step"),  # vLLM's engine, its step wrapped
    ("sampling/weight_ipc.py", "bind", "params[s.name].data"),  # torch
    ("sandbox/harness_solution.py", "handle", "setattr(obj)"),  # the solution under test, as its test asks
    ("envs/verifiers_env.py", "_serving", "env.taskset"),  # a verifiers Environment
    ("tasks/verifiers_task.py", "_build", "env.taskset"),
    ("training/checkpointing.py", "checkpoint_layers", "m.gradient_checkpointing"),  # HF modules
    ("training/checkpointing.py", "checkpoint_layers", "m._gradient_checkpointing_func"),
    ("training/checkpointing.py", "checkpoint_layers", "m._can_checkpoint_with_cache"),
    ("training/distributed.py", "_all_reduce_grads", "p.grad"),  # torch
    ("training/reward_model_fit.py", "build_reward_model", "cfg.num_labels"),  # an HF config before the model
    ("training/reward_model_fit.py", "build_reward_model", "cfg.num_hidden_layers"),
    ("training/reward_model_fit.py", "build_reward_model", "model.config.layer_types"),
    ("training/reward_model_fit.py", "build_reward_model", "tok.padding_side"),
    ("training/reward_model_fit.py", "build_reward_model", "model.config.pad_token_id"),
}

# Our own objects still edited from outside: each is an item to fix (a method of the owner, a new value by
# dataclasses.replace, or a result returned); remove its line when it is. Nothing new joins this list.
_TO_FIX = {
    ("algos/prompt_selection.py", "observe", "s.last_step"),  # PromptStats: a method, or a new record
    ("algos/prompt_selection.py", "observe", "s.groups"),
    ("algos/prompt_selection.py", "observe", "s.backoff_cleared"),
    ("algos/prompt_selection.py", "clear_backoff", "s.backoff_cleared"),
    ("auto/proposers.py", "propose", "p.reason"),  # a fallback Proposal relabelled: replace()
    ("auto/proposers.py", "propose", "p.source"),
    ("cli/inspect_cmds.py", "_eval_suite", "st.max_tokens"),  # suite tasks: replace()
    ("cluster/ray_episodes.py", "pick", "slot.open"),  # the pools' Slot records: methods of Slot
    ("cluster/ray_episodes.py", "replace", "slot.open"),
    ("cluster/ray_episodes.py", "replace", "slot.retired"),
    ("cluster/ray_episodes.py", "replace", "slot.handle"),
    ("cluster/ray_episodes.py", "replace", "slot.incarnation"),
    ("cluster/ray_episodes.py", "done", "slot.open"),
    ("cluster/ray_sampler.py", "recover", "slot.retired"),
    ("cluster/ray_sampler.py", "recover", "slot.incarnation"),
    ("cluster/ray_sampler.py", "recover", "slot.handle"),
    ("cluster/ray_sampler.py", "recover", "slot.node_id"),
    ("cluster/vllm_servers.py", "recover", "slot.incarnation"),
    ("cluster/vllm_servers.py", "recover", "slot.server"),
    ("cluster/vllm_servers.py", "_retire", "slot.retired"),
    ("cluster/server_processes.py", "kill_group", "server.killed"),  # a server process record: its methods
    ("cluster/server_processes.py", "note_shm", "server.shm"),
    ("cluster/server_processes.py", "note_shm", "server.shm_served"),
    ("cluster/vllm_server_launch.py", "wait_ready", "server.shm"),
    ("config/schema.py", "_derive_sampler_ratio", "setattr(a)"),  # the algorithm section's derived defaults
    ("envs/agent.py", "server_for", "app.state.posttrain.renderer"),  # the served state's renderer
    ("envs/episode_threads.py", "_abandon", "thread.stuck"),  # thread and job records: their methods
    ("envs/episode_threads.py", "_start", "job.task"),
    ("envs/episode_threads.py", "_finished", "job.done"),
    ("envs/episode_threads.py", "_finished", "thread.stuck"),
    ("envs/openenv_client.py", "_user", "ep.chars_cut"),  # the episode record: its methods
    ("envs/openenv_client.py", "_play", "ep.context_stop"),
    ("guidance/profiles.py", "score", "t.guidance.teacher_hint"),  # a trajectory's Guidance edited in place
    ("rewards/tags.py", "tag", "t.guidance.tags"),
    ("rewards/hack_guard.py", "score", "s.passed"),  # a rubric Score edited: replace()
    ("rewards/hack_guard.py", "score", "s.reward"),
    ("rewards/judges/setup.py", "configure_task_judges", "j.runner.cache"),  # a judge's cache: the runner's method
    ("sampling/hf_sampler.py", "_prefix_hits", "self.prefix.hits"),  # the prefix cache counts its own hits
    ("sampling/hf_sampler.py", "_prefix_hits", "self.prefix.misses"),
    ("sampling/hf_sampler.py", "_prefix_hits", "self.prefix.reused_tokens"),
    ("sampling/hf_sampler.py", "_prefix_hits", "self.prefix.prefilled_tokens"),
    ("sampling/openai_chat.py", "output_plan", "st.replies"),  # the served state's parsers: made with the state
    ("sampling/openai_chat.py", "run_chat", "st.replies"),
    ("sampling/vllm_engine.py", "_apply_pending", "p.error"),  # a pending push: its fail()
    ("sampling/vllm_weights.py", "push", "self.engine.expected_version"),  # the engine's method
    ("sandbox/run.py", "_namespaced_command", "p.pre"),  # a launch record: replace()
    ("tasks/from_config.py", "task_from_config", "task.rubric.timeout_s"),  # Rubric.with_timeout, both rubric kinds
    ("tasks/mixture.py", "timeout_s", "p.task.rubric.timeout_s"),
    ("tasks/search_qa_world.py", "build_world", "p.text"),  # the world's entities: text set when made
    ("tasks/search_qa_world.py", "build_world", "c.text"),
    ("tasks/search_qa_world.py", "build_world", "k.text"),
    ("tasks/search_qa_world.py", "build_world", "f.text"),
    ("tasks/search_qa_world.py", "build_world", "co.text"),
}


def test_nothing_assigns_another_objects_attributes():
    """An object's state changes through its own methods, or a new value is made (`dataclasses.replace`): the
    sampler is told its version (`set_version`), the run's Components and a built task are replaced, never edited
    from outside (issue 62). `_LIBRARY_OBJECTS` are other libraries' objects; `_TO_FIX` is what is left to fix:
    a hit in neither fails, and so does a line of `_TO_FIX` that is fixed (remove it)."""
    found = {(str(p.relative_to(SRC)), fn, t) for p in _modules() for fn, t in _foreign_assignments(p.read_text())}
    new = sorted(found - _LIBRARY_OBJECTS - _TO_FIX)
    assert not new, f"assigned from outside the object (give its owner a method, or replace it): {new}"
    gone = sorted((_LIBRARY_OBJECTS | _TO_FIX) - found)
    assert not gone, f"fixed or moved: take these off the lists in tests/test_house.py: {gone}"


def test_the_foreign_assignment_check_sees_each_form_and_not_the_owners():
    src = (
        "import torch\n"
        "_local = object()\n"
        "def f(sampler, c, task):\n"
        "    sampler.policy_version = 3\n"
        "    c.ref_model += 1\n"
        "    a, task.rubric = 1, 2\n"
        "    setattr(task, 'x', 1)\n"
        "    object.__setattr__(c, 'y', 2)\n"
        "    self.sampler.policy_version = 4\n"
        "    s = Slot()\n"
        "    s.open = True\n"  # made here
        "    def inner(): pass\n"
        "    inner.__name__ = 'x'\n"  # defined here
        "    torch.x = 1\n"  # a module
        "    _local.event = 1\n"  # the module's own global
        "    t.metrics['x'] = 1\n"  # a container inside: not an attribute assignment
        "class A:\n"
        "    def m(self):\n"
        "        self.x = 1\n"
        "    @classmethod\n"
        "    def make(cls):\n"
        "        p = cls()\n"
        "        p.y = 2\n"
        "        cls.z = 3\n"
    )
    assert _foreign_assignments(src) == [
        ("f", "sampler.policy_version"),
        ("f", "c.ref_model"),
        ("f", "task.rubric"),
        ("f", "setattr(task)"),
        ("f", "setattr(c)"),
        ("f", "self.sampler.policy_version"),
    ]


def _private_imports(source: str) -> list[str]:
    """'module.name' of every `from posttrain.x import _name` (or a relative one): a name its module keeps to
    itself, used from outside it."""
    return [
        f"{node.module}.{a.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "posttrain")
        for a in node.names
        if a.name.startswith("_") and not a.name.startswith("__")
    ]


# Private names imported across modules (issue 62 removed the last of them): none may come back. A name another
# module needs is public (renamed, its module's docstring saying what it offers) or moved where it is used.
_PRIVATE_IMPORTS_TO_FIX: set[str] = set()


def test_no_private_name_is_imported_from_another_module():
    found = {f"{p.relative_to(SRC)}: {name}" for p in _modules() for name in _private_imports(p.read_text())}
    new = sorted(found - _PRIVATE_IMPORTS_TO_FIX)
    assert not new, f"a _private name imported across modules (make it public, or keep it home): {new}"
    gone = sorted(_PRIVATE_IMPORTS_TO_FIX - found)
    assert not gone, f"fixed or moved: take these off _PRIVATE_IMPORTS_TO_FIX in tests/test_house.py: {gone}"


def test_the_private_import_check_sees_each_form():
    src = (
        "from posttrain.a import _x, y, __all__\nfrom .b import _z\nfrom other import _w\n"
        "def f():\n    from posttrain.c import _v\n"
    )
    assert _private_imports(src) == ["posttrain.a._x", "b._z", "posttrain.c._v"]


def _test_helper_imports() -> dict[str, set[str]]:
    """For each helper module of tests/ (a .py that is neither a test module nor a conftest), the helpers it imports:
    tests import them by bare name (`from context_episodes import ...`) or by path (`tests.x.y`)."""
    tests = SRC.parents[1] / "tests"
    helpers = {p.stem: p for p in tests.rglob("*.py") if not p.stem.startswith("test_") and p.stem != "conftest"}
    out: dict[str, set[str]] = {}
    for name, p in helpers.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(p.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                mods = [node.module]
            deps |= {m.split(".")[-1] if m.startswith("tests.") else m.split(".")[0] for m in mods}
        out[name] = deps & set(helpers) - {name}
    return out


def test_test_helpers_import_no_circle():
    graph = _test_helper_imports()
    assert {"context_episodes", "batches", "hermetic"} <= set(graph)
    assert not _cycles(graph), _cycles(graph)
