"""examples/minimal_loop.py: a whole GRPO loop from the public pieces, at most 100 lines, and it learns."""

import asyncio
import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_loop.py"


def test_minimal_loop_is_short_and_raises_the_reward():
    assert len(EXAMPLE.read_text().splitlines()) <= 100
    spec = importlib.util.spec_from_file_location("minimal_loop", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rewards = asyncio.run(mod.main())
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.2, (first, last)


def test_minimal_loop_imports_posttrain_from_the_package_only():
    """Issue #53: a loop of your own needs one import line; every name the example takes is in `__all__`."""
    import ast

    import posttrain

    tree = ast.parse(EXAMPLE.read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in modules if m and m.startswith("posttrain")} == {"posttrain"}, modules
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "posttrain"
             for a in n.names}
    assert names <= set(posttrain.__all__), names - set(posttrain.__all__)


def test_all_lists_exactly_the_lazy_exports():
    """`__all__` is written out for linters and type checkers; it must name what `__getattr__` resolves."""
    import posttrain

    assert sorted(posttrain.__all__) == sorted(["train", "__version__", *posttrain._EXPORTS])


def test_the_public_names_resolve_without_loading_torch_first():
    import subprocess
    import sys

    code = ("import sys, posttrain; assert 'torch' not in sys.modules; "
            "[getattr(posttrain, n) for n in posttrain.__all__]; print(len(posttrain.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
