"""Commands for learned rewards: `rm train`, `judge audit`, `judge finetune`."""

from __future__ import annotations

import typer

from posttrain.cli.app import app, fail

rm_app = typer.Typer(
    add_completion=False, help="Reward models: train one from chosen/rejected pairs (docs/reward_models.md)."
)
app.add_typer(rm_app, name="rm")


@rm_app.command("train")
def rm_train(
    data: str = typer.Option(
        "product-blurb",
        "--data",
        help=(
            "'product-blurb' (built-in), a .jsonl of prompt/chosen/rejected, a saved datasets folder, "
            "or hf:NAME[:SPLIT]"
        ),
    ),
    eval_data: str | None = typer.Option(
        None, "--eval-data", help="held-out pairs (default: the data's own split, else 10% of it)"
    ),
    model: str = typer.Option("default", "--model", help="base model: 'default', 'tiny-random' or a HF folder"),
    out: str | None = typer.Option(
        None, "--out", help="folder to save (default: $POSTTRAIN_CACHE/reward_models/<data>)"
    ),
    layers: int | None = typer.Option(None, "--layers", help="keep only the first N decoder layers (faster on a CPU)"),
    train_layers: int | None = typer.Option(
        None, "--train-layers", help="train only the top N layers (+ head); the rest stay frozen"
    ),
    lora: bool = typer.Option(False, "--lora", help="train LoRA adapters + the head (saved merged)"),
    epochs: int = typer.Option(1, "--epochs"),
    lr: float = typer.Option(5e-5, "--lr"),
    batch_size: int = typer.Option(8, "--batch-size", help="pairs per step"),
    max_train_pairs: int | None = typer.Option(None, "--max-train-pairs"),
    max_eval_pairs: int | None = typer.Option(400, "--max-eval-pairs"),
    max_length: int = typer.Option(256, "--max-length", help="tokens per prompt+response (longer is cut)"),
    time_budget: float | None = typer.Option(
        None,
        "--time-budget",
        help="stop training after this many seconds of it (evals not counted), then evaluate and save",
    ),
    seed: int = typer.Option(0, "--seed"),
    threads: int | None = typer.Option(None, "--threads", help="torch threads (default: all cores)"),
    device: str = typer.Option("cpu", "--device"),
) -> None:
    """Train a Bradley-Terry reward model; print per-epoch loss and held-out pair accuracy; save a HF folder."""
    from posttrain.training.reward_model_fit import RMTrainConfig, train_reward_model

    cfg = RMTrainConfig(
        data=data,
        eval_data=eval_data,
        model=model,
        out=out,
        layers=layers,
        train_layers=train_layers,
        lora=lora,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        max_train_pairs=max_train_pairs,
        max_eval_pairs=max_eval_pairs,
        max_length=max_length,
        time_budget_s=time_budget,
        seed=seed,
        threads=threads,
        device=device,
    )
    res = train_reward_model(cfg, log=typer.echo)
    typer.echo(
        f"held-out pair accuracy: {res.eval_accuracy:.1%} ({res.n_eval} pairs; untrained: "
        f"{res.eval_accuracy_before:.1%})\nsaved: {res.out}"
    )


judge_app = typer.Typer(
    add_completion=False, help="LLM judges: audit a task's judge against its verifier; fine-tune a small local judge."
)
app.add_typer(judge_app, name="judge")


@judge_app.command("audit", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def judge_audit(
    args: list[str] | None = typer.Argument(
        None, help="[CONFIG.yaml] then overrides like task.name=word-use judge.audit_prompts=8"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Judge vs programmatic verifier: agreement, Cohen's kappa, confusion, injection probes, position flips."""
    import json

    from posttrain.config import load_config
    from posttrain.loop.components import build
    from posttrain.loop.judge_audit import audit

    args = list(args or [])
    config_path = args.pop(0) if args and "=" not in args[0] else None
    cfg = load_config(config_path, args)
    say = lambda s: typer.echo(s, err=True)
    report = audit(cfg, build(cfg, log=say), log=say)
    typer.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.to_text())


@judge_app.command("finetune")
def judge_finetune(
    data: str = typer.Option(
        "product-blurb",
        "--data",
        help=(
            "'product-blurb' (built-in: the task's judge question, labelled by its hidden rule) or a .jsonl of "
            "question/answer (Yes|No) rows"
        ),
    ),
    out: str | None = typer.Option(None, "--out", help="folder to save (default: $POSTTRAIN_CACHE/judges/<data>)"),
    model: str = typer.Option("default", "--model", help="base model: 'default', 'tiny-random' or a HF folder"),
    steps: int = typer.Option(200, "--steps"),
    batch_size: int = typer.Option(16, "--batch-size"),
    lr: float = typer.Option(3e-5, "--lr"),
    max_train: int = typer.Option(4000, "--max-train", help="built-in data: training examples to generate"),
    max_eval: int = typer.Option(400, "--max-eval", help="built-in data: held-out examples to generate"),
    max_length: int = typer.Option(192, "--max-length", help="tokens per question (longer keeps its end)"),
    time_budget: float | None = typer.Option(
        None,
        "--time-budget",
        help="stop training after this many seconds of it (evals not counted), then evaluate and save",
    ),
    seed: int = typer.Option(0, "--seed"),
    threads: int | None = typer.Option(None, "--threads", help="torch threads (default: all cores)"),
) -> None:
    """Fine-tune a local model to answer one yes/no judge question; print held-out accuracy before and after; save a HF folder."""  # noqa: E501 - typer's command list keeps a docstring's line breaks
    from posttrain.rewards.judges.finetune import finetune_judge, load_examples
    from posttrain.tasks.product_blurb import default_judge_dir

    try:
        train, held = load_examples(data, max_train, max_eval, seed)
        target = out or str(default_judge_dir(data if "/" not in data and "." not in data else "custom"))
        finetune_judge(
            train,
            held,
            target,
            model=model,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            max_length=max_length,
            seed=seed,
            threads=threads,
            time_budget_s=time_budget,
            log=typer.echo,
        )
    except ValueError as e:  # a builtin one: finetune_judge's own check of its settings
        fail(str(e))
