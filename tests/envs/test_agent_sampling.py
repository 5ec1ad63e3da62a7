"""The run's sampling settings (the `params` a rollout gets) are an agent's defaults: no agent framework sets
`temperature`, and a policy sampled at 1.0 but scored by the trainer at the run's 0.7 is off-policy on every token.
A request that sets its own temperature wins, and is flagged (once) and counted."""

import asyncio
import logging

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from posttrain.envs.agent import AgentEnv
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams

RUN = SampleParams(max_tokens=7, temperature=0.7, top_p=0.9, top_k=5, stop=["\n"])


class ParamsSampler(ScriptedSampler):
    """Keeps the SampleParams of every call."""

    def __init__(self, tok, texts):
        super().__init__(tok, texts)
        self.params: list[SampleParams] = []

    async def sample(self, prompts_P, params, n=1):
        self.params.append(params)
        return await super().sample(prompts_P, params, n)


def _agent(**request):
    async def agent(client, row):
        msgs = [{"role": "user", "content": row["prompt"]}]
        await client.chat.completions.create(model="policy", messages=msgs, **request)
        await client.completions.create(model="policy", prompt="text " + row["prompt"], **request)
        return 1.0

    return agent


def _rollouts(tok, agent, n=1, params: SampleParams | None = RUN, **env_kw):
    sampler = ParamsSampler(tok, ["fine"])
    env = AgentEnv(agent, tokenizer=tok, timeout_s=30, **env_kw)

    async def go():
        trajs = [await env.rollout({"prompt": "q"}, sampler, params) for _ in range(n)]
        await env.close()
        return trajs

    return asyncio.run(go()), sampler.params, env


def test_an_agent_that_sets_nothing_samples_with_the_run_s_settings(tiny, caplog):
    _, tok = tiny
    with caplog.at_level(logging.WARNING, logger="posttrain.envs.agent"):
        (t,), seen, env = _rollouts(tok, _agent())
    assert len(seen) == 2  # chat and text completions alike
    for p in seen:
        assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (0.7, 0.9, 5, 7)
        assert p.stop == []  # a task's stop strings are for its own prompts, not an agent's
    assert t.metrics["agent/temperature_overrides"] == 0
    assert not [r for r in caplog.records if "temperature" in r.getMessage()]


def test_a_request_s_own_settings_win_and_a_different_temperature_is_flagged_once(tiny, caplog):
    _, tok = tiny
    with caplog.at_level(logging.WARNING, logger="posttrain.envs.agent"):
        trajs, seen, env = _rollouts(tok, _agent(temperature=1.0, top_p=0.5, max_tokens=3), n=2)
    assert [(p.temperature, p.top_p, p.max_tokens) for p in seen] == [(1.0, 0.5, 3)] * 4
    assert [t.metrics["agent/temperature_overrides"] for t in trajs] == [2.0, 2.0]
    said = [r.getMessage() for r in caplog.records if "temperature" in r.getMessage()]
    assert len(said) == 1 and "0.7" in said[0] and "1.0" in said[0] and "sampling.temperature" in said[0]


def test_a_request_that_sets_the_run_s_temperature_is_not_flagged(tiny):
    _, tok = tiny
    (t,), seen, _ = _rollouts(tok, _agent(temperature=0.7))
    assert [p.temperature for p in seen] == [0.7, 0.7]
    assert t.metrics["agent/temperature_overrides"] == 0


def test_the_env_s_own_max_tokens_wins_over_the_run_s(tiny):
    _, tok = tiny
    _, seen, _ = _rollouts(tok, _agent(), max_tokens=11)
    assert [p.max_tokens for p in seen] == [11, 11]


def test_a_rollout_without_params_samples_as_before(tiny):
    _, tok = tiny
    _, seen, _ = _rollouts(tok, _agent(), params=None)
    assert [(p.temperature, p.top_p) for p in seen] == [(1.0, 1.0)] * 2


def test_a_short_agent_run_is_on_policy_at_the_run_s_temperature(tiny):
    """The trainer scores at sampling.temperature; the agent sets none. With the run's temperature as the agent's
    default, the sampler's log-probs are the trainer's (fp32, same weights): the drift metric stays near 0."""
    from posttrain.algos import LOSSES, LossParams
    from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
    from posttrain.models import ensure_pad_token, stop_token_ids
    from posttrain.sampling import HFSampler
    from posttrain.training.trainer import Trainer
    from posttrain.types import Group

    model, tok = tiny
    ensure_pad_token(tok)
    sampler = HFSampler(model, tok, stop_token_ids(model, tok), seed=0)
    params = SampleParams(max_tokens=12, temperature=0.7)

    async def agent(client, row):
        msgs = [{"role": "user", "content": row["prompt"]}]
        r = await client.chat.completions.create(model="policy", messages=msgs)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "More."}]
        r = await client.chat.completions.create(model="policy", messages=msgs)
        return float(len(r.choices[0].message.content or "") % 3)

    env = AgentEnv(agent, tokenizer=tok, timeout_s=60)

    async def go():
        trajs = await asyncio.gather(*(env.rollout({"prompt": "Say hi."}, sampler, params) for _ in range(4)))
        await env.close()
        return list(trajs)

    trajs = asyncio.run(go())
    assert not any(t.failed for t in trajs)
    batch, _ = build_batch(
        sequences_from_groups([Group(0, trajs)]), BatchOptions(keep_zero_advantage=True), sampler.policy_version
    )
    trainer = Trainer(model, pad_id=tok.pad_token_id, temperature=params.temperature)
    m = trainer.forward_backward(batch, LOSSES["ppo_clip"], LossParams()).metrics
    assert m["train/sampler_logp_abs_diff"] < 0.01, m["train/sampler_logp_abs_diff"]
