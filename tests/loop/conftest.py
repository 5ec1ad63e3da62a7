"""Fixtures shared by the loop tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def crash_in_rl(monkeypatch):
    """crash_in_rl(cfg, at_step): run cfg until RL step `at_step` (0-based) raises a simulated crash; returns the
    crashed Run (its run_dir holds what was saved), with the stepper restored so a resume runs normally."""
    from posttrain.loop.pg_stepper import PolicyGradientStepper
    from posttrain.loop.run import Run

    def crash(cfg, at_step: int):
        run, orig = Run(cfg), PolicyGradientStepper.step

        async def step(self, n):
            if n == at_step:
                raise RuntimeError("simulated crash")
            return await orig(self, n)

        monkeypatch.setattr(PolicyGradientStepper, "step", step)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run.run()
        monkeypatch.setattr(PolicyGradientStepper, "step", orig)
        return run

    return crash
