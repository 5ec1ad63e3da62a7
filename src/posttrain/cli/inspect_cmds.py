"""Commands that read models and runs: `eval`, `report`, `diagnose`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posttrain.cli.app import _fail, app


@app.command("eval")
def eval_cmd(
    model: str = typer.Option("default", "--model", help="'default', 'tiny-random', a HF folder, a run's final/ folder"),
    task: str = typer.Option("json-extract", "--task"),
    prompts: int = typer.Option(48, "--prompts", help="held-out prompts to evaluate"),
    temperature: float = typer.Option(0.0, "--temperature"),
    samples: int = typer.Option(1, "--samples", help="completions per prompt (needs --temperature > 0)"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens"),
    option: list[str] = typer.Option([], "--option", "-o", help="a task option KEY=VALUE (repeatable), as "
                                     "task.options.KEY=VALUE in train, e.g. -o rho=0.5 -o mode=reset_free"),
) -> None:
    """Pass rates of a model or a trained run on a task's held-out prompts."""
    from posttrain.config import ConfigError, load_config
    from posttrain.envs.task import TaskLoadError
    from posttrain.loop.components import build
    from posttrain.loop.evaluate import evaluate
    from posttrain.models.load import ModelLoadError
    from posttrain.obs import console as con

    overrides = [f"model.name={model}", f"task.name={task}", f"sampling.eval_temperature={temperature}",
                 f"loop.eval_prompts={prompts}", f"loop.eval_samples={samples}"]
    if max_tokens:
        overrides.append(f"sampling.max_tokens={max_tokens}")
    for o in option:
        key, eq, value = o.partition("=")
        if not eq or not key.strip():
            _fail(f"--option takes KEY=VALUE (a task option), got {o!r}")
        overrides.append(f"task.options.{key.strip()}={value}")
    from posttrain.rewards.embedding import EmbeddingError
    from posttrain.rewards.reward_model import RewardModelError

    try:
        cfg = load_config(None, overrides)
        c = build(cfg, log=lambda s: typer.echo(s, err=True))
    except (ConfigError, TaskLoadError, ModelLoadError, FileNotFoundError, RewardModelError, EmbeddingError) as e:
        _fail(str(e))
    m, _ = evaluate(c.env, c.sampler, c.task.eval_rows[:prompts], c.eval_params, samples,
                    progress=lambda s: typer.echo(s, err=True))
    m["eval/reward"] = m["eval/reward/mean"]
    con.console.print(con.eval_table(f"{model} on {task} ({min(prompts, len(c.task.eval_rows))} held-out prompts)",
                                     [(Path(model).name or model, m)]))


@app.command()
def report(run_dirs: list[Path] = typer.Argument(..., help="a run directory (several with --compare)"),
           out: Optional[Path] = typer.Option(None, "--out", help="output path (default RUN_DIR/report.html; "
                                              "--compare: compare.html); a .png path writes the PNG summary"),
           compare: bool = typer.Option(False, "--compare", help="overlay the curves of several runs in one page"),
           trace: Optional[Path] = typer.Option(None, "--trace", help="also export the timeline as Chrome/Perfetto "
                                                "trace JSON to this path")) -> None:
    """Write a self-contained HTML report of a run: curves, timing, timeline and a rollout viewer (docs/report.md)."""
    from posttrain.obs.html_report import ReportError, write_chrome_trace, write_compare, write_html_report
    from posttrain.obs.report import write_report

    try:
        if compare:
            typer.echo(write_compare(run_dirs, out or Path("compare.html")))
            return
        if len(run_dirs) != 1:
            _fail("report takes one run directory (pass --compare to overlay several)")
        run_dir = run_dirs[0]
        if not run_dir.is_dir():
            _fail(f"run directory not found: {run_dir}")
        if trace is not None:
            typer.echo(write_chrome_trace(run_dir, trace))
        if out is not None and out.suffix.lower() == ".png":
            typer.echo(write_report(str(run_dir), str(out)))
        else:
            typer.echo(write_html_report(run_dir, out))
    except (ReportError, FileNotFoundError, ValueError, RuntimeError) as e:
        _fail(str(e))

@app.command()
def diagnose(run_dir: Path = typer.Argument(..., help="a run directory (finished or still running)"),
             as_json: bool = typer.Option(False, "--json", help="print the verdicts as JSON")) -> None:
    """Why a run stopped learning: the live diagnostics' verdicts and advice, from the run's files only."""
    import json

    from posttrain.obs.diagnose_run import diagnose as run_diagnose, render

    if not run_dir.is_dir():
        _fail(f"run directory not found: {run_dir}")
    try:
        diag = run_diagnose(run_dir)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps(diag.to_json(), indent=2))
    else:
        typer.echo(render(diag))
