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
