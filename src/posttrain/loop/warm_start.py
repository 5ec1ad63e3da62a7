"""Supervised warm start: a few steps of next-token training on a task's demonstrations, before RL.

RL only reinforces what the policy already samples. A 135M model that never writes a working `search` call
cannot learn *when* to search, however long it trains (this is what happened on `search-qa`). The usual fix is
a short supervised "cold start" on demonstrations, then RL.

The demonstrations are played through the run's own env by a scripted policy (`Task.demonstrate(row)` gives the
replies), so the warm start trains on exactly the token layout RL will see: the same chat template, the same
tool messages, environment tokens masked out, stop strings kept in the ids and no end token after them. Each
demonstration is scored by the task's rubric first; one that fails is a bug in the demonstrator, so it is
counted, reported and left out.

The loss is the mean negative log-likelihood of the demonstrated tokens, computed by the RL trainer itself: the
REINFORCE loss with advantage 1 at temperature 1 is exactly that. The warm start has its own AdamW (dropped
afterwards), so RL starts with fresh optimizer state, as it would from a supervised checkpoint.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from posttrain.algos.losses import LossParams, reinforce_loss
from posttrain.config.schema import Config
from posttrain.envs.base import TaskEnv
from posttrain.envs.isolate import safe_rollout
from posttrain.envs.scoring import scored
from posttrain.envs.task import Task
from posttrain.errors import PosttrainError
from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
from posttrain.rewards.telemetry import drain_task_metrics
from posttrain.sampling.context import ContextBudget, run_budget
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.training.sft import batches, reply_end_token
from posttrain.training.trainer import Trainer
from posttrain.types import Group, SampleParams, Trajectory

DEMONSTRATIONS = BatchOptions(advantage="reward", scale_std=False)  # every demonstrated token trained, weight 1


class WarmStartError(PosttrainError, ValueError):
    """The warm start cannot run: no demonstrations, or none of them passes the task's own rubric."""


@dataclass
class WarmStartResult:
    steps: int
    demos: int  # demonstrations trained on (passing)
    demos_failed: int  # demonstrations the rubric rejected (left out)
    loss_first: float  # mean NLL per demonstrated token, first step
    loss_last: float  # ... mean of the last 3 steps
    seconds: float


async def demonstration_trajectories(
    env: TaskEnv,
    task: Task,
    tok: Any,
    rows: list[dict[str, Any]],
    params: SampleParams,
    context: ContextBudget | None = None,
) -> tuple[list[Trajectory], list[Trajectory]]:
    """Play task.demonstrate(row) through env for each row and score it. Returns (passing, failing). Played within
    the policy's `context`: a demonstration that outgrows it is left out (the trainer would read past the model's
    positions)."""
    if task.demonstrate is None:
        raise WarmStartError(
            f"task {task.name!r} has no demonstrations (Task.demonstrate); warm_start.steps needs "
            "one -- or set warm_start.steps=0"
        )
    end = reply_end_token(tok)
    demonstrate = task.demonstrate

    async def one(row: dict[str, Any]) -> tuple[Trajectory, str | None]:
        replies = list(demonstrate(row))
        if not replies or not all(isinstance(r, str) for r in replies):
            raise WarmStartError(
                f"task {task.name!r}: demonstrate(row) must return a non-empty list of strings, "
                f"got {replies!r:.200} for row {str(row)[:200]}"
            )
        sampler = ScriptedSampler(tok, replies, end_token_id=end, stop_ends_reply=True, context=context)
        traj = await safe_rollout(env, row, sampler, params)
        # More turns than the demonstrator wrote: the scripted replies cycled, so the episode is not the demo.
        short = (
            f"the env asked for {sampler.calls} replies, the demonstration has {len(replies)}"
            if sampler.calls > len(replies)
            else None
        )
        if traj.stop_reason == "context" or traj.failed:
            short = traj.error or "the demonstration outgrows the model's context"
        return traj, short

    played = list(await asyncio.gather(*(one(r) for r in rows)))
    trajs = [t for t, _ in played if not t.failed]
    scores = dict(zip(map(id, trajs), await env.score(trajs), strict=True))
    # Scoring the demonstrations fills the rewards' own counters (a decision ledger, judge calls); they describe
    # the demonstrator, not the policy, and must not reach the next eval's or step's metrics.
    drain_task_metrics(task)
    ok, bad = [], []
    for t, short in played:
        t = scored(t, scores[id(t)]) if id(t) in scores else t
        if short:
            t = replace(t, passed=False, error=short)
        (ok if t.passed and not t.failed else bad).append(t)
    return ok, bad


def eta_text(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


async def run_warm_start(
    cfg: Config,
    model: Any,
    tok: Any,
    env: TaskEnv,
    task: Task,
    params: SampleParams,
    pad_id: int,
    say: Callable[[str], None],
    log: Callable[[dict[str, Any]], None],
) -> WarmStartResult:
    ws = cfg.warm_start
    t0 = time.perf_counter()
    rows = task.train_rows[: ws.demos] if ws.demos else list(task.train_rows)
    # Play demonstrations deterministically (temperature has no effect on a scripted policy; stop strings do).
    ok, bad = await demonstration_trajectories(env, task, tok, rows, params, run_budget(cfg, model))
    if bad:
        t = bad[0]
        say(
            f"warning: {len(bad)} of {len(rows)} demonstrations fail the task's rubric and are left out "
            f"(first: reward={t.reward:.2f} {t.error or ''} reply={t.completion_text[:120]!r})"
        )
    if not ok:
        raise WarmStartError(
            f"none of the {len(rows)} demonstrations of task {task.name!r} passes its rubric; check Task.demonstrate"
        )
    say(f"warm start: {len(ok)} demonstrations, {ws.steps} steps x {min(ws.batch_size, len(ok))} at lr {ws.lr:g}")
    # The run's memory settings hold here too: multi-turn demonstrations are as long as the episodes RL trains on
    # (about 1,700 tokens each on coding-agent), so a warm start without them peaked at 7 GB where RL fits in 3.
    t = cfg.trainer
    trainer = Trainer(
        model,
        pad_id=pad_id,
        lr=ws.lr,
        betas=t.betas,
        max_grad_norm=t.max_grad_norm,
        micro_batch_tokens=t.micro_batch_tokens,
        prefix_sharing=t.prefix_sharing,
        temperature=1.0,
        logits_chunk_tokens=t.logits_chunk_tokens,
        gradient_checkpointing=t.gradient_checkpointing,
        precision=t.precision,
    )
    loss_params = LossParams(aggregation="token-mean")
    losses: list[float] = []
    for k, idx in enumerate(batches(len(ok), ws.batch_size, ws.steps, cfg.run.seed)):
        # Each demonstration is its own group with reward 1 and the "reward" estimator (A = r): the REINFORCE loss
        # is then the demonstrations' negative log-likelihood. The RL step's batch path, so nothing differs.
        seqs = [replace(s, reward=1.0) for s in sequences_from_groups([Group(i, [ok[i]]) for i in idx])]
        batch, _ = build_batch(seqs, DEMONSTRATIONS)
        ts = time.perf_counter()
        m = trainer.forward_backward(batch, reinforce_loss, loss_params).metrics
        m.update(trainer.optim_step())
        losses.append(m["train/loss"])  # token-mean of -logp over the demonstrated tokens = NLL per token
        log(
            {
                "kind": "warm_start",
                "step": 0,
                "warm_start/step": k + 1,
                "warm_start/nll": m["train/loss"],
                "warm_start/grad_norm": m["train/grad_norm"],
                "warm_start/tokens": m["train/loss_tokens"],
            }
        )
        took = time.perf_counter() - ts
        if k == 0 or (k + 1) % max(1, ws.steps // 10) == 0 or k + 1 == ws.steps:
            # The first step's time says what the whole warm start costs: long multi-turn demonstrations can make
            # it minutes per step on a CPU, which a user should know before waiting for it.
            eta = f"; about {eta_text(took * (ws.steps - 1))} more at this pace" if k == 0 and ws.steps > 1 else ""
            say(
                f"warm start {k + 1}/{ws.steps}: nll/token={m['train/loss']:.3f} "
                f"grad_norm={m['train/grad_norm']:.2f} [{took:.1f}s{eta}]"
            )
    del trainer  # its optimizer state; RL starts fresh
    res = WarmStartResult(
        ws.steps,
        len(ok),
        len(bad),
        losses[0] if losses else float("nan"),
        statistics.fmean(losses[-3:]) if losses else float("nan"),
        time.perf_counter() - t0,
    )
    say(f"warm start done in {res.seconds:.0f}s: nll/token {res.loss_first:.3f} -> {res.loss_last:.3f}")
    return res
