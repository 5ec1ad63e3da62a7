"""Async vs sync loop on a slow multi-turn environment: trained tokens per second and idle fractions.

The environment answers each of the policy's 3 turns after sleeping 200 ms (an env step: a tool, a sandbox, a
remote service), then asks for more; the reward is the share of the letter 'a' over all turns (count-a). The
model is `tiny-random` by default, so model compute is small and env latency dominates, which is the regime the
async loop is for. Same task, prompts, seed, G and learning rate in every run; only `loop.mode` and
`loop.max_staleness` change.

    python bench/async_vs_sync.py [--steps 30] [--staleness 1 2 3] [--model tiny-random] [--delay 0.2]

Prints per run: trained tokens/s (policy tokens in trained sequences / training wall time), speed-up over sync,
trainer and sampler idle fractions, mean reward of the first and last 5 steps; writes
bench/results/async_vs_sync.{json,md}. With max_staleness = k, groups of at most k + 1 consecutive steps are in
flight, so on a latency-bound env the speed-up over sync is bounded by k + 1 (loop/staleness.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from posttrain.config import load_config
from posttrain.envs.task import Task
from posttrain.envs.tasks.count_a import make_task as count_a
from posttrain.envs.tool_env import ToolEnv
from posttrain.loop import train
from posttrain.models.template_check import render_ids
from posttrain.obs import read_metrics
from posttrain.types import SampleParams, Trajectory, Turn

RESULTS = Path(__file__).resolve().parent / "results"
DELAY_S = 0.2
TURNS = 3


class SlowMultiTurnEnv(ToolEnv):
    """TURNS model calls per episode; every env step sleeps DELAY_S. Built on ToolEnv's token bridging."""

    def __init__(self, task: Task, tok, params: SampleParams):
        super().__init__(task, tok, params, tools=[], max_turns=TURNS, system_prompt="")

    async def rollout(self, row, sampler, params=None) -> Trajectory:
        params = params or self.params
        msgs = [dict(m) for m in row["prompt"]]
        ids = render_ids(self.tok, msgs, add_generation_prompt=True)
        turns, texts = [], []
        for k in range(TURNS):
            (c,), = await sampler.sample([ids], params, n=1)
            turns.append(Turn(ids, c.token_ids, c.logprobs, c.policy_version, c.finish_reason))
            texts.append(c.text)
            msgs.append({"role": "assistant", "content": c.text})
            await asyncio.sleep(DELAY_S)  # the environment step
            if k == TURNS - 1:
                break
            msgs.append({"role": "user", "content": "more"})
            ids = ids + list(c.token_ids) + self._env_tokens(msgs, 1, c.token_ids)
        return Trajectory(turns=turns, prompt_text=str(row["prompt"]), completion_text=" ".join(texts), row=row)


def make_task(n_train: int = 64, n_eval: int = 8, seed: int = 0, max_tokens: int = 8) -> Task:
    task = count_a(n_train=n_train, n_eval=n_eval, seed=seed, max_tokens=max_tokens)
    task.name = "slow-multi-turn"
    task.env_factory = SlowMultiTurnEnv
    return task


def run(mode: str, k: int, args) -> dict:
    over = [f"model.name={args.model}", f"task.name={__file__}:make_task", f"loop.steps={args.steps}",
            "loop.prompts_per_step=4", "algorithm.num_generations=8", f"trainer.lr={args.lr}", "loop.eval_prompts=8",
            "loop.eval_before=false", "logging.tensorboard=false", "logging.console=false", "loop.save_every=0",
            f"run.output_dir={args.out_dir}", f"run.name={mode}-k{k}", f"loop.mode={mode}",
            f"loop.max_staleness={k}", "run.seed=0"]
    import shutil
    shutil.rmtree(Path(args.out_dir) / f"{mode}-k{k}", ignore_errors=True)
    t0 = time.perf_counter()
    res = train(load_config(None, over))
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    wall = sum(r["time/step"] for r in recs)
    trained = sum(r["tokens/trained"] for r in recs)
    policy_tokens = sum(r["tokens/completion"] for r in recs)
    if mode == "sync":
        waits = [(r.get("time/sample", 0) + r.get("time/reward", 0)) / r["time/step"] for r in recs]
        idle_s = [(r.get("time/train", 0) + r.get("time/sync", 0)) / r["time/step"] for r in recs]
    else:
        waits = [r["async/trainer_idle_frac"] for r in recs]
        idle_s = [r["async/sampler_idle_frac"] for r in recs]
    rewards = [r["reward/mean"] for r in recs]
    return {"mode": mode, "max_staleness": k if mode == "async" else None, "steps": len(recs),
            "train_wall_s": wall, "trained_tokens_per_s": trained / wall, "policy_tokens_per_s": policy_tokens / wall,
            "trainer_idle_frac": statistics.fmean(waits), "sampler_idle_frac": statistics.fmean(idle_s),
            "reward_first5": statistics.fmean(rewards[:5]), "reward_last5": statistics.fmean(rewards[-5:]),
            "rewards": rewards, "eval_reward_after": res.after.get("eval/reward/mean"),
            "staleness_mean": statistics.fmean(r.get("async/staleness_mean", 0.0) for r in recs),
            "process_s": time.perf_counter() - t0}


def main(argv=None) -> None:
    global DELAY_S
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--delay", type=float, default=DELAY_S, help="seconds the env sleeps per turn")
    p.add_argument("--out-dir", default="runs/bench-async")
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    DELAY_S = args.delay
    results = [run("sync", 0, args)] + [run("async", k, args) for k in args.staleness]
    base = results[0]["trained_tokens_per_s"]
    lines = [f"env: {TURNS} turns, {DELAY_S * 1000:.0f} ms sleep per turn; model {args.model}; {args.steps} steps x "
             "4 prompts x G=8", "",
             "| loop | trained tok/s | speed-up | trainer idle | sampler idle | reward first 5 | reward last 5 | "
             "mean staleness |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        name = "sync" if r["mode"] == "sync" else f"async, max_staleness={r['max_staleness']}"
        lines.append(f"| {name} | {r['trained_tokens_per_s']:.0f} | {r['trained_tokens_per_s'] / base:.2f}x | "
                     f"{r['trainer_idle_frac']:.2f} | {r['sampler_idle_frac']:.2f} | {r['reward_first5']:.3f} | "
                     f"{r['reward_last5']:.3f} | {r['staleness_mean']:.2f} |")
    md = "\n".join(lines)
    print(md, flush=True)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "async_vs_sync.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    (out / "async_vs_sync.md").write_text("# bench/async_vs_sync.py\n\n" + md + "\n")


if __name__ == "__main__":
    main()
