"""Console output: one progress line per step, eval tables, the before/after table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(highlight=False, soft_wrap=True)


def _rate(m: dict[str, Any]) -> str:
    """Sampling tokens/s when the step sampled in the foreground (the async loop's rate is in async/* metrics)."""
    return f"tok/s={m['perf/sample_tokens_per_s']:.0f} " if "perf/sample_tokens_per_s" in m else ""


def step_line(step: int, total: int, m: dict[str, Any]) -> str:
    stages = " ".join(
        f"{k[5:]}={m[k]:.1f}s" for k in ("time/sample", "time/reward", "time/train", "time/sync") if k in m
    )
    passes = " ".join(f"{k[5:]}={m[k]:.2f}" for k in sorted(m) if k.startswith("pass/"))
    line = (
        f"step {step:>4}/{total} reward={m.get('reward/mean', 0):.3f}±{m.get('reward/std', 0):.3f} "
        f"{passes} {_rate(m)}len={m.get('completion/len_mean', 0):.0f} "
        f"loss={m.get('train/loss', 0):+.4f} gnorm={m.get('train/grad_norm', 0):.2f} {stages}"
    )
    if "select/retired" in m:  # adaptive prompt selection: what it left out and what it replayed
        line += (
            f" prompts: retired={m['select/retired']:.0f} backed_off={m['select/backed_off']:.0f} "
            f"replayed={m.get('select/replayed', 0):.0f}"
        )
    if m.get("rollouts/failed"):  # failed samples (kept out of training): the run says why once per step
        line += f" failed={m['rollouts/failed']:.0f}/{m.get('rollouts/count', 0):.0f}"
    if "es/fitness_mean" in m:  # evolution strategies: no loss or gradient, the population's fitness instead
        line += f" fitness={m['es/fitness_mean']:.3f}[{m['es/fitness_min']:.3f},{m['es/fitness_max']:.3f}]"
    return line


def print_line(text: str, enabled: bool = True) -> None:
    if enabled:
        console.print(text, markup=False)
        console.file.flush()  # progress must show up live when stdout is a pipe or a file (| tee run.log)


def task_table(title: str, cols: list[tuple[str, dict[str, float]]]) -> Table | None:
    """A mixture's held-out pass rate and reward per task, one column per eval (`eval/task/<name>/...` keys);
    None when the evals hold no per-task keys (a run of one task)."""
    names = sorted({k[len("eval/task/") :].rsplit("/", 1)[0] for _, m in cols for k in m if k.startswith("eval/task/")})
    if not names:
        return None
    table = Table(title=title)
    table.add_column("task")
    for label, _ in cols:
        table.add_column(f"pass {label}", justify="right")
    for label, _ in cols:
        table.add_column(f"reward {label}", justify="right")
    for n in names:
        passes = [m.get(f"eval/task/{n}/pass_rate") for _, m in cols]
        rewards = [m.get(f"eval/task/{n}/reward") for _, m in cols]
        table.add_row(
            n,
            *[f"{v * 100:.1f}%" if v is not None else "-" for v in passes],
            *[f"{v:.3f}" if v is not None else "-" for v in rewards],
        )
    return table


def suite_table(title: str, rows: list[dict[str, Any]]) -> Table:
    """An eval suite's rows (loop/eval_suite.py SuiteResult.table): one line per task."""
    table = Table(title=title)
    cols = [k for k in (rows[0] if rows else {}) if k != "task"]
    table.add_column("task")
    for k in cols:
        table.add_column(k, justify="right")
    for r in rows:
        cells = []
        for k in cols:
            v = r[k]
            cells.append(
                "-"
                if v is None
                else f"{v * 100:.1f}%"
                if k.startswith(("pass@", "maj@"))
                else f"{v:.3f}"
                if isinstance(v, float) and k == "reward"
                else str(v)
            )
        table.add_row(str(r["task"]), *cells)
    return table


def eval_table(title: str, rows: list[tuple[str, dict[str, float]]]) -> Table:
    """rows: (label, eval metrics) in order, e.g. [("before", m0), ("after", m1)]."""
    keys = sorted({k for _, m in rows for k in m if k.startswith("eval/pass") or k == "eval/reward"})
    table = Table(title=title)
    table.add_column("metric")
    for label, _ in rows:
        table.add_column(label, justify="right")
    if len(rows) == 2:
        table.add_column("change", justify="right")
    for k in keys:
        vals = [m.get(k) for _, m in rows]
        pct = k != "eval/reward"
        cells = [(f"{v * 100:.1f}%" if pct else f"{v:.3f}") if v is not None else "-" for v in vals]
        if len(rows) == 2 and vals[0] is not None and vals[1] is not None:
            d = vals[1] - vals[0]
            cells.append(f"{d * 100:+.1f} pts" if pct else f"{d:+.3f}")
        table.add_row(k.removeprefix("eval/"), *cells)
    return table
