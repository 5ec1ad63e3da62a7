"""The results pages' plots, rendered from the JSON the benchmarks wrote to bench/results/ (never drawn by hand):

    python scripts/results_plots.py            # write docs/img/results/*.png
    python scripts/results_plots.py --out DIR  # write them into DIR instead (the tests render into a temp dir)
    python scripts/results_plots.py --check    # exit 1 if a plot a results page shows is missing

Each plot reads only bench/results/*.json, so re-running a benchmark and then this script updates the site.
Needs matplotlib (in the dev and bench extras).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "img" / "results"


def _load(name: str):
    return json.loads((RESULTS / name).read_text())


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
                         "axes.grid": True, "grid.alpha": 0.3, "svg.hashsalt": "posttrain"})
    return plt


def _band(curves: list[list[tuple[float, float]]], grid):
    """Mean and min/max over seeds of step curves (x, y) sampled on `grid` (the last value held; NaN before the
    first point)."""
    import numpy as np

    ys = []
    for c in curves:
        xs = np.array([p[0] for p in c], dtype=float)
        vs = np.array([p[1] for p in c], dtype=float)
        idx = np.searchsorted(xs, grid, side="right") - 1
        y = np.where(idx >= 0, vs[np.clip(idx, 0, None)], np.nan)
        ys.append(y)
    ys = np.array(ys)
    return np.nanmean(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)


def algorithms(plt) -> str:
    """Train reward vs training seconds per variant, mean and seed range (bench/algorithms.py)."""
    import numpy as np
    import warnings

    d = _load("algorithms.json")
    tasks = d["args"]["tasks"]
    budgets = {"json-extract": d["args"]["budget_json"], "count-a": d["args"]["budget_count"]}
    variants = d["args"]["variants"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(10, 3.8))
    cmap = plt.get_cmap("tab10")
    for ax, task in zip(axes, tasks):
        grid = np.linspace(0, budgets.get(task, 60.0) * 1.1, 200)
        for i, v in enumerate(variants):
            curves = [r["curve"] for r in d["results"] if r["task"] == task and r["variant"] == v and r["curve"]]
            if not curves:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns before the first step
                mean, lo, hi = _band(curves, grid)
            ax.plot(grid, mean, color=cmap(i % 10), label=v, lw=1.4)
            ax.fill_between(grid, lo, hi, color=cmap(i % 10), alpha=0.12, lw=0)
        ax.set_title(f"{task} ({budgets.get(task, 0):.0f} s of training, seeds {d['args']['seeds']})")
        ax.set_xlabel("training seconds")
        ax.set_ylabel("train reward")
    axes[-1].legend(fontsize=7, ncol=2, frameon=False)
    fig.tight_layout()
    return _save(fig, "algorithms")


def async_vs_sync(plt) -> str:
    """Train reward vs wall-clock seconds for the sync loop and async at each staleness (bench/async_vs_sync.py)."""
    import numpy as np
    import warnings

    d = _load("async_vs_sync.json")
    arms: dict[str, list] = {}
    for r in d["results"]:
        if r["mode"] == "sync":
            name = "sync"
        else:
            name = f"async, max_staleness={r['max_staleness']}" + ("" if r["interruptible"] else ", not interruptible")
        t = np.cumsum(r["step_walls"])
        arms.setdefault(name, []).append(list(zip(t, r["rewards"])))
    tmax = max(c[-1][0] for cs in arms.values() for c in cs)
    grid = np.linspace(0, tmax, 300)
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for i, (name, curves) in enumerate(sorted(arms.items(), key=lambda kv: (kv[0] != "sync", kv[0]))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean, lo, hi = _band(curves, grid)
        c = plt.get_cmap("tab10")(i)
        ax.plot(grid, mean, color=c, label=name, lw=1.4)
        ax.fill_between(grid, lo, hi, color=c, alpha=0.15, lw=0)
    ax.set_xlabel("wall-clock seconds of training")
    ax.set_ylabel("train reward")
    ax.set_title(f"3-turn env sleeping {d['args']['delay'] * 1000:.0f} ms a turn, {d['args']['model']}, "
                 f"seeds {d['args']['seeds']}")
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return _save(fig, "async_vs_sync")


VS_TRL_RUNS = [  # file, label (the README's table each came from)
    ("vs_trl.json", "fp32 sampler\n(AVX2)"),
    ("vs_trl_lora.json", "LoRA r=16\n(AVX2)"),
    ("vs_trl_ckpt.json", "checkpointing\n(AVX2)\n2026-12-02"),
    ("vs_trl_bf16_ckpt.json", "bf16 sampler,\ncheckpointing\n2026-12-02"),
    ("vs_trl_bf16.json", "bf16 sampler\nrun 1\n2026-12-02"),
    ("vs_trl_bf16_run2.json", "bf16 sampler\nrun 2\n2026-12-02"),
    ("vs_trl_bf16_train_bf16.json", "bf16 trainer\nrun 1\n2026-12-03"),
    ("vs_trl_bf16_train_bf16_run2.json", "bf16 trainer\nrun 2\n2026-12-03"),
    ("vs_trl_bf16_train_bf16_run4.json", "bf16 trainer\nrun 4\n2026-12-03"),
    ("vs_trl_avx2.json", "AVX2-only EPYC\n2026-12-02"),
]


def vs_trl(plt) -> str:
    """Median step seconds (steps 2-8) of posttrain and TRL in every kept bench/vs_trl.py run."""
    import numpy as np

    runs = [(label, _load(f)["summary"]) for f, label in VS_TRL_RUNS if (RESULTS / f).exists()]
    x = np.arange(len(runs))
    arms = [("posttrain", "posttrain (the run's sampler)", "#2c7fb8"),
            ("posttrain_fp32", "posttrain, fp32 sampler (same run)", "#7fcdbb"),
            ("trl", "TRL GRPOTrainer", "#d95f0e")]
    w = 0.27
    fig, ax = plt.subplots(figsize=(11, 4.2))
    for j, (key, name, color) in enumerate(arms):
        vals = [s[key]["median_step_s_warm"] if key in s else np.nan for _, s in runs]
        bars = ax.bar(x + (j - 1) * w, vals, w, label=name, color=color)
        ax.bar_label(bars, fmt="%.1f", fontsize=6, padding=1)
    ax.set_xticks(x, [label for label, _ in runs], fontsize=7)
    ax.set_ylabel("median step, seconds (lower is faster)")
    ax.set_title("posttrain vs TRL on the same GRPO work (SmolLM2-135M, json-extract, 16 completions a step, 2 threads)")
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    fig.tight_layout()
    return _save(fig, "vs_trl")


def sandbox(plt) -> str:
    """Overhead per run over a plain subprocess, by backend and workload (bench/sandbox.py)."""
    import numpy as np

    d = _load("sandbox.json")
    rows = [r for r in d["rows"] if r["backend"] != "plain"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, conc in zip(axes, (1, 2)):
        x = np.arange(len(workloads))
        w = 0.8 / len(backends)
        for j, b in enumerate(backends):
            vals = []
            for wl in workloads:
                m = [r["overhead_ms"] for r in rows if r["backend"] == b and r["workload"] == wl
                     and r["concurrency"] == conc]
                vals.append(m[0] if m else np.nan)
            ax.bar(x + (j - (len(backends) - 1) / 2) * w, vals, w, label=b, color=plt.get_cmap("Set2")(j))
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xticks(x, workloads)
        ax.set_title(f"concurrency {conc}")
    axes[0].set_ylabel("ms per run over a plain subprocess")
    axes[1].legend(fontsize=7, frameon=False)
    fig.suptitle(f"sandbox overhead ({d['meta']['runs']} runs each, {d['meta']['cpus']} CPUs)", fontsize=9)
    fig.tight_layout()
    return _save(fig, "sandbox")


def gpu(plt) -> str:
    """H200: sampler tokens/s and a GRPO step, eager decode vs CUDA graphs (bench/gpu.py --graphs)."""
    import numpy as np

    eager1, sess2 = _load("gpu.json")["rows"], _load("gpu_graphs.json")["rows"]
    keys = ["sampler tok/s, batch 64, 256 new tokens", "sampler tok/s, batch 256, 256 new tokens"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4), gridspec_kw={"width_ratios": [2, 1]})
    x = np.arange(len(keys))
    for j, (name, vals) in enumerate([("eager, session 1", [eager1[k] for k in keys]),
                                      ("eager, session 2", [sess2[k] for k in keys]),
                                      ("CUDA graphs", [sess2[k + ", CUDA graphs"] for k in keys])]):
        b = a1.bar(x + (j - 1) * 0.27, vals, 0.27, label=name, color=plt.get_cmap("Set1")(j + 1))
        a1.bar_label(b, fmt="%.0f", fontsize=6)
    a1.set_xticks(x, ["batch 64", "batch 256"])
    a1.set_ylabel("sampler tokens/s (256 new tokens)")
    a1.legend(fontsize=7, frameon=False)
    step = "GRPO step s, 16 prompts x G=4 x 256"
    names = ["eager 1", "eager 2", "CUDA graphs", "TRL 1.16"]
    vals = [eager1[step], sess2[step], sess2[step + ", CUDA graphs"], eager1["TRL GRPOTrainer step s, same shapes"]]
    b = a2.bar(names, vals, color=[plt.get_cmap("Set1")(i) for i in (1, 2, 3, 0)])
    a2.bar_label(b, fmt="%.1f", fontsize=7)
    a2.set_ylabel("GRPO step, seconds")
    a2.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"{_load('gpu.json')['device']}, bf16, default architecture (random weights)", fontsize=9)
    fig.tight_layout()
    return _save(fig, "gpu")


def reversal(plt) -> str:
    """Scripted policy's success and absorption vs rho, shield off/on, episodic/reset-free (bench/reversal.py)."""
    d = _load("reversal.json")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4), sharex=True)
    for i, (mode, shield) in enumerate([(m, s) for m in ("episodic", "reset-free") for s in ("off", "on")]):
        rows = sorted((r for r in d["rows"] if r["mode"] == mode and r["shield"] == shield), key=lambda r: r["rho"])
        if not rows:
            continue
        style = dict(color=plt.get_cmap("tab10")(i), marker="o", ls="-" if shield == "off" else "--",
                     label=f"{mode}, shield {shield}")
        a1.plot([r["rho"] for r in rows], [r["success"] for r in rows], **style)
        a2.plot([r["rho"] for r in rows], [r["absorbed"] for r in rows], **style)
    a1.set_ylabel("success")
    a2.set_ylabel("absorbed (trapped)")
    for a in (a1, a2):
        a.set_xlabel("rho (1: every move can be undone)")
    a2.legend(fontsize=7, frameon=False)
    a = d["args"]
    fig.suptitle(f"reversal, {a['policy']} policy, {a['maps']} maps of size {a['size']}", fontsize=9)
    fig.tight_layout()
    return _save(fig, "reversal")


def sampler_precision(plt) -> str:
    """Rollout tokens/s by sampler precision and packing on the AVX-512 and the AVX2 EPYC."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, (f, title) in zip(axes, [("sampler_precision.json", "AMD EPYC, AVX-512 + BF16"),
                                     ("sampler_precision_avx2.json", "AMD EPYC, AVX2 only (Zen 3)")]):
        if not (RESULTS / f).exists():
            continue
        rows = _load(f)["rows"]
        names = [r["precision"].split(" (")[0] for r in rows][::-1]
        vals = [r["tokens_per_s"] for r in rows][::-1]
        b = ax.barh(names, vals, color=["#d95f0e" if "dynamic" in n else "#2c7fb8" for n in names])
        ax.bar_label(b, fmt="%.0f", fontsize=7, padding=2)
        ax.set_xlabel("rollout tokens/s, batch 16, 64 new tokens")
        ax.set_title(title)
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    return _save(fig, "sampler_precision")


def remedy_partial_credit(plt) -> str:
    """Held-out pass on the stalled partial_credit task per seed: remedies off vs on (bench/remedy_stall.py)."""
    import numpy as np

    rows = _load("remedy_partial_credit.json")
    arms = [("plain", "remedies off"), ("remedies", "remedies on"), ("remedies-distill", "remedies on, with distill")]
    seeds = sorted({r["seed"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 3.2))
    x = np.arange(len(seeds))
    for j, (suffix, name) in enumerate(arms):
        vals = []
        for s in seeds:
            m = [r["after"] for r in rows if r["seed"] == s and r["run"].endswith(f"-s{s}-{suffix}")]
            vals.append(100 * m[0] if m else np.nan)
        b = ax.bar(x + (j - 1) * 0.27, vals, 0.27, label=name, color=plt.get_cmap("Set2")(j))
        ax.bar_label(b, fmt="%.0f%%", fontsize=7)
    ax.set_xticks(x, [f"seed {s}" for s in seeds])
    ax.set_ylabel("held-out pass after, %")
    ax.set_ylim(0, 115)
    ax.set_title("examples/stall_tasks.py:partial_credit, 20 steps (held-out pass before: 0%)")
    ax.legend(fontsize=7, frameon=False, loc="upper left", ncol=3)
    fig.tight_layout()
    return _save(fig, "remedy_partial_credit")


def engines(plt) -> str:
    """Median GRPO step by rollout engine (bench/engines.py)."""
    s = _load("engines.json")["summary"]
    names = {"grpo-own": "own loop", "grpo-vllm": "vLLM in process", "grpo-server": "vLLM server",
             "trl": "TRL", "trl-vllm": "TRL + vLLM colocate"}
    keys = [k for k in names if k in s]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    vals = [s[k]["median_step_s_warm"] for k in keys]
    b = ax.bar([names[k] for k in keys], vals,
               color=["#2c7fb8" if not k.startswith("trl") else "#d95f0e" for k in keys])
    ax.bar_label(b, fmt="%.1f", fontsize=7)
    ax.set_ylabel("median GRPO step, seconds")
    ax.set_title("json-extract, 4 prompts x G=4, default model, fp32, 2-core CPU")
    fig.tight_layout()
    return _save(fig, "engines")


def tasks_suite(plt) -> str:
    """Held-out pass before/after per reasoning-gym dataset and framework, seeds as dots (bench/tasks_suite.py);
    beside it, held-out pass vs training seconds where TRL ran too (what "time to TRL's final level" reads)."""
    import numpy as np

    runs = _load("tasks_suite.json")["runs"]
    datasets = list(dict.fromkeys(r["dataset"] for r in runs))
    arms = [("posttrain", "#2c7fb8", "#a6bddb"), ("trl", "#d95f0e", "#fdbe85")]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    x, w = np.arange(len(datasets)), 0.2
    for j, (fw, dark, light) in enumerate(arms):
        for k, (which, color) in enumerate([(0, light), (-1, dark)]):
            pos = x + (2 * j + k - 1.5) * w
            vals = [[r["evals"][which]["pass"] for r in runs if r["dataset"] == d and r["framework"] == fw]
                    for d in datasets]
            ax.bar(pos, [np.mean(v) if v else np.nan for v in vals], w, color=color,
                   label=f"{fw} {'before' if which == 0 else 'after'}")
            for p_, v in zip(pos, vals):
                ax.plot([p_] * len(v), v, "k.", ms=3)
    ax.set_xticks(x, datasets, fontsize=7, rotation=20)
    ax.set_ylabel("held-out pass (greedy)")
    ax.set_ylim(0, 1)
    seeds = sorted({r["seed"] for r in runs})
    ax.set_title(f"before / after {max(len(r['steps']) for r in runs)} steps, seeds {seeds} (dots: one seed each)")
    ax.legend(fontsize=7, frameon=False, ncol=2)
    cmap = plt.get_cmap("tab10")
    trl_sets = sorted({r["dataset"] for r in runs if r["framework"] == "trl"})
    for i, d in enumerate(trl_sets or datasets):  # no TRL run yet: posttrain's curves on every dataset
        for fw, style in (("posttrain", "-"), ("trl", "--")):
            for r in (r for r in runs if r["dataset"] == d and r["framework"] == fw):
                t = np.cumsum([s["seconds"] for s in r["steps"]])
                xs = [0.0 if e["step"] == 0 else t[e["step"] - 1] for e in r["evals"]]
                ax2.plot(xs, [e["pass"] for e in r["evals"]], style, color=cmap(i), lw=1.2, marker=".",
                         label=f"{d} {fw}" if r["seed"] == seeds[0] else None)
    ax2.set_xlabel("training seconds (evals excluded)")
    ax2.set_ylabel("held-out pass")
    ax2.set_title("held-out pass vs time\n(solid: posttrain, dashed: TRL)")
    ax2.set_ylim(0, 1)
    ax2.legend(fontsize=6, frameon=False, ncol=2)
    fig.tight_layout()
    return _save(fig, "tasks_suite")


def _save(fig, name: str) -> str:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.png"
    fig.savefig(path, metadata={"Software": None})  # no version string: the same JSON gives the same file
    import matplotlib.pyplot as plt

    plt.close(fig)
    return str(path)


PLOTS = [algorithms, async_vs_sync, vs_trl, sandbox, gpu, reversal, sampler_precision, remedy_partial_credit, engines,
         tasks_suite]


def check() -> list[str]:
    """Plots a results page shows that are not on disk."""
    import re

    missing = []
    for page in (ROOT / "docs" / "results").glob("*.md"):
        for img in re.findall(r"\(\.\./img/results/([^)]+)\)", page.read_text()):
            if not (OUT / img).exists():
                missing.append(f"{page.name}: {img}")
    return missing


def main(argv: list[str]) -> int:
    global OUT
    if len(argv) == 2 and argv[0] == "--out":
        OUT = Path(argv[1]).resolve()
        argv = []
    if argv == ["--check"]:
        missing = check()
        print("\n".join(missing) or "every plot the results pages show is there")
        return 1 if missing else 0
    plt = _plt()
    for fn in PLOTS:
        print(fn(plt))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
