"""`posttrain report RUN_DIR`: one self-contained HTML page of a run (plotly's JS inlined, so it opens offline).

    RunData.load(run_dir)           metrics.jsonl, samples.jsonl, trace.jsonl, summary.json, whatever exists
    write_html_report(run_dir)      curves, eval before/after, timing, staleness/sync, the timeline, the rollout viewer
    write_compare([a, b, ...], out) the runs' curves overlaid
    write_chrome_trace(run_dir, out) trace.jsonl as Chrome/Perfetto trace JSON (obs/trace.py)

A crashed or still-running run gives a partial page that says what is missing; only a path that is not a run
directory at all is an error (ReportError). The page's layout, styles and the rollout viewer's script are
templates/report.html; the charts are plotly figures.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from posttrain.obs.trace import lane_order, read_trace, to_chrome_trace

# The trainer's per-step stages, stacked in the timing chart (time/<stage>); other time/* keys overlap them
# (async busy times, the weight-sync transport's own timing) and are drawn as lines.
STAGES = ["sample", "reward", "token_stats", "train", "sync", "perturb"]
# Curves overlaid by --compare, when a run has them.
COMPARE_KEYS = ["reward/mean", "pass_rate", "eval/pass_rate", "completion/len_mean", "train/loss",
                "train/sampler_kl_k3", "time/step"]
# Timeline colours: work in strong colours, waiting in greys, so idle time reads as idle at a glance.
STAGE_COLOURS = {"sample": "#2a9d8f", "reward": "#e9c46a", "token_stats": "#f4a261", "train": "#1f5fbf",
                 "sync": "#9b5de5", "eval": "#264653", "perturb": "#e76f51",
                 "wait_rollouts": "#c8c8c8", "wait_weights": "#e4e4e4"}
MAX_VIEWER_STEPS = 200  # steps of samples embedded in the page (evenly spaced beyond that: the file stays small)


class ReportError(ValueError):
    """Bad input to the report (not a run directory, a missing run in --compare): a clear message, no traceback."""


@dataclass
class RunData:
    run_dir: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)  # what is missing, shown at the top of the page

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def train(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == "train"]

    @property
    def evals(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == "eval"]

    @classmethod
    def load(cls, run_dir: str | Path) -> "RunData":
        d = Path(run_dir)
        if not d.is_dir():
            raise ReportError(f"run directory not found: {d}")
        known = ["config.yaml", "metrics.jsonl", "samples.jsonl", "trace.jsonl", "summary.json"]
        if not any((d / f).exists() for f in known):
            raise ReportError(f"{d} is not a run directory (none of {', '.join(known)} in it)")
        run = cls(d, _jsonl(d / "metrics.jsonl"), _jsonl(d / "samples.jsonl"), read_trace(d))
        if (d / "summary.json").exists():
            try:
                run.summary = json.loads((d / "summary.json").read_text())
            except json.JSONDecodeError:
                run.notes.append("summary.json is not valid JSON")
        if not run.train:
            run.notes.append("no train steps in metrics.jsonl yet: the run crashed or stopped before step 1, "
                             "or is still starting")
        elif run.summary is None:
            run.notes.append(f"no summary.json: the run is still going or stopped early (last step "
                             f"{run.train[-1].get('step')})")
        if not run.trace:
            run.notes.append("no trace.jsonl: no timeline (runs from before tracing existed have none)")
        return run

    def series(self, key: str, records: list[dict[str, Any]] | None = None) -> tuple[list[int], list[float]]:
        """(steps, values) of key over the records that have it as a number ("nan" strings read as gaps)."""
        xs, ys = [], []
        for r in self.train if records is None else records:
            if key in r:
                xs.append(r.get("step", 0))
                ys.append(_num(r[key]))
        return xs, ys

    def keys(self, prefix: str, records: list[dict[str, Any]] | None = None) -> list[str]:
        recs = self.train if records is None else records
        return sorted({k for r in recs for k, v in r.items() if k.startswith(prefix) and _is_num(v)})


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # a half-written last line of a crashed or running run
            continue
        if isinstance(r, dict):
            out.append(r)
    return out


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ---- figures -----------------------------------------------------------------------------------------------

def _plotly():
    try:
        import plotly.graph_objects as go
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise ReportError("posttrain report needs plotly: pip install 'posttrain[report]'") from None
    return go, get_plotlyjs


def _layout(fig, title: str, xaxis: str = "step", yaxis: str = "", height: int = 340) -> Any:
    fig.update_layout(title=title, height=height, margin=dict(l=50, r=20, t=50, b=40), template="plotly_white",
                      legend=dict(font=dict(size=10)), xaxis_title=xaxis, yaxis_title=yaxis)
    return fig


def fig_lines(run: RunData, title: str, keys: list[str], records=None, yaxis: str = "", mode: str = "lines+markers"):
    go, _ = _plotly()
    fig = go.Figure()
    for k in keys:
        x, y = run.series(k, records)
        if x:
            fig.add_trace(go.Scatter(x=x, y=y, name=k, mode=mode))
    return _layout(fig, title, yaxis=yaxis) if fig.data else None


def fig_reward(run: RunData):
    """Mean reward with a one-std band, each rubric component, and where a diagnostic started."""
    go, _ = _plotly()
    comps = [k for k in run.keys("reward/") if k not in ("reward/mean", "reward/std")]
    fig = fig_lines(run, "train reward and its components", ["reward/mean", *comps])
    if fig is None:
        return None
    x, m = run.series("reward/mean")
    _, s = run.series("reward/std")
    if len(s) == len(m) and all(v is not None for v in m + s):
        fig.add_trace(go.Scatter(x=x + x[::-1], y=[a + b for a, b in zip(m, s)] + [a - b for a, b in zip(m, s)][::-1],
                                 fill="toself", line=dict(width=0), opacity=0.2, name="reward ± std",
                                 hoverinfo="skip"))
    for step, name in _diagnostic_starts(run):
        fig.add_vline(x=step, line_dash="dash", line_color="crimson", opacity=0.6,
                      annotation_text=name, annotation_font_size=9)
    return fig


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
    go, _ = _plotly()
    fig = go.Figure()
    for st in STAGES:
        x, y = run.series(f"time/{st}")
        if x:
            fig.add_trace(go.Bar(x=x, y=y, name=st))
    for k in run.keys("time/"):
        if k.removeprefix("time/") not in STAGES:
            x, y = run.series(k)
            fig.add_trace(go.Scatter(x=x, y=y, name=k.removeprefix("time/"), mode="lines+markers",
                                     line=dict(dash="dot") if k != "time/step" else None))
    if not fig.data:
        return None
    fig.update_layout(barmode="stack")
    return _layout(fig, "time per step, by stage", yaxis="seconds")


def fig_async(run: RunData):
    keys = [k for k in run.keys("async/") if not k.endswith("_s")] + [k for k in run.keys("sync/")]
    fig = fig_lines(run, "async: staleness and idle fractions", keys)
    secs = [k for k in run.keys("async/") if k.endswith("_s")]
    if fig is not None and secs:
        go, _ = _plotly()
        for k in secs:  # seconds on a second axis: fractions and seconds do not share a scale
            x, y = run.series(k)
            fig.add_trace(go.Scatter(x=x, y=y, name=k, yaxis="y2", mode="lines+markers", line=dict(dash="dot")))
        fig.update_layout(yaxis2=dict(title="seconds", overlaying="y", side="right"))
    return fig


def fig_explorer(run: RunData):
    """Any numeric train metric, picked from a dropdown (plotly's updatemenus: one trace visible at a time)."""
    go, _ = _plotly()
    keys = run.keys("")
    keys = [k for k in keys if k != "step"]
    if not keys:
        return None
    first = "train/loss" if "train/loss" in keys else keys[0]
    fig = go.Figure()
    for k in keys:
        x, y = run.series(k)
        fig.add_trace(go.Scatter(x=x, y=y, name=k, mode="lines+markers", visible=k == first))
    buttons = [dict(label=k, method="update", args=[{"visible": [j == i for j in range(len(keys))]}, {"title": k}])
               for i, k in enumerate(keys)]
    fig.update_layout(updatemenus=[dict(buttons=buttons, active=keys.index(first), x=1.0, xanchor="right", y=1.18,
                                        direction="down")], showlegend=False)
    return _layout(fig, first)


def fig_reliability(run: RunData):
    """Reliability diagram of the first and last held-out evals that logged decision bins (decision-routing):
    accuracy against stated confidence per bin, marker size by count; the diagonal is perfect calibration."""
    from posttrain.rewards.calibration import bins_from_sums, ece_from_bins

    evals = [r for r in run.evals if any(k.startswith("eval/decision/rel/") for k in r)]
    if not evals:
        return None
    go, _ = _plotly()
    fig = go.Figure([go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="calibrated", line=dict(dash="dot", color="grey"))])
    for label, rec in (("first eval", evals[0]), ("last eval", evals[-1]))[: 1 if len(evals) == 1 else 2]:
        bins = [b for b in bins_from_sums(rec, "eval/decision/rel/") if b.count]
        total = sum(b.count for b in bins) or 1
        fig.add_trace(go.Scatter(x=[b.conf_mean for b in bins], y=[b.accuracy for b in bins], mode="lines+markers",
                                 name=f"{label} (step {rec.get('step')}, ECE {ece_from_bins(bins):.3f})",
                                 marker=dict(size=[6 + 24 * b.count / total for b in bins]),
                                 text=[f"n={b.count}" for b in bins]))
    fig = _layout(fig, "reliability: held-out accuracy vs stated confidence", xaxis="confidence", yaxis="accuracy")
    fig.update_xaxes(range=[0, 1])
    fig.update_yaxes(range=[0, 1])
    return fig


def fig_timeline(run: RunData):
    """trace.jsonl as horizontal bars: one lane per worker, one colour per stage, seconds since the first span."""
    go, _ = _plotly()
    if not run.trace:
        return None
    t0 = min(e["ts"] for e in run.trace)
    lanes = sorted({e.get("worker", "main") for e in run.trace}, key=lane_order)
    fig = go.Figure()
    for name in sorted({e["name"] for e in run.trace}):
        ev = [e for e in run.trace if e["name"] == name]
        fig.add_trace(go.Bar(
            y=[e.get("worker", "main") for e in ev], x=[e["dur"] for e in ev], base=[e["ts"] - t0 for e in ev],
            orientation="h", name=name, marker_color=STAGE_COLOURS.get(name),
            customdata=[[e["ts"] - t0, json.dumps(e.get("args") or {})] for e in ev],
            hovertemplate=f"<b>{name}</b> on %{{y}}<br>start %{{customdata[0]:.2f}}s, %{{x:.3f}}s<br>"
                          "%{customdata[1]}<extra></extra>"))
    fig.update_layout(barmode="overlay", yaxis=dict(categoryorder="array", categoryarray=lanes[::-1]))
    return _layout(fig, "timeline: where each worker spent its time", xaxis="seconds since the first span",
                   height=max(260, 60 + 28 * len(lanes)))


# ---- the page ----------------------------------------------------------------------------------------------

def _template() -> str:
    return resources.files("posttrain.obs").joinpath("templates/report.html").read_text()


def _div(fig, div_id: str) -> str:
    if fig is None:
        return ""
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def _section(title: str, body: str, sid: str) -> str:
    return f'<section id="{sid}"><h2>{html.escape(title)}</h2>{body}</section>' if body else ""


def _eval_table(run: RunData) -> str:
    """Held-out metrics before (first eval) and after (last eval), with the change."""
    ev = run.evals
    if not ev:
        return ""
    first, last = ev[0], ev[-1]
    keys = sorted({k for k in first if k.startswith("eval/pass") or k == "eval/reward/mean"} & set(last))
    rows = []
    for k in keys:
        a, b = _num(first[k]), _num(last[k])
        if a is None or b is None:
            continue
        pct = k != "eval/reward/mean"
        fmt = (lambda v: f"{v * 100:.1f}%") if pct else (lambda v: f"{v:.3f}")
        d = f"{(b - a) * 100:+.1f} pts" if pct else f"{b - a:+.3f}"
        rows.append(f"<tr><td>{html.escape(k.removeprefix('eval/'))}</td><td>{fmt(a)}</td><td>{fmt(b)}</td>"
                    f"<td>{d}</td></tr>")
    head = (f"<tr><th>metric</th><th>step {first.get('step')}</th><th>step {last.get('step')}</th>"
            "<th>change</th></tr>")
    return f'<table class="evaltable">{head}{"".join(rows)}</table>'


def _viewer_data(run: RunData) -> list[dict[str, Any]]:
    """samples.jsonl grouped into pages: one per train step and one per eval, in step order."""
    pages: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for s in run.samples:
        pages.setdefault((int(s.get("step", 0)), bool(s.get("eval"))), []).append(s)
    keys = sorted(pages, key=lambda k: (k[0], not k[1]))
    train_keys = [k for k in keys if not k[1]]
    if len(train_keys) > MAX_VIEWER_STEPS:
        stride = len(train_keys) / MAX_VIEWER_STEPS
        keep = {train_keys[int(i * stride)] for i in range(MAX_VIEWER_STEPS)} | {train_keys[-1]}
        keys = [k for k in keys if k[1] or k in keep]
    return [{"step": k[0], "eval": k[1], "samples": pages[k]} for k in keys]


def _page(title: str, notes: list[str], content: str, data: Any) -> str:
    _, get_plotlyjs = _plotly()
    blob = json.dumps(data, default=str).replace("</", "<\\/")  # never close the <script> early
    note_html = "".join(f'<div class="note">{html.escape(n)}</div>' for n in notes)
    page = _template()
    for k, v in (("{{TITLE}}", html.escape(title)), ("{{NOTES}}", note_html), ("{{CONTENT}}", content),
                 ("{{DATA}}", blob)):
        page = page.replace(k, v)
    return page.replace("{{PLOTLYJS}}", get_plotlyjs())  # last: the library's text is never searched for tokens


def render_report(run: RunData) -> str:
    figs = [("reward", fig_reward(run)),
            ("pass", fig_lines(run, "train pass rates", ["pass_rate", *run.keys("pass/")])),
            ("eval", fig_lines(run, "held-out pass rates", ["eval/pass_rate", *run.keys("eval/pass/", run.evals)],
                               records=run.evals))]
    curves = "".join(_div(f, f"fig-{i}") for i, f in figs)
    content = _section("Curves", curves, "curves")
    content += _section("Held-out before / after", _eval_table(run), "evals")
    reliability = fig_reliability(run)
    if reliability is not None:  # only runs that logged decision bins (decision-routing)
        content += _section("Calibration", _div(reliability, "fig-reliability"), "calibration")
    content += _section("Time per stage", _div(fig_timing(run), "fig-timing"), "timing")
    content += _section("Staleness and sync", _div(fig_async(run), "fig-async"), "async")
    content += _section("Timeline", _div(fig_timeline(run), "fig-timeline") + (
        '<p class="hint">Export for chrome://tracing or ui.perfetto.dev: '
        f'<code>posttrain report {html.escape(str(run.run_dir))} --trace trace.json</code></p>'
        if run.trace else ""), "timeline")
    tags = [k for k in run.keys("rised/") if k not in ("rised/tag_errors", "rised/selection_overlap")]
    if tags:  # RISED: which behaviours rise and fall over the run (loop/profiles.py)
        content += _section("Behaviour profile", _div(fig_lines(run, "share of rollouts with each tag", tags,
                                                                yaxis="share"), "fig-profile"), "profile")
    content += _section("Any metric", _div(fig_explorer(run), "fig-explorer"), "explorer")
    viewer = _viewer_data(run)
    if viewer:
        content += ('<section id="rollouts"><h2>Rollouts</h2><div id="viewer"></div></section>')
    if not content:
        content = '<p class="note">Nothing to show yet.</p>'
    return _page(f"posttrain report: {run.name}", run.notes, content, {"viewer": viewer, "run": run.name})


def write_html_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    run = RunData.load(run_dir)
    path = Path(out) if out else run.run_dir / "report.html"
    path.write_text(render_report(run))
    return path


def write_compare(run_dirs: list[str | Path], out: str | Path) -> Path:
    """The runs' main curves overlaid, one colour per run."""
    if len(run_dirs) < 2:
        raise ReportError("--compare needs at least two run directories")
    missing = [str(d) for d in run_dirs if not Path(d).is_dir()]
    if missing:
        raise ReportError(f"run directory not found: {', '.join(missing)}")
    runs = [RunData.load(d) for d in run_dirs]
    go, _ = _plotly()
    content, notes = "", [f"{r.name}: {n}" for r in runs for n in r.notes if "trace" not in n]
    for i, key in enumerate(COMPARE_KEYS):
        fig = go.Figure()
        for r in runs:
            x, y = r.series(key, r.evals if key.startswith("eval/") else None)
            if x:
                fig.add_trace(go.Scatter(x=x, y=y, name=r.name, mode="lines+markers"))
        if fig.data:
            content += _div(_layout(fig, key), f"fig-cmp-{i}")
    title = "posttrain compare: " + " vs ".join(r.name for r in runs)
    path = Path(out)
    path.write_text(_page(title, notes, _section("Curves", content, "curves"), {"viewer": [], "run": title}))
    return path


def write_chrome_trace(run_dir: str | Path, out: str | Path) -> Path:
    run = RunData.load(run_dir)
    if not run.trace:
        raise ReportError(f"no trace events in {run.run_dir}/trace.jsonl (runs from before tracing have none)")
    path = Path(out)
    path.write_text(json.dumps(to_chrome_trace(run.trace)))
    return path
