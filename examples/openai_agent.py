"""Train an agent written against the `openai` client, with posttrain's low-level pieces (~90 lines).

The agent is plain `openai` code: it asks the policy a sum, then asks it to check its answer. AgentEnv serves the
live policy on 127.0.0.1 for it and records every call's exact tokens and logprobs, so the two calls of an
episode become one multi-turn Trajectory that GRPO trains on.

Run it (tiny-random: a smoke test in seconds; the default model learns for real, slowly on CPU):
    python examples/openai_agent.py --steps 3
    python examples/openai_agent.py --model default --steps 20 --group 8
Needs the serve extra: pip install 'posttrain[serve]'.
"""

import argparse
import asyncio
import re

import openai
import torch

from posttrain.algos import LOSSES, LossParams
from posttrain.envs.agent import AgentEnv
from posttrain.envs.scoring import scored_by
from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
from posttrain.models import ensure_pad_token, load_model, stop_token_ids
from posttrain.obs.rollout_stats import rollout_metrics
from posttrain.sampling import HFSampler
from posttrain.training.trainer import Trainer
from posttrain.types import Group


def last_number(text: str) -> int | None:
    nums = re.findall(r"-?\d+", text or "")
    return int(nums[-1]) if nums else None


async def check_your_work(client: openai.AsyncOpenAI, row: dict) -> dict:
    """A two-step agent: answer, then re-check. Rewarded on the checked answer, plus a bit for a stable one."""
    messages = [{"role": "user", "content": f"What is {row['a']} + {row['b']}? Reply with only the number."}]
    first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=12, temperature=1.0)
    answer = first.choices[0].message.content
    messages += [{"role": "assistant", "content": answer},
                 {"role": "user", "content": "Check your answer. Reply with only the final number."}]
    second = await client.chat.completions.create(model="policy", messages=messages, max_tokens=12, temperature=1.0)
    final = last_number(second.choices[0].message.content)
    correct = float(final == row["a"] + row["b"])
    stable = float(final is not None and final == last_number(answer))
    return {"reward": correct + 0.1 * stable, "correct": correct, "stable": stable, "passed": correct == 1.0}


def make_rows(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"a": int(a), "b": int(b)} for a, b in torch.randint(1, 50, (n, 2), generator=g)]


async def train(model_name: str, steps: int, prompts_per_step: int, group: int, lr: float) -> None:
    model, tok = load_model(model_name, seed=0)
    ensure_pad_token(tok)
    sampler = HFSampler(model, tok, stop_token_ids(model, tok), seed=0)
    trainer = Trainer(model, pad_id=tok.pad_token_id, lr=lr)
    env = AgentEnv(check_your_work, tokenizer=tok, timeout_s=120)
    loss_fn = LOSSES["ppo_clip"]
    rows = make_rows(steps * prompts_per_step)
    for step in range(steps):
        batch_rows = rows[step * prompts_per_step : (step + 1) * prompts_per_step]
        # G concurrent agent runs per row; the in-process server batches their model calls.
        rolled = list(await asyncio.gather(*(env.rollout(r, sampler) for r in batch_rows for _ in range(group))))
        trajs = await scored_by(env, rolled)  # the agent's rewards (or the rubric's) joined: new trajectories
        # The run's own batch path: one Sequence per trajectory that did not fail, GRPO advantages per group.
        groups = [Group(i, trajs[i * group : (i + 1) * group]) for i in range(len(batch_rows))]
        batch, _ = build_batch(sequences_from_groups(groups), BatchOptions(advantage="grpo"), sampler.policy_version)
        m = {}
        if batch.sequences:
            cfg = LossParams()
            m.update(trainer.forward_backward(batch, loss_fn, cfg).metrics)
            m.update(trainer.optim_step())
        sampler.policy_version += 1  # in-process weight share: the sampler holds the trainer's module
        r = rollout_metrics(trajs)
        print(f"step {step + 1}/{steps}  reward {r['reward/mean']:.3f}  pass {r['pass_rate']:.2f}  "
              f"turns/episode {sum(len(t.turns) for t in trajs) / len(trajs):.1f}  "
              f"failed {int(r['rollouts/failed'])}  loss {m.get('train/loss', float('nan')):.4f}  "
              # ~0 when the recorded logprobs are the ones the trainer computes for the same tokens
              f"sampler-vs-trainer |dlogp| {m.get('train/sampler_logp_abs_diff', float('nan')):.1e}")
    await env.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-5)
    a = p.parse_args()
    asyncio.run(train(a.model, a.steps, a.prompts, a.group, a.lr))
