"""`posttrain report RUN_DIR`: one self-contained HTML page of a run (plotly's JS inlined, so it opens offline).

    RunData.load(run_dir)           metrics.jsonl, samples.jsonl, trace.jsonl, summary.json, whatever exists
    write_html_report(run_dir)      curves, eval before/after, timing, staleness/sync, the timeline, the rollout viewer
    write_compare([a, b, ...], out) the runs' curves overlaid
    write_chrome_trace(run_dir, out) trace.jsonl as Chrome/Perfetto trace JSON (obs/trace.py)

A crashed or still-running run gives a partial page that says what is missing; only a path that is not a run
directory at all is an error (ReportError). The page's layout, styles and the rollout viewer's script are
templates/report.html; the charts are plotly figures (obs/report_figs.py).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from posttrain.obs.report_figs import (
    apply_layout,
    fig_async,
    fig_curriculum,
    fig_explorer,
    fig_lines,
    fig_reliability,
    fig_reward,
    fig_timeline,
    fig_timing,
    figure_div,
    load_plotly,
)
from posttrain.obs.run_data import ReportError, RunData, finite_float
from posttrain.obs.trace import to_chrome_trace

__all__ = [
    "ReportError",
    "RunData",
    "fig_reliability",
    "render_report",
    "write_chrome_trace",
    "write_compare",
    "write_html_report",
]

# Curves overlaid by --compare, when a run has them.
COMPARE_KEYS = [
    "reward/mean",
    "pass_rate",
    "eval/pass_rate",
    "completion/len_mean",
    "train/loss",
    "train/sampler_kl_k3",
    "time/step",
]
MAX_VIEWER_STEPS = 200  # steps of samples embedded in the page (evenly spaced beyond that: the file stays small)


def _template() -> str:
    return resources.files("posttrain.obs").joinpath("templates/report.html").read_text()


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
        a, b = finite_float(first[k]), finite_float(last[k])
        if a is None or b is None:
            continue
        pct = k != "eval/reward/mean"
        fmt = (lambda v: f"{v * 100:.1f}%") if pct else (lambda v: f"{v:.3f}")
        d = f"{(b - a) * 100:+.1f} pts" if pct else f"{b - a:+.3f}"
        rows.append(
            f"<tr><td>{html.escape(k.removeprefix('eval/'))}</td><td>{fmt(a)}</td><td>{fmt(b)}</td><td>{d}</td></tr>"
        )
    head = f"<tr><th>metric</th><th>step {first.get('step')}</th><th>step {last.get('step')}</th><th>change</th></tr>"
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
    _, get_plotlyjs = load_plotly()
    blob = json.dumps(data, default=str).replace("</", "<\\/")  # never close the <script> early
    note_html = "".join(f'<div class="note">{html.escape(n)}</div>' for n in notes)
    page = _template()
    for k, v in (
        ("{{TITLE}}", html.escape(title)),
        ("{{NOTES}}", note_html),
        ("{{CONTENT}}", content),
        ("{{DATA}}", blob),
    ):
        page = page.replace(k, v)
    return page.replace("{{PLOTLYJS}}", get_plotlyjs())  # last: the library's text is never searched for tokens


def render_report(run: RunData) -> str:
    figs = [
        ("reward", fig_reward(run)),
        ("pass", fig_lines(run, "train pass rates", ["pass_rate", *run.keys("pass/")])),
        (
            "eval",
            fig_lines(
                run, "held-out pass rates", ["eval/pass_rate", *run.keys("eval/pass/", run.evals)], records=run.evals
            ),
        ),
    ]
    curves = "".join(figure_div(f, f"fig-{i}") for i, f in figs)
    content = _section("Curves", curves, "curves")
    content += _section("Held-out before / after", _eval_table(run), "evals")
    reliability = fig_reliability(run)
    if reliability is not None:  # only runs that logged decision bins (decision-routing)
        content += _section("Calibration", figure_div(reliability, "fig-reliability"), "calibration")
    content += _section("Time per stage", figure_div(fig_timing(run), "fig-timing"), "timing")
    content += _section("Staleness and sync", figure_div(fig_async(run), "fig-async"), "async")
    content += _section(
        "Timeline",
        figure_div(fig_timeline(run), "fig-timeline")
        + (
            '<p class="hint">Export for chrome://tracing or ui.perfetto.dev: '
            f"<code>posttrain report {html.escape(str(run.run_dir))} --trace trace.json</code></p>"
            if run.trace
            else ""
        ),
        "timeline",
    )
    curriculum = fig_curriculum(run)
    if curriculum is not None:  # adaptive prompt selection (algos/prompt_selection.py)
        content += _section("Curriculum", figure_div(curriculum, "fig-curriculum"), "curriculum")
    tags = [k for k in run.keys("rised/") if k not in ("rised/tag_errors", "rised/selection_overlap")]
    if tags:  # RISED: which behaviours rise and fall over the run (guidance/profiles.py)
        content += _section(
            "Behaviour profile",
            figure_div(fig_lines(run, "share of rollouts with each tag", tags, yaxis="share"), "fig-profile"),
            "profile",
        )
    content += _section("Any metric", figure_div(fig_explorer(run), "fig-explorer"), "explorer")
    viewer = _viewer_data(run)
    if viewer:
        content += '<section id="rollouts"><h2>Rollouts</h2><div id="viewer"></div></section>'
    if not content:
        content = '<p class="note">Nothing to show yet.</p>'
    return _page(f"posttrain report: {run.name}", run.notes, content, {"viewer": viewer, "run": run.name})


def write_html_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    run = RunData.load(run_dir)
    path = Path(out) if out else run.run_dir / "report.html"
    path.write_text(render_report(run))
    return path


def write_compare(run_dirs: Sequence[str | Path], out: str | Path) -> Path:
    """The runs' main curves overlaid, one colour per run."""
    if len(run_dirs) < 2:
        raise ReportError("--compare needs at least two run directories")
    missing = [str(d) for d in run_dirs if not Path(d).is_dir()]
    if missing:
        raise ReportError(f"run directory not found: {', '.join(missing)}")
    runs = [RunData.load(d) for d in run_dirs]
    go, _ = load_plotly()
    content, notes = "", [f"{r.name}: {n}" for r in runs for n in r.notes if "trace" not in n]
    for i, key in enumerate(COMPARE_KEYS):
        fig = go.Figure()
        for r in runs:
            x, y = r.series(key, r.evals if key.startswith("eval/") else None)
            if x:
                fig.add_trace(go.Scatter(x=x, y=y, name=r.name, mode="lines+markers"))
        if fig.data:
            content += figure_div(apply_layout(fig, key), f"fig-cmp-{i}")
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
