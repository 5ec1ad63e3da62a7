"""Multi-turn rollouts with and without the prefix cache (sampling/prefix_cache.py), on the default model.

Plays the same greedy multi-turn episodes twice, with `sampling.prefix_cache_tokens` off and on, and prints the
wall time, the tokens each run prefilled and whether the episodes came out token for token the same. The default
work is the `reversal` task (a grid map each turn, short replies, history growing every turn): 8 held-out maps,
8 turns of 8 tokens. `--task coding-agent` plays tool turns with much longer observations.

    python bench/prefix_cache.py                       # reversal, 8 episodes x 8 turns
    python bench/prefix_cache.py --episodes 16 --turns 10 --threads 2

Timings are wall-clock on whatever else the machine is doing; run it on a quiet machine for the README table.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch


def play(task_name: str, options: dict, model, tok, cache_tokens: int, episodes: int, max_tokens: int):
    from posttrain.envs.base import make_env
    from posttrain.tasks.load import load_task
    from posttrain.models import stop_token_ids
    from posttrain.sampling import HFSampler
    from posttrain.types import SampleParams

    task = load_task(task_name, options)
    params = SampleParams(max_tokens=max_tokens, temperature=0.0, stop=list(task.stop or []))
    env = make_env(task, tok, params)
    sampler = HFSampler(model, tok, stop_token_ids(model, tok), prefix_cache_tokens=cache_tokens)
    rows = task.eval_rows[:episodes]

    async def run():
        return await asyncio.gather(*(env.rollout(r, sampler, params) for r in rows))

    t0 = time.perf_counter()
    trajs = asyncio.run(run())
    secs = time.perf_counter() - t0
    turns = sum(len(t.turns) for t in trajs)
    prefilled = sum(len(turn.prompt_ids) for t in trajs for turn in t.turns)  # what a cache-less sampler prefills
    m = sampler.drain_metrics()
    if m:
        prefilled = int(m["sampling/prefill_tokens"])
    return secs, turns, prefilled, [t.sequence()[0] for t in trajs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="reversal", choices=["reversal", "coding-agent"])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="default")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from posttrain.models import load_model

    model, tok = load_model(args.model, seed=0)
    model.eval()
    options = {"max_turns": args.turns}
    if args.task == "reversal":
        options["max_tokens"] = args.max_tokens
    rows = []
    for label, cache in (("off", 0), ("on", 1 << 20)):
        secs, turns, prefilled, seqs = play(args.task, options, model, tok, cache, args.episodes, args.max_tokens)
        rows.append((label, secs, turns, prefilled, seqs))
        print(f"prefix cache {label:>3}: {secs:7.1f} s  {turns} turns  {prefilled} tokens prefilled", flush=True)
    (_, s_off, _, p_off, a), (_, s_on, _, p_on, b) = rows
    print(f"\n| task | episodes x turns | prefix cache off | on | speed-up | tokens prefilled off -> on | same episodes |")
    print(f"|---|---|---:|---:|---:|---|---|")
    print(f"| {args.task} | {args.episodes} x {args.turns} | {s_off:.1f} s | {s_on:.1f} s | {s_off / s_on:.2f}x | "
          f"{p_off} -> {p_on} | {'yes' if a == b else 'NO'} |")


if __name__ == "__main__":
    main()
