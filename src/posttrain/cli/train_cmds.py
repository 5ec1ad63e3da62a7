"""Commands that train: `train`, `ttrl`, `sft`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from posttrain.cli.app import app, fail

if TYPE_CHECKING:
    from posttrain.config import Config

DRY_RUN_HELP = (
    "check what the run would refuse at its start (the data, its columns, the rewards and their options, "
    "loop.best_metric, the eval suite), print the resolved config and exit"
)


def _dry_run(cfg: Config) -> None:
    """The checks a run makes at its start, without a model (loop/start_checks.py); a refusal is a PosttrainError
    the app prints in one line. Then the resolved config, and what was checked as a closing comment."""
    from posttrain.config import to_yaml
    from posttrain.loop.start_checks import check_start

    checked = check_start(cfg)
    typer.echo(to_yaml(cfg), nl=False)
    typer.echo(f"# checked: {checked.summary()}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
    args: list[str] | None = typer.Argument(None, help="[CONFIG.yaml] then overrides like trainer.lr=2e-5"),
    dry_run: bool = typer.Option(False, "--dry-run", help=DRY_RUN_HELP),
    resume: Path | None = typer.Option(None, "--resume", help="continue the run in RUN_DIR from its last checkpoint"),
) -> None:
    """Train with RL. With no arguments: the default model on the built-in json-extract task."""
    from posttrain.config import load_config

    args = list(args or [])
    config_path = None
    if args and "=" not in args[0]:
        config_path = args.pop(0)
    if resume is not None:
        if config_path is not None:
            fail("--resume takes the config from RUN_DIR/config.yaml; pass only overrides")
        config_path = str(resume / "config.yaml")
        if not resume.is_dir():
            fail(f"run directory not found: {resume}")
    cfg = load_config(config_path, args)
    if dry_run:
        _dry_run(cfg)
        return
    from posttrain.training.launch import launched_rank, run_worker

    if launched_rank() > 0:  # under torchrun: ranks > 0 train what rank 0 sends them (training/distributed.py)
        run_worker(cfg.trainer.dist_timeout_s)  # the rest of what it trains comes from rank 0 (RankPlan)
        return
    from posttrain.loop import train as run_train

    run_train(cfg, run_dir=resume, resume=resume is not None)  # cli/app.py prints an error the user can fix


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def ttrl(
    args: list[str] | None = typer.Argument(
        None, help="overrides like loop.steps=20; task.options.* go to the wrapped task"
    ),
    task: str = typer.Option(
        ..., "--task", help="the task whose prompts to train on without labels: arith, count-a, ..."
    ),
    mode: str = typer.Option(
        "majority",
        "--mode",
        help="majority (TTRL: agree with the group's majority answer) or "
        "discover (TTT-Discover: beat the best score so far)",
    ),
    extractor: str | None = typer.Option(None, "--extractor", help="majority: last_number, boxed, last_line, exact"),
    state: Path | None = typer.Option(
        None,
        "--state",
        help="discover: JSON file keeping the best score (and "
        "completion) so far, read at start, rewritten after every group",
    ),
    eval_samples: int = typer.Option(4, "--eval-samples", help="completions per held-out prompt: the n of maj@n"),
    dry_run: bool = typer.Option(False, "--dry-run", help=DRY_RUN_HELP),
) -> None:
    """Test-time RL on a task's unlabelled prompts (docs/ttrl.md): `posttrain train` with a label-free reward."""
    from posttrain.config import load_config
    from posttrain.loop import train as run_train

    overrides = list(args or [])
    if mode not in ("majority", "discover"):
        fail(f"--mode must be 'majority' or 'discover', got {mode!r}")
    if eval_samples < 1:
        fail(f"--eval-samples must be >= 1, got {eval_samples}")
    if state is not None and mode != "discover":
        fail("--state is for --mode discover (it keeps the best score so far)")
    for a in overrides:
        if "=" not in a:
            fail(f"unexpected argument {a!r}: ttrl takes overrides like loop.steps=20 (no config file)")
        if a.split("=", 1)[0] in ("task.name", "task.options.base", "task.options.mode"):
            fail(f"{a.split('=', 1)[0]} is set by ttrl: use --task / --mode")
    keys = {a.split("=", 1)[0] for a in overrides}
    base = ["task.name=ttrl", f"task.options.base={task}", f"task.options.mode={mode}"]
    base += [f"task.options.extractor={extractor}"] if extractor else []
    base += [f"task.options.state_file={state}"] if state is not None else []
    if mode == "majority":  # maj@n needs n sampled completions per held-out prompt
        base += [] if "loop.eval_samples" in keys else [f"loop.eval_samples={eval_samples}"]
        base += [] if "sampling.eval_temperature" in keys or eval_samples == 1 else ["sampling.eval_temperature=0.7"]
    cfg = load_config(None, base + overrides)
    if dry_run:
        _dry_run(cfg)
        return
    result = run_train(cfg)
    names = [
        ("eval/ttrl/pass_at_1", "pass@1 (labels, eval only)"),
        ("eval/ttrl/majority_correct", f"maj@{cfg.loop.eval_samples} (majority right)"),
        ("eval/ttrl/majority_share", "majority share"),
        ("eval/ttrl/best_score", "best score so far"),
    ]
    for key, label in names:
        if key in result.before or key in result.after:
            fmt = lambda m, key=key: f"{m[key]:.3f}" if key in m else "-"
            typer.echo(f"{label}: {fmt(result.before)} -> {fmt(result.after)}")


@app.command()
def sft(
    data: Path = typer.Argument(
        ..., help="a JSONL of {prompt, completion} rows, or a run's insights.jsonl (or its RUN_DIR)"
    ),
    out: Path = typer.Option(..., "--out", help="the HF folder to save the trained model to"),
    target: str = typer.Option(
        "insight",
        "--target",
        help="for insights.jsonl: 'insight' (task -> insight, SFTL;DR) "
        "or 'answer' (task -> a completion that passed with insights)",
    ),
    model: str = typer.Option("default", "--model", help="'default', 'tiny-random' or a HF folder"),
    steps: int = typer.Option(100, "--steps"),
    lr: float = typer.Option(1e-5, "--lr"),
    batch_size: int = typer.Option(8, "--batch-size"),
    seed: int = typer.Option(0, "--seed"),
    threads: int | None = typer.Option(None, "--threads", help="torch threads (default: all cores)"),
) -> None:
    """Supervised fine-tuning on (prompt, completion) rows; with a run's insights.jsonl, SFTL;DR (docs/feedback.md)."""
    from posttrain.training.sft import read_sft_rows
    from posttrain.training.sft import sft as run_sft

    if threads:
        import torch

        torch.set_num_threads(threads)
    rows = read_sft_rows(data, target)
    res = run_sft(rows, model, out, steps=steps, lr=lr, batch_size=batch_size, seed=seed, log=typer.echo)
    typer.echo(
        f"nll/token {res['nll_first']:.3f} -> {res['nll_last']:.3f} on {res['rows']:.0f} rows "
        f"[{res['seconds']:.0f}s]; evaluate with: posttrain eval --model {out} --task ..."
    )
