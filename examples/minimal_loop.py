"""A complete GRPO loop from posttrain's public pieces (all imported from `posttrain`), no Run and no config:
sampler, env, batch, trainer, weight sync.

    python examples/minimal_loop.py            # tiny-random on count-a, about half a minute on 2 CPU cores

Each step: G rollouts per prompt -> rewards (the task's rubric) -> build_batch (group advantages) ->
forward_backward + optim_step -> weight sync (`SharedWeights`: the sampler holds the trainer's module, so a push is a
version bump; another sampler takes `CopyWeights` or a transport of its own).
The reward is the share of 'a' in the reply; a random model starts near 0.01.
"""

from __future__ import annotations

import asyncio
import random
import sys

import torch

from posttrain import (LOSSES, BatchOptions, Group, HFSampler, LossParams, SampleParams, SharedWeights,
                       SingleTurnEnv, Trainer, build_batch, ensure_pad_token, load_model, load_task, score_groups,
                       sequences_from_groups, stop_token_ids)

STEPS, PROMPTS, G, LR, SEED = 25, 4, 8, 3e-3, 0


async def main(steps: int = STEPS) -> list[float]:
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    model, tok = load_model("tiny-random", seed=SEED)
    ensure_pad_token(tok)
    task = load_task("count-a")
    params = SampleParams(max_tokens=16, temperature=1.0)
    env = SingleTurnEnv(task, tok, params)
    sampler = HFSampler(model, tok, stop_token_ids(model, tok), seed=SEED)  # generates with the trainer's module
    sync = SharedWeights(sampler)  # a WeightSync: here a version bump, since the sampler holds the trainer's module
    trainer = Trainer(model, pad_id=tok.pad_token_id, lr=LR, temperature=params.temperature)
    loss_fn, loss_params = LOSSES["ppo_clip"], LossParams(epsilon=0.2)
    rng, rewards = random.Random(SEED), []
    for step in range(steps):
        rows = rng.sample(task.train_rows, PROMPTS)
        rolled = await asyncio.gather(*(env.rollout(r, sampler, params) for r in rows for _ in range(G)))
        # scored by the rubric: new trajectories with their rewards (a Trajectory is frozen)
        scored = await score_groups(env, [list(rolled[i * G:(i + 1) * G]) for i in range(PROMPTS)])
        groups = [Group(i, g) for i, g in enumerate(scored)]
        trajs = [t for g in scored for t in g]
        batch, m = build_batch(sequences_from_groups(groups), BatchOptions(advantage="grpo"))
        m.update(trainer.forward_backward(batch, loss_fn, loss_params).metrics)  # on-policy: old = current, detached
        m.update(trainer.optim_step())
        m.update(sync.push(step + 1))  # the sampler now serves the updated weights as version step + 1
        rewards.append(sum(t.reward for t in trajs) / len(trajs))
        print(f"step {step + 1:>2}/{steps} reward={rewards[-1]:.3f} loss={m.get('train/loss', 0.0):+.4f} "
              f"trained_seqs={len(batch.sequences)}", flush=True)
    return rewards


if __name__ == "__main__":
    r = asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else STEPS))
    first, last = sum(r[:5]) / 5, sum(r[-5:]) / 5
    print(f"mean reward, first 5 steps {first:.3f} -> last 5 steps {last:.3f}")
