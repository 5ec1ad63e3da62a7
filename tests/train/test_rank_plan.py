"""Trainer ranks take no Config (issue 62): rank 0 decides the loss, the token budget and the teacher once, and
every rank builds its model, Trainer and loss from the `RankPlan` it receives; no rank loads the task."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from posttrain.config import load_config
from posttrain.loop.step_plan import StepPlan
from posttrain.training import launch
from posttrain.training.from_config import LossSetup, trainer_setup
from posttrain.training.rank_plan import RankPlan


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_a_rank_is_started_without_the_config_or_the_task():
    imported = _imports(Path(launch.__file__))
    assert not {m for m in imported if m.startswith(("posttrain.config", "posttrain.tasks", "posttrain.loop"))}, imported
    for fn in (launch.run_worker, launch.start_ranks, launch.rank_trainer, launch.world_size):
        for p in inspect.signature(fn).parameters.values():
            assert "Config" not in str(p.annotation), f"{fn.__name__}({p.name}: {p.annotation})"


def test_the_plan_carries_the_loss_rank_0_decided_through_json():
    cfg = load_config(
        None,
        ["model.name=tiny-random", "algorithm.loss=cispo", "algorithm.cispo_epsilon_low=0.3", "sampling.max_tokens=48",
         "algorithm.is_correction=truncate", "algorithm.hint_distill.enabled=true", "algorithm.hint_distill.coef=0.25"],
    )
    step = StepPlan.from_config(cfg, 48)
    plan = RankPlan.of(cfg.model, cfg.lora, 7, trainer_setup(cfg), cfg.algorithm, step.loss.params)
    back = RankPlan.model_validate_json(plan.model_dump_json())
    assert back == plan
    loss = LossSetup.build(back.algorithm, back.params())
    assert loss.params == step.loss.params  # the token budget and the teacher's weight as rank 0 decided them
    assert loss.params.max_tokens == 48 and loss.params.distill_coef == 0.25 and loss.params.distill_prefix == "hint"
    assert (loss.token_weight_fn is None) == (step.loss.token_weight_fn is None)
    assert back.setup.temperature == cfg.sampling.temperature and back.seed == 7
