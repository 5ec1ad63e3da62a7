"""posttrain's command line: parsing and calling the library, nothing more."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=False, help="RL post-training for language models and agents.")


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
    args: Optional[list[str]] = typer.Argument(None, help="[CONFIG.yaml] then overrides like trainer.lr=2e-5"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the resolved config and exit"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue the run in RUN_DIR from its last checkpoint"),
) -> None:
    """Train with RL. With no arguments: the default model on the built-in json-extract task."""
    from posttrain.config import ConfigError, load_config, to_yaml

    args = list(args or [])
    config_path = None
    if args and "=" not in args[0]:
        config_path = args.pop(0)
    if resume is not None:
        if config_path is not None:
            _fail("--resume takes the config from RUN_DIR/config.yaml; pass only overrides")
        config_path = str(resume / "config.yaml")
        if not resume.is_dir():
            _fail(f"run directory not found: {resume}")
    try:
        cfg = load_config(config_path, args)
    except ConfigError as e:
        _fail(str(e))
    if dry_run:
        typer.echo(to_yaml(cfg), nl=False)
        return
    from posttrain.algos.registry import UnknownName
    from posttrain.envs.custom import TaskLoadError
    from posttrain.loop import train as run_train
    from posttrain.models.load import ModelLoadError

    try:
        run_train(cfg, run_dir=resume, resume=resume is not None)
    except (TaskLoadError, ModelLoadError, FileNotFoundError, UnknownName) as e:
        _fail(str(e))


@app.command("eval")
def eval_cmd(
    model: str = typer.Option("default", "--model", help="'default', 'tiny-random', a HF folder, a run's final/ folder"),
    task: str = typer.Option("json-extract", "--task"),
    prompts: int = typer.Option(48, "--prompts", help="held-out prompts to evaluate"),
    temperature: float = typer.Option(0.0, "--temperature"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens"),
) -> None:
    """Pass rates of a model or a trained run on a task's held-out prompts."""
    from posttrain.config import ConfigError, load_config
    from posttrain.envs.custom import TaskLoadError
    from posttrain.loop.builder import build
    from posttrain.loop.evaluate import evaluate
    from posttrain.models.load import ModelLoadError
    from posttrain.obs import console as con

    overrides = [f"model.name={model}", f"task.name={task}", f"sampling.eval_temperature={temperature}",
                 f"loop.eval_prompts={prompts}"]
    if max_tokens:
        overrides.append(f"sampling.max_tokens={max_tokens}")
    try:
        cfg = load_config(None, overrides)
        c = build(cfg, log=lambda s: typer.echo(s, err=True))
    except (ConfigError, TaskLoadError, ModelLoadError, FileNotFoundError) as e:
        _fail(str(e))
    m, _ = evaluate(c.env, c.sampler, c.task.eval_rows[:prompts], c.eval_params)
    m["eval/reward"] = m["eval/reward/mean"]
    con.console.print(con.eval_table(f"{model} on {task} ({min(prompts, len(c.task.eval_rows))} held-out prompts)",
                                     [(Path(model).name or model, m)]))


@app.command()
def report(run_dir: Path = typer.Argument(..., help="a run directory"),
           out: Optional[Path] = typer.Option(None, "--out", help="PNG path (default RUN_DIR/report.png)")) -> None:
    """Write a PNG of the reward curves and pass rates of a run."""
    from posttrain.obs.report import write_report

    if not run_dir.is_dir():
        _fail(f"run directory not found: {run_dir}")
    try:
        path = write_report(str(run_dir), str(out) if out else None)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        _fail(str(e))
    typer.echo(path)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
