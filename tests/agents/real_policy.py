"""One AgentEnv training step with a real (tiny, random) model as the policy: HFSampler samples the agent's calls at
the run's default sampling settings (config/sampling.py: SamplingConfig()), the trainer scores them at the same
temperature, and the step's `train/sampler_logp_abs_diff` says whether the recorded log-probs are the trainer's.

The frameworks' prompts are long (smolagents' system prompt is ~6k characters; tiny-random's tokenizer has a token a
character), so the sampler's context is raised past the model's 1024 positions (its rotary positions extend)."""

from __future__ import annotations

import asyncio
from typing import Any

from posttrain.sampling.context import ContextBudget

CONTEXT = 16384


def default_config_step(agent_fn: Any, rows: list[dict[str, Any]], group: int = 2, max_tokens: int = 8) -> dict:
    """`agent_fn` inside AgentEnv for `group` episodes a row, sampled by tiny-random at SamplingConfig()'s
    temperature / top_p / top_k, then one forward_backward: the step's metrics, with the episodes' agent/* sums."""
    from posttrain.algos import LOSSES, LossParams
    from posttrain.config.sampling import SamplingConfig
    from posttrain.envs.agent import AgentEnv
    from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
    from posttrain.models import ensure_pad_token, load_model, stop_token_ids
    from posttrain.sampling import HFSampler
    from posttrain.training.trainer import Trainer
    from posttrain.types import Group, SampleParams

    cfg = SamplingConfig()
    model, tok = load_model("tiny-random", seed=0)
    ensure_pad_token(tok)
    sampler = HFSampler(model, tok, stop_token_ids(model, tok), seed=0, context=ContextBudget(CONTEXT))
    params = SampleParams(max_tokens=max_tokens, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
    env = AgentEnv(agent_fn, tokenizer=tok, timeout_s=120, request_timeout_s=60)

    async def go() -> list[Any]:
        try:
            return list(await asyncio.gather(*(env.rollout(r, sampler, params) for r in rows for _ in range(group))))
        finally:
            await env.close()

    trajs = asyncio.run(go())
    failed = [t.error for t in trajs if t.failed]
    assert not failed, failed
    groups = [Group(i, trajs[i * group : (i + 1) * group]) for i in range(len(rows))]
    batch, _ = build_batch(
        sequences_from_groups(groups), BatchOptions(keep_zero_advantage=True), sampler.policy_version
    )
    trainer = Trainer(model, pad_id=tok.pad_token_id, temperature=params.temperature)
    m = dict(trainer.forward_backward(batch, LOSSES["ppo_clip"], LossParams()).metrics)
    for key in ("agent/calls", "agent/temperature_overrides", "agent/dropped_calls"):
        m[key] = sum(t.metrics.get(key, 0.0) for t in trajs)
    m["timeouts"] = sum(t.metrics.get("agent/timed_out", 0.0) for t in trajs)
    return m
