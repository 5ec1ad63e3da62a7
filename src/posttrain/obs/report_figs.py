"""The report's charts: one function per plotly figure of a run (obs/html_report.py lays them out on the page;
auto/report.py reuses the helpers). Plotly is imported only when a figure is drawn (the `report` extra).
"""

from __future__ import annotations

import json
from typing import Any

from posttrain.obs.run_data import ReportError, RunData
from posttrain.obs.trace import lane_order

# The trainer's per-step stages, stacked in the timing chart (time/<stage>); other time/* keys overlap them
# (async busy times, the weight-sync transport's own timing) and are drawn as lines.
STAGES = ["sample", "reward", "token_stats", "train", "sync", "perturb"]
# Timeline colours: work in strong colours, waiting in greys, so idle time reads as idle at a glance.
STAGE_COLOURS = {
    "sample": "#2a9d8f",
    "reward": "#e9c46a",
    "token_stats": "#f4a261",
    "train": "#1f5fbf",
    "sync": "#9b5de5",
    "eval": "#264653",
    "perturb": "#e76f51",
    "wait_rollouts": "#c8c8c8",
    "wait_weights": "#e4e4e4",
}


# ---- figures -----------------------------------------------------------------------------------------------


def load_plotly():
    """plotly's graph_objects and get_plotlyjs, or a ReportError naming the extra (every page that draws uses it)."""
    try:
        import plotly.graph_objects as go
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise ReportError("posttrain report needs plotly: pip install 'posttrain[report]'") from None
    return go, get_plotlyjs


def apply_layout(fig, title: str, xaxis: str = "step", yaxis: str = "", height: int = 340) -> Any:
    """The house look of every report figure (this page's and auto/report.py's): title, axes, size, margins."""
    fig.update_layout(
        title=title,
        height=height,
        margin={"l": 50, "r": 20, "t": 50, "b": 40},
        template="plotly_white",
        legend={"font": {"size": 10}},
        xaxis_title=xaxis,
        yaxis_title=yaxis,
    )
    return fig


def fig_lines(run: RunData, title: str, keys: list[str], records=None, yaxis: str = "", mode: str = "lines+markers"):
    go, _ = load_plotly()
    fig = go.Figure()
    for k in keys:
        x, y = run.series(k, records)
        if x:
            fig.add_trace(go.Scatter(x=x, y=y, name=k, mode=mode))
    return apply_layout(fig, title, yaxis=yaxis) if fig.data else None


def fig_reward(run: RunData):
    """Mean reward with a one-std band, each rubric component, and where a diagnostic started."""
    go, _ = load_plotly()
    comps = [k for k in run.keys("reward/") if k not in ("reward/mean", "reward/std")]
    fig = fig_lines(run, "train reward and its components", ["reward/mean", *comps])
    if fig is None:
        return None
    x, m = run.series("reward/mean")
    _, s = run.series("reward/std")
    if len(s) == len(m) and all(v is not None for v in m + s):
        fig.add_trace(
            go.Scatter(
                x=x + x[::-1],
                y=[a + b for a, b in zip(m, s)] + [a - b for a, b in zip(m, s)][::-1],
                fill="toself",
                line={"width": 0},
                opacity=0.2,
                name="reward ± std",
                hoverinfo="skip",
            )
        )
    for step, name in _diagnostic_starts(run):
        fig.add_vline(
            x=step, line_dash="dash", line_color="crimson", opacity=0.6, annotation_text=name, annotation_font_size=9
        )
    for step, name in _remedy_actions(run):  # what the loop changed in answer (diagnostics.remedies)
        fig.add_vline(
            x=step,
            line_dash="dot",
            line_color="seagreen",
            opacity=0.6,
            annotation_text=f"remedy: {name}",
            annotation_position="bottom right",
            annotation_font_size=9,
        )
    return fig


def _remedy_actions(run: RunData) -> list[tuple[int, str]]:
    """Each remedy change the loop logged (metrics.jsonl records of kind "remedy"), once per step and remedy."""
    seen = {(r.get("step"), r.get("remedy")) for r in run.records if r.get("kind") == "remedy"}
    return sorted((int(s), str(n)) for s, n in seen if isinstance(s, int))


def fig_curriculum(run: RunData, max_prompts: int = 80):
    """loop.prompt_selection=adaptive: each prompt's pass rate at every step it was drawn (a heat map, prompts in
    the order first drawn; blank: not drawn that step), so replays, retirements and revisits show as the run goes."""
    cells = [
        (r["step"], int(row), p)
        for r in run.train
        if isinstance(r.get("select/pass_by_prompt"), dict)
        for row, p in r["select/pass_by_prompt"].items()
        if _is_number(p)
    ]
    if not cells:
        return None
    go, _ = load_plotly()
    order: dict[int, int] = {}
    for _, row, _ in sorted(cells):
        order.setdefault(row, len(order))
    rows = [r for r in order if order[r] < max_prompts]
    steps = sorted({s for s, _, _ in cells})
    z = [[None] * len(steps) for _ in rows]
    col, line = {s: j for j, s in enumerate(steps)}, {r: i for i, r in enumerate(rows)}
    for s, row, p in cells:
        if row in line:
            z[line[row]][col[s]] = p
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=steps,
            y=[f"row {r}" for r in rows],
            zmin=0,
            zmax=1,
            colorscale="RdYlGn",
            colorbar={"title": "pass"},
            hoverongaps=False,
        )
    )
    more = f" (first {max_prompts} of {len(order)})" if len(order) > max_prompts else ""
    return apply_layout(
        fig,
        f"pass rate of each drawn prompt{more}",
        yaxis="prompt (in order first drawn)",
        height=max(340, 12 * len(rows) + 120),
    )


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _diagnostic_starts(run: RunData) -> list[tuple[int, str]]:
    """Where each diagnostic started: the same verdicts as `posttrain diagnose` (replayed from the records)."""
    from posttrain.obs.diagnose_run import run_config
    from posttrain.obs.diagnostics import Diagnostics

    try:
        d = Diagnostics(run_config(run.run_dir).model_copy(update={"enabled": True}))
        return [(e.step, e.name) for e in d.replay(run.records) if e.state == "start"]
    except Exception:  # noqa: BLE001 - a config from another version must not cost the whole report
        return []


def fig_timing(run: RunData):
    """Seconds per step: the trainer's stages stacked; overlapping times (async busy, transports) as lines."""
    go, _ = load_plotly()
    fig = go.Figure()
    for st in STAGES:
        x, y = run.series(f"time/{st}")
        if x:
            fig.add_trace(go.Bar(x=x, y=y, name=st))
    for k in run.keys("time/"):
        if k.removeprefix("time/") not in STAGES:
            x, y = run.series(k)
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    name=k.removeprefix("time/"),
                    mode="lines+markers",
                    line={"dash": "dot"} if k != "time/step" else None,
                )
            )
    if not fig.data:
        return None
    fig.update_layout(barmode="stack")
    return apply_layout(fig, "time per step, by stage", yaxis="seconds")


def fig_async(run: RunData):
    keys = [k for k in run.keys("async/") if not k.endswith("_s")] + list(run.keys("sync/"))
    fig = fig_lines(run, "async: staleness and idle fractions", keys)
    secs = [k for k in run.keys("async/") if k.endswith("_s")]
    if fig is not None and secs:
        go, _ = load_plotly()
        for k in secs:  # seconds on a second axis: fractions and seconds do not share a scale
            x, y = run.series(k)
            fig.add_trace(go.Scatter(x=x, y=y, name=k, yaxis="y2", mode="lines+markers", line={"dash": "dot"}))
        fig.update_layout(yaxis2={"title": "seconds", "overlaying": "y", "side": "right"})
    return fig


def fig_explorer(run: RunData):
    """Any numeric train metric, picked from a dropdown (plotly's updatemenus: one trace visible at a time)."""
    go, _ = load_plotly()
    keys = run.keys("")
    keys = [k for k in keys if k != "step"]
    if not keys:
        return None
    first = "train/loss" if "train/loss" in keys else keys[0]
    fig = go.Figure()
    for k in keys:
        x, y = run.series(k)
        fig.add_trace(go.Scatter(x=x, y=y, name=k, mode="lines+markers", visible=k == first))
    buttons = [
        {"label": k, "method": "update", "args": [{"visible": [j == i for j in range(len(keys))]}, {"title": k}]}
        for i, k in enumerate(keys)
    ]
    fig.update_layout(
        updatemenus=[
            {
                "buttons": buttons,
                "active": keys.index(first),
                "x": 1.0,
                "xanchor": "right",
                "y": 1.18,
                "direction": "down",
            }
        ],
        showlegend=False,
    )
    return apply_layout(fig, first)


def fig_reliability(run: RunData):
    """Reliability diagram of the first and last held-out evals that logged decision bins (decision-routing):
    accuracy against stated confidence per bin, marker size by count; the diagonal is perfect calibration."""
    from posttrain.rewards.calibration import bins_from_sums, ece_from_bins

    evals = [r for r in run.evals if any(k.startswith("eval/decision/rel/") for k in r)]
    if not evals:
        return None
    go, _ = load_plotly()
    fig = go.Figure(
        [go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="calibrated", line={"dash": "dot", "color": "grey"})]
    )
    for label, rec in (("first eval", evals[0]), ("last eval", evals[-1]))[: 1 if len(evals) == 1 else 2]:
        bins = [b for b in bins_from_sums(rec, "eval/decision/rel/") if b.count]
        total = sum(b.count for b in bins) or 1
        fig.add_trace(
            go.Scatter(
                x=[b.conf_mean for b in bins],
                y=[b.accuracy for b in bins],
                mode="lines+markers",
                name=f"{label} (step {rec.get('step')}, ECE {ece_from_bins(bins):.3f})",
                marker={"size": [6 + 24 * b.count / total for b in bins]},
                text=[f"n={b.count}" for b in bins],
            )
        )
    fig = apply_layout(fig, "reliability: held-out accuracy vs stated confidence", xaxis="confidence", yaxis="accuracy")
    fig.update_xaxes(range=[0, 1])
    fig.update_yaxes(range=[0, 1])
    return fig


def fig_timeline(run: RunData):
    """trace.jsonl as horizontal bars: one lane per worker, one colour per stage, seconds since the first span."""
    go, _ = load_plotly()
    if not run.trace:
        return None
    t0 = min(e["ts"] for e in run.trace)
    lanes = sorted({e.get("worker", "main") for e in run.trace}, key=lane_order)
    fig = go.Figure()
    for name in sorted({e["name"] for e in run.trace}):
        ev = [e for e in run.trace if e["name"] == name]
        fig.add_trace(
            go.Bar(
                y=[e.get("worker", "main") for e in ev],
                x=[e["dur"] for e in ev],
                base=[e["ts"] - t0 for e in ev],
                orientation="h",
                name=name,
                marker_color=STAGE_COLOURS.get(name),
                customdata=[[e["ts"] - t0, json.dumps(e.get("args") or {})] for e in ev],
                hovertemplate=f"<b>{name}</b> on %{{y}}<br>start %{{customdata[0]:.2f}}s, %{{x:.3f}}s<br>"
                "%{customdata[1]}<extra></extra>",
            )
        )
    fig.update_layout(barmode="overlay", yaxis={"categoryorder": "array", "categoryarray": lanes[::-1]})
    return apply_layout(
        fig,
        "timeline: where each worker spent its time",
        xaxis="seconds since the first span",
        height=max(260, 60 + 28 * len(lanes)),
    )


def figure_div(fig, div_id: str) -> str:
    """`fig` as an HTML div without the library (the page inlines plotly once), or '' for no figure."""
    if fig is None:
        return ""
    return fig.to_html(
        full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False, "responsive": True}
    )
