"""`posttrain report RUN_DIR`: a PNG of reward curves and pass rates from metrics.jsonl."""

from __future__ import annotations

import os

from posttrain.obs.metrics import read_metrics


def write_report(run_dir: str, out: str | None = None) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("posttrain report needs matplotlib: pip install 'posttrain[report]'") from None
    recs = read_metrics(run_dir)
    train = [r for r in recs if r.get("kind") == "train"]
    evals = [r for r in recs if r.get("kind") == "eval"]
    if not train and not evals:
        raise ValueError(f"{run_dir}/metrics.jsonl has no train or eval records")
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    steps = [r["step"] for r in train]
    ax.plot(steps, [r.get("reward/mean", 0) for r in train], label="reward (train)")
    for k in sorted(
        {k for r in train for k in r if k.startswith("reward/") and k not in ("reward/mean", "reward/std")}
    ):
        ax.plot(steps, [r.get(k, 0) for r in train], label=k, alpha=0.6)
    _mark_diagnostics(ax, recs, run_dir)
    ax.set_xlabel("step")
    ax.set_title("train reward")
    ax.legend(fontsize=7)
    ax = axes[1]
    for k in sorted({k for r in train for k in r if k.startswith("pass/")}):
        ax.plot(steps, [r.get(k, 0) for r in train], label=k)
    ax.set_xlabel("step")
    ax.set_title("train pass rates")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax = axes[2]
    esteps = [r["step"] for r in evals]
    for k in sorted({k for r in evals for k in r if k.startswith("eval/pass")}):
        ax.plot(esteps, [r.get(k, 0) for r in evals], marker="o", label=k)
    ax.set_xlabel("step")
    ax.set_title("held-out pass rates")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = out or os.path.join(run_dir, "report.png")
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _mark_diagnostics(ax, recs, run_dir: str) -> None:
    """A dashed line and the name at each step where a diagnostic started (the same verdicts as
    `posttrain diagnose`)."""
    from pathlib import Path

    from posttrain.obs.diagnose_run import run_config
    from posttrain.obs.diagnostics import Diagnostics

    d = Diagnostics(run_config(Path(run_dir)).model_copy(update={"enabled": True}))
    for e in d.replay(recs):
        if e.state == "start":
            ax.axvline(e.step, color="tab:red", ls="--", lw=0.8, alpha=0.6)
            ax.annotate(
                e.name,
                (e.step, 1.0),
                xycoords=("data", "axes fraction"),
                rotation=90,
                fontsize=6,
                va="top",
                ha="right",
                color="tab:red",
            )
