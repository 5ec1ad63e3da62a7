"""A step hands back what happened (`StepResult`); the Run reads nothing else from its stepper (issue 62: the
`last_trajectories` / `last_stats` side channel is gone, and `apply_overrides` is named by the protocol)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from posttrain.loop import stepper as stepper_module
from posttrain.loop.es_stepper import ESStepper
from posttrain.loop.pg_stepper import PolicyGradientStepper
from posttrain.loop.stepper import Stepper, StepResult
from posttrain.types import SampleStats, Trajectory

LOOP = Path(stepper_module.__file__).parent
PROTOCOL = {n for n, v in vars(Stepper).items() if not n.startswith("_") and callable(v)}


def _stepper_attributes(path: Path) -> list[tuple[int, str]]:
    """Every `<x>.attr` where x is a name or attribute called `stepper`, in one module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            v = node.value
            if (isinstance(v, ast.Name) and v.id == "stepper") or (isinstance(v, ast.Attribute) and v.attr == "stepper"):
                out.append((node.lineno, node.attr))
    return out


def test_the_protocol_names_what_the_run_calls():
    assert PROTOCOL == {"step", "apply_overrides", "state_dict", "load_state_dict", "close"}


@pytest.mark.parametrize("module", ["run.py", "watch.py", "checkpoint.py"])
def test_the_run_reads_nothing_from_a_stepper_beyond_its_protocol(module):
    used = _stepper_attributes(LOOP / module)
    outside = [(line, a) for line, a in used if a not in PROTOCOL]
    assert not outside, f"loop/{module} reads a stepper's {outside}: a step hands back a StepResult"


@pytest.mark.parametrize("cls", [PolicyGradientStepper, ESStepper])
def test_both_steppers_are_whole_steppers_and_return_a_step_result(cls):
    for name in PROTOCOL:
        assert callable(getattr(cls, name, None)), f"{cls.__name__} lacks {name}"
    assert inspect.signature(cls.step).return_annotation in ("StepResult", StepResult)
    assert not any(a.startswith("last_") for a in vars(cls)), "no last_* side channel"


def test_a_training_run_logs_what_each_step_returned(tmp_path, monkeypatch):
    """A real (tiny) run: each step's StepResult carries the metrics, every rollout and the shown rows' stats, and
    samples.jsonl is written from it."""
    from posttrain.config import load_config
    from posttrain.loop import train

    results: list[StepResult] = []
    orig = PolicyGradientStepper.step

    async def step(self, n):
        r = await orig(self, n)
        results.append(r)
        return r

    monkeypatch.setattr(PolicyGradientStepper, "step", step)
    cfg = load_config(
        None,
        [
            "model.name=tiny-random",
            "task.name=count-a",
            "loop.steps=2",
            "loop.prompts_per_step=2",
            "loop.samples_per_step=2",
            "algorithm.num_generations=2",
            "sampling.max_tokens=4",
            f"run.output_dir={tmp_path}",
            "logging.console=false",
        ],
    )
    res = train(cfg)
    assert len(results) == 2
    for r in results:
        assert isinstance(r, StepResult)
        assert r.metrics["policy_version"] >= 1
        assert r.trajectories and all(isinstance(t, Trajectory) for t in r.trajectories)
        assert all(isinstance(s, SampleStats) for s in r.stats.values())
        assert set(r.stats) <= {t.sample_id for t in r.trajectories}
    assert (res.run_dir / "samples.jsonl").exists()


def test_the_collectors_take_a_collect_plan_not_the_config():
    """Collectors are built from the CollectPlan the wiring decides once (loop/step_plan.py), never from a Config."""
    from posttrain.loop.async_collect import AsyncCollector
    from posttrain.loop.collect import SyncCollector
    from posttrain.loop.step_plan import CollectPlan

    for cls in (SyncCollector, AsyncCollector):
        params = inspect.signature(cls.__init__).parameters
        assert not [p for p in params.values() if "Config" in str(p.annotation)], cls
        assert str(params["plan"].annotation) in ("CollectPlan", str(CollectPlan))
    for module in ("collect.py", "async_collect.py"):
        text = (LOOP / module).read_text()
        assert "cfg" not in text and "Config" not in text, f"loop/{module} reads the config"


def test_the_collect_plan_is_decided_from_the_config_once():
    from posttrain.config import load_config
    from posttrain.loop.step_plan import CollectPlan

    cfg = load_config(None, ["loop.mode=async", "loop.prompts_per_step=3", "loop.max_staleness=2", "run.seed=5",
                             "algorithm.overlong_buffer_frac=0.25", "loop.steps=7"])
    plan = CollectPlan.from_config(cfg)
    assert (plan.prompts_per_step, plan.seed, plan.steps, plan.max_staleness) == (3, 5, 7, 2)
    assert plan.rollout_workers == 3 * (2 + 1) and plan.overlong_penalty
