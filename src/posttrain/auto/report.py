"""SEARCH_DIR/report.html: the whole search in one self-contained page (plotly inlined, as obs/html_report.py; charts:
obs/report_figs.py).

The metric per trial (each seed's value, kept / reverted / failed, the incumbent so far), the metric against each
searched parameter, Optuna's parameter importance (when the study has enough completed trials), and the trials
table from results.tsv.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from posttrain.obs.report_figs import apply_layout, figure_div, load_plotly

COLOURS = {"baseline": "#264653", "kept": "#17803d", "reverted": "#8d99ae", "failed": "#b3261e", "pruned": "#e9c46a"}

PAGE = """<!DOCTYPE html>
<!-- posttrain auto report (auto/report.py): self-contained; plotly's JS is inlined, nothing is fetched. -->
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
 body {{ font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 0 20px 40px; color: #222; }}
 h1 {{ font-size: 22px; }} h2 {{ font-size: 17px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }}
 .note {{ background: #fff6d6; border: 1px solid #e8d48a; padding: 6px 10px; margin: 6px 0; font-size: 13px; }}
 table {{ border-collapse: collapse; font-size: 12px; }} td, th {{ border: 1px solid #ddd; padding: 3px 6px; }}
 td.reason {{ max-width: 420px; }} code {{ font-size: 12px; }}
</style><script>{plotlyjs}</script></head><body>
<h1>{title}</h1>
<p>{goal}</p>
{notes}{content}
</body></html>
"""


def _num(s: str) -> float | None:
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def importance(search_dir: Path) -> tuple[dict[str, float], str]:
    """Optuna's parameter importance of the study in SEARCH_DIR/optuna.db, or ({}, why not)."""
    db = search_dir / "optuna.db"
    if not db.exists():
        return {}, "no optuna.db: no parameter importance"
    try:
        import optuna

        from posttrain.auto.proposers import STUDY

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db.resolve()}")
        done = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
        if len(done) < 3:
            return {}, f"parameter importance needs 3 completed trials or more ({len(done)} so far)"
        return dict(optuna.importance.get_param_importances(study)), ""
    except Exception as e:  # noqa: BLE001 - importance is a nicety; the page is written without it
        return {}, f"no parameter importance: {type(e).__name__}: {e}"


def write_search_report(search_dir: str | Path, out: str | Path | None = None) -> Path:
    from posttrain.auto.program import load_program
    from posttrain.auto.results import read_results

    d = Path(search_dir)
    rows = read_results(d)
    base = d / "base.yaml"
    prog = load_program(d / "program.md", base if base.exists() else None)
    go, get_plotlyjs = load_plotly()
    notes: list[str] = []
    content = ""

    # metric per trial: each seed's value, coloured by the decision; the incumbent so far as a step line
    fig = go.Figure()
    for dec, colour in COLOURS.items():
        xs, ys, text = [], [], []
        for r in rows:
            if r["decision"] != dec:
                continue
            vals = json.loads(r["values"] or "[]") or [None]
            for v in vals:
                xs.append(int(r["trial"]))
                ys.append(v if v is not None else None)
                text.append(f"{r['diff']}<br>{html.escape(r['reason'][:160])}")
        if xs:
            fail = dec in ("failed", "pruned")
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=[y if y is not None else _floor(rows) for y in ys],
                    mode="markers",
                    name=dec,
                    text=text,
                    marker={"color": colour, "size": 10, "symbol": "x" if fail else "circle"},
                    hovertemplate="trial %{x}: %{y:.4g}<br>%{text}<extra></extra>",
                )
            )
    inc_x, inc_y, best = [], [], None
    for r in rows:
        if r["decision"] in ("baseline", "kept") and _num(r["metric"]) is not None:
            best = _num(r["metric"])
        if best is not None:
            inc_x.append(int(r["trial"]))
            inc_y.append(best)
    if inc_x:
        fig.add_trace(
            go.Scatter(
                x=inc_x,
                y=inc_y,
                mode="lines",
                line={"shape": "hv", "color": "#1f5fbf"},
                name="incumbent (mean over seeds)",
            )
        )
    if fig.data:
        content += _section(
            "Metric per trial",
            figure_div(
                apply_layout(fig, f"{prog.metric} per trial ({prog.direction})", xaxis="trial", yaxis=prog.metric),
                "fig-trials",
            )
            + '<p class="note">failed and pruned trials are drawn as x at the bottom</p>',
        )

    # metric against each searched parameter
    for i, (k, p) in enumerate(prog.search.items()):
        xs, ys = [], []
        for r in rows:
            m = _num(r["metric"])
            params = json.loads(r["params"] or "{}")
            if m is not None and k in params:
                xs.append(params[k])
                ys.append(m)
        if xs:
            f = go.Figure(go.Scatter(x=xs, y=ys, mode="markers", name=k))
            apply_layout(f, f"{prog.metric} vs {k}", xaxis=k, yaxis=prog.metric, height=300)
            if p.log:
                f.update_xaxes(type="log")
            content += figure_div(f, f"fig-param-{i}")
    imp, why = importance(d)
    if imp:
        f = go.Figure(go.Bar(x=list(imp.values())[::-1], y=list(imp)[::-1], orientation="h"))
        content += _section(
            "Parameter importance (Optuna, fANOVA)",
            figure_div(apply_layout(f, "importance", xaxis="share", height=120 + 40 * len(imp)), "fig-imp"),
            "importance",
        )
    elif why:
        notes.append(why)
    content += _section("Trials (results.tsv)", _table(rows), "trials")
    state_p = d / "search_state.json"
    if state_p.exists():
        st = json.loads(state_p.read_text())
        inc = st.get("incumbent") or {}
        if inc:
            notes.insert(
                0,
                f"incumbent: trial {inc.get('trial')} on seeds {inc.get('seeds')}: "
                f"{prog.metric} {inc.get('values')}; stopped: {st.get('stopped') or 'still running'}",
            )
    page = PAGE.format(
        title=html.escape(f"posttrain auto: {d.name}"),
        goal=html.escape(prog.goal),
        notes="".join(f'<div class="note">{html.escape(n)}</div>' for n in notes),
        content=content,
        plotlyjs="{{PLOTLYJS}}",
    )
    path = Path(out) if out else d / "report.html"
    path.write_text(page.replace("{{PLOTLYJS}}", get_plotlyjs()))
    return path


def _floor(rows: list[dict[str, Any]]) -> float:
    vals = [v for r in rows if (v := _num(r["metric"])) is not None]
    return min(vals) if vals else 0.0


def _section(title: str, body: str, sid: str = "") -> str:
    return f'<section id="{sid}"><h2>{html.escape(title)}</h2>{body}</section>' if body else ""


def _table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return ""
    cols = ["trial", "status", "decision", "metric", "values", "seeds", "diff", "reason", "proposer", "wall_s"]
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f'<td class="{c}">{html.escape(r.get(c, ""))}</td>' for c in cols) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"
