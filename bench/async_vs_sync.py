"""Async vs sync loop on a slow multi-turn environment: trained tokens per second and idle fractions.

The environment answers each of the policy's 3 turns after sleeping 200 ms (an env step: a tool, a sandbox, a
remote service), then asks for more; the reward is the share of the letter 'a' over all turns (count-a). The
model is `tiny-random` by default, so model compute is small and env latency dominates, which is the regime the
async loop is for. Same task, prompts, seed, G and learning rate in every run; only `loop.mode` and
`loop.max_staleness` change.

    python bench/async_vs_sync.py [--steps 30] [--staleness 1 2 3] [--model tiny-random] [--delay 0.2]

Prints per run: trained tokens/s (policy tokens in trained sequences / training wall time), speed-up over sync,
trainer and sampler idle fractions, mean reward of the first and last 5 steps, the share of sequences a sync
interrupted, the weight-sync seconds, and the training seconds until the 5-step mean reward first reaches the sync
loop's final one; with k = 1 it also runs async with `loop.interruptible=false` (syncs wait for whole
generations). Writes bench/results/async_vs_sync.{json,md}. With max_staleness = k, groups of at most k + 1
consecutive steps are in flight, so on a latency-bound env the speed-up over sync is bounded by k + 1
(loop/staleness.py).

    python bench/async_vs_sync.py --generation-bound [--gen-steps 20] [--gen-tokens 256] [--threads 1]

runs the other regime instead: no env latency and long generations (count-a, 256 new tokens, so a generation
outlasts a training step): sync, async k = 1 with whole-generation syncs, async k = 1 with interruptible syncs;
writes bench/results/async_generation_bound.md.

    python bench/async_vs_sync.py --vllm-in-flight [--gen-steps 20] [--gen-tokens 256] [--seeds 0 1 2]

vLLM in process (sampling.engine=vllm, the CPU build), the same generation-bound count-a, async k = 1: a push that
waits for the requests in flight (`sampling.vllm.weight_update=wait`) against one that lands between tokens
(`in_flight`), per seed: the sampler's idle fraction, trained tokens/s, the trainer's idle fraction, pushes that
landed in flight, and the share of trained sequences that span two versions. The model is tiny-random at hidden
size 128 (the CPU attention has no head size 16). Writes bench/results/vllm_in_flight.{json,md}.
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
from posttrain.tasks.count_a import make_task as count_a
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
            turns.append(Turn(ids, c.token_ids, c.logprobs, c.policy_version, c.finish_reason, c.token_versions))
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


def run(mode: str, k: int, args, interruptible: bool = True, seed: int = 0) -> dict:
    # Async runs go on for --async-extra times the steps, so the time to the sync loop's final reward is measured
    # even where async needs more steps to get there; every other column is over the first --steps steps.
    steps = args.steps if mode == "sync" else args.steps * args.async_extra
    over = [f"model.name={args.model}", f"task.name={__file__}:make_task", f"loop.steps={steps}",
            "loop.prompts_per_step=4", "algorithm.num_generations=8", f"trainer.lr={args.lr}", "loop.eval_prompts=8",
            "loop.eval_before=false", "logging.tensorboard=false", "logging.console=false", "loop.save_every=0",
            f"loop.mode={mode}", f"loop.max_staleness={k}", f"run.seed={seed}",
            f"loop.interruptible={str(interruptible).lower()}"]
    name = f"{mode}-k{k}" + ("" if interruptible else "-whole") + f"-s{seed}"
    over += [f"run.output_dir={args.out_dir}", f"run.name={name}"]
    import shutil
    shutil.rmtree(Path(args.out_dir) / name, ignore_errors=True)
    t0 = time.perf_counter()
    res = train(load_config(None, over))
    all_recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    recs = all_recs[: args.steps]
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
    return {"mode": mode, "max_staleness": k if mode == "async" else None, "interruptible": interruptible, "seed": seed,
            "steps": len(recs),
            "interrupted_frac": statistics.fmean(r.get("async/interrupted_frac", 0.0) for r in recs),
            "mixed_version_frac": statistics.fmean(r.get("async/mixed_version_frac", 0.0) for r in recs),
            "weight_sync_s": statistics.fmean(r.get("time/weight_sync", 0.0) for r in recs),
            "train_wall_s": wall, "trained_tokens_per_s": trained / wall, "policy_tokens_per_s": policy_tokens / wall,
            "trainer_idle_frac": statistics.fmean(waits), "sampler_idle_frac": statistics.fmean(idle_s),
            "reward_first5": statistics.fmean(rewards[:5]), "reward_last5": statistics.fmean(rewards[-5:]),
            "rewards": [r["reward/mean"] for r in all_recs], "step_walls": [r["time/step"] for r in all_recs],
            "eval_reward_after": res.after.get("eval/reward/mean"),
            "staleness_mean": statistics.fmean(r.get("async/staleness_mean", 0.0) for r in recs),
            "process_s": time.perf_counter() - t0}


def generation_bound(args) -> str:
    """Long generations, no env latency: count-a with up to --gen-tokens tokens per completion (the tiny random
    model almost never ends early), so a generation takes longer than a training step. Sync, then async k=1 with
    whole-generation syncs (a sync waits for the decode in flight), then async k=1 with interruptible syncs."""
    import shutil

    rows = []
    for mode, interruptible in (("sync", True), ("async", False), ("async", True)):
        name = f"genbound-{mode}" + ("" if mode == "sync" else "-interruptible" if interruptible else "-whole")
        over = [f"model.name={args.model}", "task.name=count-a", f"loop.steps={args.gen_steps}",
                "loop.prompts_per_step=4", "algorithm.num_generations=8", f"trainer.lr={args.lr}",
                f"sampling.max_tokens={args.gen_tokens}", f"loop.mode={mode}", "loop.max_staleness=1",
                "loop.eval_before=false", "loop.eval_prompts=4", "logging.tensorboard=false", "logging.console=false",
                "loop.save_every=0", "loop.keep_checkpoints=0", "run.seed=0",
                f"loop.interruptible={str(interruptible).lower()}", f"run.output_dir={args.out_dir}",
                f"run.name={name}", f"model.threads={args.threads}"]
        shutil.rmtree(Path(args.out_dir) / name, ignore_errors=True)
        res = train(load_config(None, over))
        recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"][1:]  # step 1: warm-up
        rows.append({"name": name, "mode": mode, "interruptible": interruptible,
                     "sync_s": statistics.median(r.get("time/weight_sync", 0.0) for r in recs),
                     "step_s": statistics.median(r["time/step"] for r in recs),
                     "tok_s": sum(r["tokens/trained"] for r in recs) / sum(r["time/step"] for r in recs),
                     "idle": statistics.fmean(r.get("async/trainer_idle_frac", 0.0) for r in recs),
                     "interrupted": statistics.fmean(r.get("async/interrupted_frac", 0.0) for r in recs),
                     "staleness": statistics.fmean(r.get("async/token_staleness_mean", 0.0) for r in recs)})
    base = rows[0]["tok_s"]
    lines = [f"generation-bound: {args.model}, count-a, {args.gen_tokens} new tokens, {args.gen_steps} steps x 4 prompts "
             f"x G=8, {args.threads} thread(s), max_staleness=1; medians / means over steps 2..", "",
             "| loop | syncs | trained tok/s | speed-up | weight sync s (median) | step s (median) | trainer idle | "
             "interrupted | token staleness |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        syncs = "-" if r["mode"] == "sync" else "interruptible" if r["interruptible"] else "whole-generation"
        lines.append(f"| {r['mode']} | {syncs} | {r['tok_s']:.0f} | {r['tok_s'] / base:.2f}x | {r['sync_s']:.3f} | "
                     f"{r['step_s']:.3f} | {r['idle']:.2f} | {r['interrupted']:.2f} | {r['staleness']:.2f} |")
    return "\n".join(lines)


def vllm_in_flight(args) -> str:
    """Wait vs in-flight weight updates on the in-process vLLM engine, async k = 1, --seeds (module docstring)."""
    import shutil
    import tempfile

    from posttrain.models.tiny import tiny_random_model

    folder = Path(tempfile.mkdtemp()) / "tiny128"
    model, tok = tiny_random_model(seed=0, hidden_size=128)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    rows = []
    for update in ("wait", "in_flight"):
        for seed in args.seeds:
            name = f"vllm-{update}-s{seed}"
            over = [f"model.name={folder}", "task.name=count-a", f"loop.steps={args.gen_steps}",
                    "loop.prompts_per_step=4", "algorithm.num_generations=8", "trainer.lr=3e-3",
                    f"sampling.max_tokens={args.gen_tokens}", "loop.mode=async", "loop.max_staleness=1",
                    "sampling.engine=vllm", "sampling.vllm.kv_cache_gb=0.25", f"sampling.vllm.weight_update={update}",
                    "loop.eval_before=false", "loop.eval_prompts=4", "logging.tensorboard=false",
                    "logging.console=false", "loop.save_every=0", "loop.keep_checkpoints=0", f"run.seed={seed}",
                    f"run.output_dir={args.out_dir}", f"run.name={name}", f"model.threads={args.threads}",
                    "diagnostics.remedies.enabled=false"]
            shutil.rmtree(Path(args.out_dir) / name, ignore_errors=True)
            res = train(load_config(None, over))
            recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"][1:]  # step 1: warm-up
            rows.append({"update": update, "seed": seed,
                         "sampler_idle": statistics.fmean(r.get("async/sampler_idle_frac", 0.0) for r in recs),
                         "trainer_idle": statistics.fmean(r.get("async/trainer_idle_frac", 0.0) for r in recs),
                         "tok_s": sum(r["tokens/trained"] for r in recs) / sum(r["time/step"] for r in recs),
                         "sync_s": statistics.median(r.get("time/weight_sync", 0.0) for r in recs),
                         "in_flight_pushes": sum(r.get("sampling/in_flight_pushes", 0.0) for r in recs),
                         "mixed": statistics.fmean(r.get("async/mixed_version_frac", 0.0) for r in recs),
                         "reward_last5": statistics.fmean(r["reward/mean"] for r in recs[-5:])})
            print(rows[-1], flush=True)
    Path(args.results).mkdir(parents=True, exist_ok=True)
    (Path(args.results) / "vllm_in_flight.json").write_text(json.dumps(rows, indent=1))

    def ms(update: str, key: str) -> str:
        xs = [r[key] for r in rows if r["update"] == update]
        return f"{statistics.fmean(xs):.3g} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.2g}"

    lines = [f"vLLM in process (CPU build), tiny-random h128, count-a, {args.gen_tokens} new tokens, "
             f"{args.gen_steps} steps x 4 prompts x G=8, async max_staleness=1, seeds {args.seeds}; "
             "mean ± sd over seeds of per-run means over steps 2..", "",
             "| weight_update | sampler idle | trainer idle | trained tok/s | weight sync s (median) | pushes in flight "
             "| sequences spanning 2 versions | reward, last 5 steps |", "|---|---|---|---|---|---|---|---|"]
    for u in ("wait", "in_flight"):
        lines.append(f"| {u} | {ms(u, 'sampler_idle')} | {ms(u, 'trainer_idle')} | {ms(u, 'tok_s')} | "
                     f"{ms(u, 'sync_s')} | {ms(u, 'in_flight_pushes')} | {ms(u, 'mixed')} | {ms(u, 'reward_last5')} |")
    md = "\n".join(lines)
    (Path(args.results) / "vllm_in_flight.md").write_text(md + "\n")
    return md


def time_to_reward(r: dict, target: float, window: int = 5) -> float | None:
    """Training seconds until the mean reward over `window` consecutive steps first reaches `target` (None: never)."""
    rewards, walls = r["rewards"], r["step_walls"]
    for i in range(window - 1, len(rewards)):
        if statistics.fmean(rewards[i - window + 1 : i + 1]) >= target:
            return sum(walls[: i + 1])
    return None


def main(argv=None) -> None:
    global DELAY_S
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--delay", type=float, default=DELAY_S, help="seconds the env sleeps per turn")
    p.add_argument("--out-dir", default="runs/bench-async")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--async-extra", type=int, default=2, help="async runs train this many times --steps")
    p.add_argument("--skip-whole", action="store_true", help="skip the k=1 run with loop.interruptible=false")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--generation-bound", action="store_true",
                   help="instead: the default model on json-extract, interruptible syncs vs whole-generation syncs")
    p.add_argument("--gen-steps", type=int, default=20)
    p.add_argument("--gen-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--vllm-in-flight", action="store_true",
                   help="instead: vLLM in process, async, weight_update=wait vs in_flight, per seed")
    args = p.parse_args(argv)
    DELAY_S = args.delay
    if args.vllm_in_flight:
        print(vllm_in_flight(args), flush=True)
        return
    if args.generation_bound:
        md = generation_bound(args)
        print(md, flush=True)
        Path(args.results).mkdir(parents=True, exist_ok=True)
        (Path(args.results) / "async_generation_bound.md").write_text("# bench/async_vs_sync.py --generation-bound\n\n"
                                                                     + md + "\n")
        return
    lines = [f"env: {TURNS} turns, {DELAY_S * 1000:.0f} ms sleep per turn; model {args.model}; {args.steps} steps x "
             f"4 prompts x G=8; seeds {args.seeds}", "",
             "| seed | loop | trained tok/s | speed-up | trainer idle | sampler idle | reward first 5 | reward last 5 | "
             "mean staleness | interrupted | sync s | s to sync's final reward |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    results = []
    for seed in args.seeds:
        runs = [run("sync", 0, args, seed=seed)] + [run("async", k, args, seed=seed) for k in args.staleness]
        if 1 in args.staleness and not args.skip_whole:  # the same k = 1 run with syncs waiting for whole generations
            runs.append(run("async", 1, args, interruptible=False, seed=seed))
        base = runs[0]["trained_tokens_per_s"]
        # Time to the sync loop's final reward (its last-5-step mean), for every run, the sync loop's own included
        target = runs[0]["reward_last5"]
        for r in runs:
            r["time_to_sync_final_s"] = time_to_reward(r, target)
            r["speedup"] = r["trained_tokens_per_s"] / base
        t_sync = runs[0]["time_to_sync_final_s"]
        for r in runs:
            r["time_to_sync_final_share"] = (r["time_to_sync_final_s"] / t_sync
                                             if r["time_to_sync_final_s"] is not None and t_sync else None)
            name = "sync" if r["mode"] == "sync" else f"async, max_staleness={r['max_staleness']}" + (
                "" if r["interruptible"] else ", whole-generation syncs")
            lines.append(f"| {seed} | {name} | {r['trained_tokens_per_s']:.0f} | {r['speedup']:.2f}x | "
                         f"{r['trainer_idle_frac']:.2f} | {r['sampler_idle_frac']:.2f} | {r['reward_first5']:.3f} | "
                         f"{r['reward_last5']:.3f} | {r['staleness_mean']:.2f} | {r['interrupted_frac']:.2f} | "
                         f"{r['weight_sync_s']:.3f} | {_reach(r['time_to_sync_final_s'], t_sync)} |")
        results += runs
    lines += ["", "s to sync's final reward: training seconds until the 5-step mean reward first reaches the same "
              "seed's sync loop's last-5-step mean; in brackets, as a share of that sync loop's own time. Async "
              f"runs train {args.async_extra}x the steps so they can get there; every other column is over the "
              f"first {args.steps} steps."]
    if len(args.seeds) > 1:
        lines += ["", "| loop | speed-up, mean (min-max) over seeds | time to sync's final reward, share (per seed) |",
                  "|---|---|---|"]
        keys = sorted({(r["mode"], r["max_staleness"], r["interruptible"]) for r in results if r["mode"] == "async"})
        for mode, k, inter in keys:
            rs = [r for r in results if (r["mode"], r["max_staleness"], r["interruptible"]) == (mode, k, inter)]
            sp = [r["speedup"] for r in rs]
            shares = ", ".join("-" if r["time_to_sync_final_share"] is None else f"{r['time_to_sync_final_share']:.2f}"
                               for r in rs)
            lines.append(f"| async, max_staleness={k}{'' if inter else ', whole-generation syncs'} | "
                         f"{statistics.fmean(sp):.2f}x ({min(sp):.2f}-{max(sp):.2f}) | {shares} |")
    md = "\n".join(lines)
    print(md, flush=True)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "async_vs_sync.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    (out / "async_vs_sync.md").write_text("# bench/async_vs_sync.py\n\n" + md + "\n")


def _reach(t: float | None, t_sync: float | None) -> str:
    if t is None:
        return "not reached"
    return f"{t:.1f} ({t / t_sync:.2f})" if t_sync else f"{t:.1f}"


if __name__ == "__main__":
    main()
