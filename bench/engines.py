"""Rollout engines side by side: posttrain's own decode loop, vLLM in this process, vLLM servers, and TRL's
GRPOTrainer with its colocated vLLM, on the default model (SmolLM2-135M-Instruct, fp32) and json-extract.

    python bench/engines.py [--quick] [--skip-trl] [--skip-grpo] [--skip-server] [--lora-serving] [--threads 2]
                            [--reps 2] [--pushes 5] [--steps 3] [--grpo-max-tokens 64] [--trl-timeout 600]

Four parts, each in its own child process (this script with `--only PART`), so one part's engines, threads and
memory never touch another's:

1. **Sampler tokens/s.** The same json-extract prompts rendered with the chat template, GRPO-shaped: batch B is
   B/4 distinct prompts x 4 completions, exactly 64 new tokens each (EOS ignored: the own sampler gets no stop
   ids, vLLM gets `ignore_eos=True`), temperature 1, the sampled tokens' log-probs returned (what RL needs). At
   B = 16 and 64, for (a) the own HFSampler, (b) vLLM in process (`llm.generate`, the call VLLMSampler makes),
   (c) one vLLM server (`/inference/v1/generate`, the request VLLMServerPool sends, with `ignore_eos`), once as the
   pool starts it and once bound to all of this process's cores (VLLM_CPU_OMP_THREADS_BIND): vLLM's own binding
   keeps a core for the API process, which on 2 cores halves the worker. `--lora-serving`: also vLLM in process
   serving the LoRA adapter. Repeats are interleaved (own, vLLM, own, vLLM) so a change in the machine's load hits
   both alike. Also each engine's start. The server rows run when posttrain.cluster.vllm_servers imports.
2. **Weight sync per step.** EngineWeights.push (in process): full weights; a LoRA r=16 (all linear layers)
   model pushed merged (W + BA, full weights) and as an adapter (peft folder + a new LoRA id). vLLM loads an
   adapter lazily, at the next generate, so the adapter row also reports push + a 1-token generate minus a
   1-token generate without a push. Servers: ServerPoolWeights.push (safetensors file + each server's reload).
   Beside them, the own loop's in-process copy and shared-memory numbers from bench/results/weight_sync.json.
3. **GRPO step time.** `posttrain.loop.train` on json-extract, K=3 steps x 4 prompts x G=4, up to 64 new tokens
   (--steps, --grpo-max-tokens; the defaults keep the whole run near 15 minutes on 2 cores), vs_trl.py's recipe
   (no stop strings, temperature 1, beta 0, fp32), sampling.engine own / vllm in process / vllm servers (cluster.backend=server, 1 server): median s/step and the time/sample, time/train and
   time/weight_sync split from metrics.jsonl.
4. **TRL**, the same run as bench/vs_trl.py's (same prompts, same recipe), with `use_vllm=True,
   vllm_mode="colocate"` (tried for real under a timeout; the error is recorded if it fails) and without vLLM;
   the ratio posttrain/TRL where both ran.

Threads: every child runs with OMP_NUM_THREADS=--threads and torch.set_num_threads(--threads) (vLLM keeps torch's
thread count when OMP_NUM_THREADS is set; otherwise it drops to 1 for serving). The servers get the same
OMP_NUM_THREADS. `--quick`: 2 GRPO steps, 32 new tokens, batch 16 only, 2 pushes (a smoke run; it writes
$TMPDIR/engines_quick.* unless --results is given). Prints the tables and writes bench/results/engines.{json,md}
with the command, the date, the CPU line and the load average around every part: on a shared machine the numbers
move with the load.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GROUP = 4  # completions per prompt in the sampler part (GRPO-shaped batches)
PARTS = ("sampler", "lora", "server", "grpo-own", "grpo-vllm", "grpo-server", "trl", "trl-vllm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller numbers: a smoke run")
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--skip-grpo", action="store_true")
    p.add_argument("--skip-server", action="store_true", help="no vLLM server columns")
    p.add_argument("--lora-serving", action="store_true", help="also tok/s of vLLM serving the LoRA adapter")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=2, help="repeats of each sampler measurement (>= 2)")
    p.add_argument("--pushes", type=int, default=5, help="timed weight pushes per row")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default 3, --quick 2)")
    p.add_argument("--grpo-max-tokens", type=int, default=None, help="default 64, --quick 32")
    p.add_argument("--new-tokens", type=int, default=64, help="sampler part: new tokens per completion")
    p.add_argument("--kv-cache-gb", type=float, default=1.0)
    p.add_argument("--trl-timeout", type=int, default=600, help="seconds each TRL child may run")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--only", choices=PARTS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.steps = a.steps or (2 if a.quick else 3)
    a.grpo_max_tokens = a.grpo_max_tokens or (32 if a.quick else 64)
    a.batches = (16,) if a.quick else (16, 64)
    a.pushes = 2 if a.quick else a.pushes
    a.reps = max(2, a.reps)
    return a


def stats(xs: list[float]) -> dict:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "all": xs}


def load1() -> float:
    return round(os.getloadavg()[0], 2)


# ---- part 1+2 in process: own sampler, vLLM engine, EngineWeights ----------------------------------------
def json_extract_prompts(tok, n: int) -> list[list[int]]:
    from posttrain.tasks.load import load_task
    from posttrain.models.chat import render_prompt

    rows = load_task("json-extract", seed=0).train_rows
    return [render_prompt(tok, rows[i % len(rows)]["prompt"]) for i in range(n)]


def vllm_params(n: int, max_tokens: int, ignore_eos: bool = True):
    import vllm

    # VLLMSampler's sampling_params (temperature 1, the sampled token's log-prob), EOS ignored: fixed work
    return vllm.SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0, top_p=1.0, top_k=-1, logprobs=0,
                               ignore_eos=ignore_eos, skip_special_tokens=True)


def vllm_generate(engine, prompts: list[list[int]], n: int, max_tokens: int, lora=None) -> int:
    from vllm.inputs import TokensPrompt

    with engine._engine_threads():
        outs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], vllm_params(n, max_tokens),
                                   use_tqdm=False, lora_request=lora)
    return sum(len(o.token_ids) for r in outs for o in r.outputs)


def own_generate(sampler, prompts: list[list[int]], n: int, max_tokens: int) -> int:
    from posttrain.types import SampleParams

    out = sampler.sample_sync(prompts, SampleParams(max_tokens=max_tokens, temperature=1.0), n=n)
    return sum(len(c.token_ids) for row in out for c in row)


def push_line(sync: dict) -> str:
    return ", ".join(f"{k}: {v['median']:.3f}" for k, v in sync.items())


def timed(fn) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = fn()
    return time.perf_counter() - t0, n


def part_sampler(args: argparse.Namespace) -> dict:
    import torch

    from posttrain.models.default import default_model_dir
    from posttrain.models.load import load_model, stop_token_ids
    from posttrain.models.lora import apply_lora
    from posttrain.sampling.hf_sampler import HFSampler
    from posttrain.sampling.vllm_engine import EngineSpec, VLLMSampler
    from posttrain.sampling.vllm_weights import EngineWeights

    out: dict = {"load_before": load1()}
    model, tok = load_model("default", log=lambda s: None)
    prompts = json_extract_prompts(tok, max(args.batches) // GROUP)
    out["prompt_tokens"] = [len(p) for p in prompts]
    own = HFSampler(model, tok, stop_token_ids=[], seed=0)  # no stop ids: every completion runs to max_tokens
    spec = EngineSpec(model_dir=str(default_model_dir()), dtype="float32", max_model_len=2048,
                      kv_cache_gb=args.kv_cache_gb, compile=False, seed=0)
    t0 = time.perf_counter()
    engine = VLLMSampler(spec, tok, stop_token_ids(model, tok), log=lambda s: None)
    out["vllm_startup_s"] = time.perf_counter() - t0
    out["threads_after_engine"] = torch.get_num_threads()
    # warm-up, untimed: the first call of each pays one-off costs
    own_generate(own, prompts[:1], 2, 4)
    vllm_generate(engine, prompts[:1], 2, 4)
    rows = []
    for b in args.batches:
        ps = prompts[: b // GROUP]
        times: dict[str, list[float]] = {"own": [], "vllm": []}
        tokens = {}
        loads = []
        for _ in range(args.reps):  # interleaved: a change in the machine's load hits both
            for name, fn in (("own", lambda: own_generate(own, ps, GROUP, args.new_tokens)),
                             ("vllm", lambda: vllm_generate(engine, ps, GROUP, args.new_tokens))):
                dt, n = timed(fn)
                times[name].append(dt)
                tokens[name] = n
                loads.append(load1())
        for name in times:
            tps = [tokens[name] / t for t in times[name]]
            rows.append({"engine": name, "batch": b, "tokens": tokens[name], "tok_s": stats(tps),
                         "load": loads})
            print(f"  > {name:<5} batch {b:>3}: {tokens[name]} tokens, tok/s {[round(x, 1) for x in tps]} "
                  f"(load {loads})", flush=True)
    out["sampler"] = rows

    # ---- weight sync, in process ----
    sync = {}
    full = EngineWeights(model, engine)
    sync["vllm full push"] = stats([full.push(v)["time/weight_sync"] for v in range(1, args.pushes + 1)])
    lora = apply_lora(copy.deepcopy(model), r=16, alpha=32.0, dropout=0.0, target_modules=LORA_TARGETS)
    with torch.no_grad():  # B starts at zero: make the adapter's delta real
        for n_, p in lora.named_parameters():
            if "lora_B" in n_:
                p.normal_(0, 1e-3)
    merged = EngineWeights(lora, engine, lora="merged")
    sync["vllm LoRA r=16 merged push"] = stats([merged.push(v)["time/weight_sync"]
                                                for v in range(100, 100 + args.pushes)])
    print(f"  > pushes (median s): {push_line(sync)}", flush=True)
    engine.close()
    out["sync"] = sync
    out["load_after"] = load1()
    return out


def part_lora(args: argparse.Namespace) -> dict:
    """The LoRA adapter push, on an engine that serves adapters: its own process (one vLLM engine per process)."""
    import torch

    from posttrain.models.default import default_model_dir
    from posttrain.models.load import load_model, stop_token_ids
    from posttrain.models.lora import apply_lora
    from posttrain.sampling.vllm_engine import EngineSpec, VLLMSampler
    from posttrain.sampling.vllm_weights import EngineWeights

    out: dict = {"load_before": load1(), "sampler": []}
    model, tok = load_model("default", log=lambda s: None)
    prompts = json_extract_prompts(tok, 16 // GROUP)
    lora = apply_lora(model, r=16, alpha=32.0, dropout=0.0, target_modules=LORA_TARGETS)
    with torch.no_grad():  # B starts at zero: make the adapter's delta real
        for n_, p in lora.named_parameters():
            if "lora_B" in n_:
                p.normal_(0, 1e-3)
    spec = EngineSpec(model_dir=str(default_model_dir()), dtype="float32", max_model_len=2048,
                      kv_cache_gb=args.kv_cache_gb, compile=False, seed=0, max_lora_rank=16)
    sync = {}
    with tempfile.TemporaryDirectory(prefix="engines_lora_") as wd:
        t0 = time.perf_counter()
        leng = VLLMSampler(spec, tok, stop_token_ids(model, tok), log=lambda s: None)
        out["vllm_lora_startup_s"] = time.perf_counter() - t0
        adapter = EngineWeights(lora, leng, lora="adapter", work_dir=wd)
        one = lambda: vllm_generate(leng, prompts[:1], 1, 1, lora=leng._lora)  # noqa: E731
        adapter.push(0)
        one()  # warm-up: the first adapter load
        push_s, file_s, first_s, base_s = [], [], [], []
        for v in range(1, args.pushes + 1):
            base_s.append(timed(one)[0])  # a 1-token call, adapter already loaded
            t0 = time.perf_counter()
            m = adapter.push(v)
            push_s.append(m["time/weight_sync"])
            file_s.append(m["time/weight_file"])
            one()
            first_s.append(time.perf_counter() - t0)
        sync["vllm LoRA r=16 adapter push"] = stats(push_s)
        sync["vllm LoRA r=16 adapter: peft save_pretrained"] = stats(file_s)
        sync["vllm LoRA r=16 adapter push + first call - plain call"] = stats(
            [f - b for f, b in zip(first_s, base_s)])
        if args.lora_serving:
            ps = prompts[: 16 // GROUP]
            tps = [n / t for t, n in (timed(lambda: vllm_generate(leng, ps, GROUP, args.new_tokens, lora=leng._lora))
                                      for _ in range(args.reps))]
            out["sampler"].append({"engine": "vllm+adapter", "batch": 16, "tokens": 16 * args.new_tokens,
                                   "tok_s": stats(tps), "load": [load1()]})
            print(f"  > vllm serving the LoRA adapter, batch 16: tok/s {[round(x, 1) for x in tps]}", flush=True)
        leng.close()
    out["sync"] = sync
    print(f"  > LoRA adapter pushes (median s): {push_line(sync)}", flush=True)
    out["load_after"] = load1()
    return out


# ---- part 1+2 with a vLLM server ----------------------------------------------------------------------------
async def server_generate(url: str, prompts: list[list[int]], n: int, max_tokens: int) -> int:
    """VLLMServerPool's request (one per distinct prompt, n completions, log-probs), with ignore_eos."""
    import httpx

    sp = {"n": n, "max_tokens": max_tokens, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "stop_token_ids": [],
          "logprobs": 0, "skip_special_tokens": True, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=600) as client:
        rs = await asyncio.gather(*(client.post(f"{url}/inference/v1/generate",
                                                json={"token_ids": p, "sampling_params": sp, "output_mode": "text"})
                                    for p in prompts))
    total = 0
    for r in rs:
        r.raise_for_status()
        total += sum(len(c.get("token_ids") or []) for c in r.json()["choices"])
    return total


def server_available() -> str | None:
    """None if posttrain.cluster.vllm_servers imports, else why not."""
    try:
        import posttrain.cluster.vllm_servers  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


def part_server(args: argparse.Namespace) -> dict:
    from posttrain.cluster.server_loads import ServerPoolWeights
    from posttrain.cluster.vllm_servers import VLLMServerPool
    from posttrain.models.default import default_model_dir
    from posttrain.models.load import load_model, stop_token_ids
    from posttrain.sampling.vllm_engine import EngineSpec

    out: dict = {"load_before": load1()}
    model, tok = load_model("default", log=lambda s: None)
    prompts = json_extract_prompts(tok, max(args.batches) // GROUP)
    spec = EngineSpec(model_dir=str(default_model_dir()), dtype="float32", max_model_len=2048,
                      kv_cache_gb=args.kv_cache_gb, compile=False, seed=0)
    out["sampler"] = []
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    # The pool as configured (one server: vLLM's own binding, which on this 2-core machine pins the worker to one
    # core), then the same server bound to every core of this process. Pushes on the first only.
    for engine, bind in (("server", None), ("server, all cores", ",".join(map(str, cores)))):
        env = {"OMP_NUM_THREADS": str(args.threads), **({"VLLM_CPU_OMP_THREADS_BIND": bind} if bind else {})}
        with tempfile.TemporaryDirectory(prefix="engines_server_") as wd:
            t0 = time.perf_counter()
            pool = VLLMServerPool.start(spec, tok, stop_token_ids(model, tok), 1, Path(wd), log=lambda s: None,
                                        env=env)
            out.setdefault("server_startup_s", time.perf_counter() - t0)
            try:
                log = next(Path(wd, "server_logs").glob("*.log")).read_text(errors="replace")
                out.setdefault("server_core_ids", {})[engine] = next(
                    (ln.split("core ids=")[-1].strip() for ln in log.splitlines() if "core ids=" in ln), "?")
                url = pool.slots[0].server.url
                asyncio.run(server_generate(url, prompts[:1], 2, 4))  # warm-up
                for b in args.batches:
                    ps = prompts[: b // GROUP]
                    tps, loads = [], []
                    for _ in range(args.reps):
                        dt, n = timed(lambda: asyncio.run(server_generate(url, ps, GROUP, args.new_tokens)))
                        tps.append(n / dt)
                        loads.append(load1())
                    out["sampler"].append({"engine": engine, "batch": b, "tokens": n, "tok_s": stats(tps),
                                           "load": loads})
                    print(f"  > {engine} (cores {out['server_core_ids'][engine]}) batch {b:>3}: {n} tokens, "
                          f"tok/s {[round(x, 1) for x in tps]} (load {loads})", flush=True)
                if bind is None:
                    w = ServerPoolWeights(model, pool)
                    ms = [w.push(v) for v in range(1, args.pushes + 1)]
                    out["sync"] = {"server full push (1 server)": stats([m["time/weight_sync"] for m in ms]),
                                   "server push: safetensors write": stats([m["time/weight_file"] for m in ms]),
                                   "server push: reload + checks": stats([m["time/weight_reload"] for m in ms])}
                    print(f"  > server push median {out['sync']['server full push (1 server)']['median']:.3f}s",
                          flush=True)
            finally:
                pool.close()
    out["load_after"] = load1()
    return out


# ---- part 3: GRPO runs --------------------------------------------------------------------------------------
def grpo_overrides(args: argparse.Namespace, engine: str, out: str) -> list[str]:
    o = ["model.name=default", "model.dtype=float32", f"model.threads={args.threads}", "run.seed=0",
         f"run.output_dir={out}", "task.name=json-extract", f"sampling.max_tokens={args.grpo_max_tokens}",
         "sampling.temperature=1.0", "sampling.top_p=1.0", "sampling.top_k=0", "sampling.stop=[]",
         "algorithm.beta=0.0", "algorithm.num_generations=4", "loop.prompts_per_step=4", f"loop.steps={args.steps}",
         "loop.num_iterations=1", "loop.eval_prompts=1", "loop.eval_every=0", "loop.save_every=0",
         "loop.keep_checkpoints=0", "trainer.lr=1e-5", "logging.tensorboard=false", "logging.console=false"]
    if engine != "own":
        o += ["sampling.engine=vllm", f"sampling.vllm.kv_cache_gb={args.kv_cache_gb}", "sampling.vllm.dtype=float32",
              "sampling.vllm.max_model_len=2048"]
    if engine == "server":
        o += ["cluster.backend=server", "cluster.num_servers=1"]
    return o


def part_grpo(args: argparse.Namespace, engine: str) -> dict:
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.obs import read_metrics

    load0 = load1()
    with tempfile.TemporaryDirectory(prefix=f"engines_grpo_{engine}_") as d:
        t0 = time.perf_counter()
        res = train(load_config(None, grpo_overrides(args, engine, d)))
        wall = time.perf_counter() - t0
        recs = [r for r in read_metrics(str(res.run_dir)) if r.get("kind") == "train"]
    keys = ("time/step", "time/sample", "time/train", "time/weight_sync", "tokens/completion", "reward/mean",
            "train/sampler_logp_abs_diff")
    steps = [{k: r.get(k) for k in keys} for r in recs]
    return {"engine": engine, "steps": steps, "wall_s": wall, "load_before": load0, "load_after": load1()}


def grpo_summary(steps: list[dict]) -> dict:
    warm = steps[1:] or steps
    med = lambda ss, k: statistics.median(s[k] for s in ss if s.get(k) is not None) if any(  # noqa: E731
        s.get(k) is not None for s in ss) else float("nan")
    return {"median_step_s": med(steps, "time/step"), "median_step_s_warm": med(warm, "time/step"),
            "sample_s": med(warm, "time/sample"), "train_s": med(warm, "time/train"),
            "sync_s": med(warm, "time/weight_sync"), "tokens": med(warm, "tokens/completion"),
            "logp_gap": med(steps, "train/sampler_logp_abs_diff")}


# ---- part 4: TRL --------------------------------------------------------------------------------------------
def part_trl(args: argparse.Namespace, use_vllm: bool) -> dict:
    """bench/vs_trl.py's TRL run (same prompts, same recipe); with use_vllm its GRPOConfig is given
    use_vllm=True, vllm_mode=colocate."""
    sys.path.insert(0, str(HERE))
    import trl

    import vs_trl

    vargs = vs_trl.parse_args(["--steps", str(args.steps), "--max-tokens", str(args.grpo_max_tokens),
                               "--threads", str(args.threads), "--only", "trl"])
    vargs.model = vs_trl.resolve_model("default", "")
    if use_vllm:
        base = trl.GRPOConfig

        class Colocated(base):  # the same config, vLLM colocated
            def __init__(self, **kw):
                kw.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.1,
                          vllm_max_model_length=2048)
                super().__init__(**kw)

        trl.GRPOConfig = Colocated  # run_trl imports it from trl at call time
    logs: list[dict] = []
    trainer_cls = trl.GRPOTrainer

    from transformers import TrainerCallback

    class Capture(TrainerCallback):
        def on_log(self, _args, state, control, logs_=None, **kw):
            entry = logs_ if logs_ is not None else kw.get("logs") or {}
            logs.append({key: v for key, v in entry.items() if isinstance(v, (int, float))})

    class Logged(trainer_cls):  # keeps TRL's logged metrics (sampling/*: its vLLM vs trainer log-prob gap)
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.add_callback(Capture())

    trl.GRPOTrainer = Logged
    load0 = load1()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="engines_trl_") as d:
        steps = vs_trl.run_trl(vargs, d)
    wall = time.perf_counter() - t0
    return {"steps": steps, "wall_s": wall, "outside_steps_s": wall - sum(s["seconds"] for s in steps),
            "version": trl.__version__, "logs": logs, "load_before": load0, "load_after": load1()}


def trl_summary(steps: list[dict], logs: list[dict] | None = None) -> dict:
    warm = steps[1:] or steps
    gaps = [x["sampling/sampling_logp_difference/mean"] for x in logs or [] if "sampling/sampling_logp_difference/mean" in x]
    return {"median_step_s": statistics.median(s["seconds"] for s in steps),
            "median_step_s_warm": statistics.median(s["seconds"] for s in warm),
            "sample_s": statistics.median(s["gen_seconds"] for s in warm),
            "train_s": statistics.median(s["seconds"] - s["gen_seconds"] for s in warm),
            "sync_s": float("nan"), "tokens": statistics.median(s["tokens"] for s in warm),
            "logp_gap": statistics.median(gaps) if gaps else float("nan")}


# ---- child / parent -----------------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    part = args.only
    if part == "sampler":
        res = part_sampler(args)
    elif part == "lora":
        res = part_lora(args)
    elif part == "server":
        res = part_server(args)
    elif part.startswith("grpo-"):
        res = part_grpo(args, part.removeprefix("grpo-"))
    else:
        import faulthandler

        # a hang (TRL's colocated vLLM on this CPU build) ends with every thread's stack, not a silent kill
        faulthandler.dump_traceback_later(max(30, args.trl_timeout - 30), exit=True)
        res = part_trl(args, use_vllm=part == "trl-vllm")
        faulthandler.cancel_dump_traceback_later()
    Path(args.out).write_text(json.dumps(res, indent=2, default=str))


def run_child(argv: list[str], part: str, timeout: int, tmp: str) -> tuple[dict | None, str | None, float]:
    """(result, error, wall seconds) of one part in a child process; its output is streamed and its last lines
    kept for the error."""
    out = Path(tmp) / f"{part}.json"
    log = Path(tmp) / f"{part}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--only", part, "--out", str(out)]
    print(f"\n=== {part} ===", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            import signal

            os.killpg(proc.pid, signal.SIGKILL)  # the child's own group: its vLLM engine core / servers too
            proc.wait()
            rc = None
    wall = time.perf_counter() - t0
    text = log.read_text(errors="replace")
    for line in text.splitlines():  # the bench's own progress lines
        if line.startswith("  > "):
            print(line, flush=True)
    if rc == 0 and out.exists():
        print(f"    ({wall:.0f} s)", flush=True)
        return json.loads(out.read_text()), None, wall
    err = first_error(text) if rc is not None else f"timed out after {timeout} s; last lines: {tail(text, 3)}"
    print(f"    FAILED ({wall:.0f} s): {err}", flush=True)
    return None, err, wall


def tail(text: str, n: int) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("INFO", "("))]
    return " | ".join(lines[-n:])[-1500:]


def first_error(text: str) -> str:
    """The exception line of the child's traceback (the last line that names an Error), plus where it was; for a
    child that hung, faulthandler's stack of its main thread (innermost frames)."""
    lines = text.splitlines()
    if "Timeout (" in text and "most recent call first" in text:
        start = max(i for i, ln in enumerate(lines) if ln.startswith("Timeout ("))
        main = next((i for i in range(start, len(lines)) if lines[i].startswith(("Current thread", "Thread 0x"))
                     and "(most recent call first)" in lines[i] and "Current thread" in lines[i]), start + 1)
        frames = [ln.strip() for ln in lines[main + 1:main + 40] if ln.strip().startswith("File")]
        return f"hung: no progress, stack of the main thread when stopped (innermost first): {' <- '.join(frames[:8])}"
    for i in range(len(lines) - 1, -1, -1):
        ln = lines[i].strip()
        if ln and ("Error" in ln.split(":")[0] or "Exception" in ln.split(":")[0]) and not ln.startswith("File"):
            where = [x.strip() for x in lines[max(0, i - 6):i] if x.strip().startswith("File")]
            return ln[:1500] + (f"  (at {where[-1]})" if where else "")
    return tail(text, 5)


def fmt(x, nd=2) -> str:
    return "" if x is None or (isinstance(x, float) and x != x) else f"{x:,.{nd}f}"


def report(args: argparse.Namespace, argv: list[str], results: dict, errors: dict, walls: dict) -> tuple[str, dict]:
    from posttrain.obs.machine import cpu_line, cpu_summary

    md = [f"# Rollout engines: own vs vLLM (in process, server) vs TRL",
          "", f"- command: `python bench/engines.py {' '.join(argv)}`".rstrip(),
          f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
          f"- machine: {cpu_line()}; {platform.platform()}",
          f"- threads: OMP_NUM_THREADS={args.threads}, torch.set_num_threads({args.threads}) in every process",
          "- the machine is shared: load average (1 min) is recorded around every measurement; read the numbers "
          "as noisy (min and median of the repeats)", ""]
    smp = results.get("sampler") or {}
    lra = results.get("lora") or {}
    srv = results.get("server") or {}
    rows = (smp.get("sampler") or []) + (lra.get("sampler") or []) + (srv.get("sampler") or [])
    if rows:
        md += [f"## 1. Sampler tok/s: default model fp32, json-extract prompts, batch B = B/{GROUP} prompts x "
               f"{GROUP}, {args.new_tokens} new tokens (EOS ignored), {args.reps} repeats", "",
               "| engine | batch | tokens | tok/s min | tok/s median | tok/s max | load avg during |",
               "|---|---:|---:|---:|---:|---:|---|"]
        names = {"own": "own HFSampler", "vllm": "vLLM in process", "server": "vLLM server (1), pool's binding",
                 "server, all cores": "vLLM server (1), bound to all cores",
                 "vllm+adapter": "vLLM in process, LoRA adapter served"}
        for r in sorted(rows, key=lambda r: (r["batch"], list(names).index(r["engine"]))):
            t = r["tok_s"]
            md.append(f"| {names[r['engine']]} | {r['batch']} | {r['tokens']} | {fmt(t['min'], 1)} | "
                      f"{fmt(t['median'], 1)} | {fmt(t['max'], 1)} | {r['load']} |")
        md += ["", "| engine start | s |", "|---|---:|"]
        if "vllm_startup_s" in smp:
            md.append(f"| vLLM in process (`vllm.LLM`, eager, fp32) | {smp['vllm_startup_s']:.1f} |")
        if "vllm_lora_startup_s" in lra:
            md.append(f"| vLLM in process with LoRA (max_lora_rank 16) | {lra['vllm_lora_startup_s']:.1f} |")
        if "server_startup_s" in srv:
            md.append(f"| vLLM server (process start to /health) | {srv['server_startup_s']:.1f} |")
        if srv.get("server_core_ids"):
            md += ["", "vLLM server worker's OpenMP cores (its log): " + ", ".join(
                f"{k}: {v}" for k, v in srv["server_core_ids"].items()) + ". With one server the pool leaves the "
                "binding to vLLM (`auto`), which keeps a core free for the API process: on a 2-core machine the "
                "worker gets one core."]
        md.append("")
    sync = {**(smp.get("sync") or {}), **(lra.get("sync") or {}), **(srv.get("sync") or {})}
    if sync:
        md += [f"## 2. Weight sync per step (default model, 538 MB fp32; LoRA r=16 on all linear layers), "
               f"{args.pushes} pushes", "", "| push | median s | min s | max s |", "|---|---:|---:|---:|"]
        md += [f"| {k} | {v['median']:.4f} | {v['min']:.4f} | {v['max']:.4f} |" for k, v in sync.items()]
        ws = RESULTS / "weight_sync.json"
        if ws.exists():
            for r in json.loads(ws.read_text())["rows"]:
                if r["transport"] in ("in-process copy", "shared memory", "LoRA r=16, in-process copy",
                                      "LoRA r=16, shared memory"):
                    md.append(f"| own loop: {r['transport']} (bench/results/weight_sync.json) | {r['median_s']:.4f}"
                              f" | {r['min_s']:.4f} | {r['max_s']:.4f} |")
        md.append("")
    grpo = {k: v for k, v in results.items() if k.startswith(("grpo-", "trl")) and v}
    summary = {}
    if grpo or any(k.startswith(("grpo-", "trl")) for k in errors):
        md += [f"## 3./4. GRPO step on json-extract: {args.steps} steps x 4 prompts x G=4, up to "
               f"{args.grpo_max_tokens} new tokens, fp32, full fine-tune (bench/vs_trl.py's recipe)", "",
               "| run | median s/step (all) | median s/step (2..K) | sample s | train s | sync s | tokens/step | "
               "sampler vs trainer mean abs logp gap | wall s | load before/after |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        names = {"grpo-own": "posttrain, own engine", "grpo-vllm": "posttrain, vLLM in process",
                 "grpo-server": "posttrain, vLLM server (1)", "trl": "TRL GRPOTrainer, no vLLM",
                 "trl-vllm": "TRL GRPOTrainer, vLLM colocate"}
        for k, label in names.items():
            if k in grpo:
                r = grpo[k]
                s = summary[k] = (trl_summary(r["steps"], r.get("logs")) if k.startswith("trl")
                                  else grpo_summary(r["steps"]))
                gap = "" if s["logp_gap"] != s["logp_gap"] else f"{s['logp_gap']:.2g}"
                md.append(f"| {label} | {fmt(s['median_step_s'])} | {fmt(s['median_step_s_warm'])} | "
                          f"{fmt(s['sample_s'])} | {fmt(s['train_s'])} | {fmt(s['sync_s'], 3)} | "
                          f"{fmt(s['tokens'], 0)} | {gap} | {fmt(r['wall_s'], 0)} | "
                          f"{r['load_before']} / {r['load_after']} |")
            elif k in errors:
                md.append(f"| {label} | failed | | | | | | | {fmt(walls.get(k), 0)} | |")
        md.append("")
        md.append("TRL's train s is its step minus its generation (`_generate`); its weight sync (colocate: "
                  "`load_weights` per parameter, then a prefix-cache reset) is inside that. TRL starts its vLLM "
                  "with torch.compile (GRPOConfig has no enforce_eager switch), posttrain's eager; both fp32. TRL "
                  "pushes weights with the vLLM model's own `load_weights`, which on vLLM's CPU build does not "
                  "reach the repacked linear weights (see sampling/vllm_engine.py): the log-prob gap column (TRL's "
                  "sampling/sampling_logp_difference/mean, posttrain's train/sampler_logp_abs_diff) shows whether "
                  "the sampler serves the trainer's weights. "
                  "TRL's time outside the steps (model load, vLLM start and compile): "
                  + ", ".join(f"{k} {grpo[k].get('outside_steps_s', float('nan')):.0f} s" for k in grpo
                              if k.startswith("trl")) + ".")
        ratios = {}
        for pt, tr in (("grpo-own", "trl"), ("grpo-vllm", "trl-vllm"), ("grpo-vllm", "trl"), ("grpo-own", "trl-vllm")):
            if pt in summary and tr in summary:
                ratios[f"{pt} / {tr}"] = summary[pt]["median_step_s_warm"] / summary[tr]["median_step_s_warm"]
        if ratios:
            md += ["", "| ratio of median s/step (2..K), posttrain / TRL (<1: posttrain faster) | |", "|---|---:|"]
            md += [f"| {k} | {v:.2f} |" for k, v in ratios.items()]
        summary["ratios"] = ratios
        md.append("")
    if errors:
        md += ["## What failed", ""] + [f"- **{k}**: `{v}`" for k, v in errors.items()] + [""]
    md += ["## Wall time per part", "", "| part | s |", "|---|---:|"]
    md += [f"| {k} | {v:.0f} |" for k, v in walls.items()]
    md.append(f"| total | {sum(walls.values()):.0f} |")
    report_json = {"command": f"python bench/engines.py {' '.join(argv)}".rstrip(),
                   "date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": cpu_summary(),
                   "cpu_line": cpu_line(), "platform": platform.platform(),
                   "args": {k: v for k, v in vars(args).items() if k not in ("only", "out")},
                   "results": results, "summary": summary, "errors": errors, "wall_s": walls}
    return "\n".join(md) + "\n", report_json


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # every child and the servers it starts
    if args.only:
        return child(args)
    parts = ["sampler", "lora"]
    errors, results, walls = {}, {}, {}
    why = None if args.skip_server else server_available()
    if args.skip_server:
        errors["server"] = "skipped (--skip-server)"
    elif why:
        errors["server"] = f"posttrain.cluster.vllm_servers does not import: {why}"
    else:
        parts.append("server")
    if not args.skip_grpo:
        parts += ["grpo-own", "grpo-vllm"] + (["grpo-server"] if "server" in parts else [])
    if not args.skip_trl:
        parts += ["trl-vllm", "trl"]
    with tempfile.TemporaryDirectory(prefix="engines_") as tmp:
        for part in parts:
            timeout = args.trl_timeout if part.startswith("trl") else 1200
            res, err, walls[part] = run_child(argv, part, timeout, tmp)
            results[part] = res
            if err:
                errors[part] = err
    md, rep = report(args, argv, results, errors, walls)
    print("\n" + md)
    # a --quick smoke run does not replace the results file unless --results says where
    dest = Path(args.results) if not args.quick or args.results != str(RESULTS) else Path(tempfile.gettempdir())
    dest.mkdir(parents=True, exist_ok=True)
    stem = "engines_quick" if args.quick else "engines"
    (dest / f"{stem}.md").write_text(md)
    (dest / f"{stem}.json").write_text(json.dumps(rep, indent=2, default=str))
    print(f"wrote {dest / stem}.md and .json")


if __name__ == "__main__":
    main()
