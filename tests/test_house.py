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
