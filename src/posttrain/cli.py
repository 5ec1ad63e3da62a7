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
    from posttrain.train.launch import launched_rank, run_worker

    if launched_rank() > 0:  # under torchrun: ranks > 0 train what rank 0 sends them (train/distributed.py)
        run_worker(cfg)
        return
    from posttrain.algos.registry import UnknownName
    from posttrain.envs.check import EnvCheckError
    from posttrain.envs.custom import TaskLoadError
    from posttrain.loop import train as run_train
    from posttrain.models.load import ModelLoadError
    from posttrain.models.template_check import ChatTemplateError
    from posttrain.rewards.embedding import EmbeddingError, TripletDataError
    from posttrain.rewards.from_config import RewardConfigError
    from posttrain.rewards.reward_model import RewardModelError
    from posttrain.rewards.judges.audit import JudgeAuditError, JudgeAuditFailed

    try:
        run_train(cfg, run_dir=resume, resume=resume is not None)
    except (TaskLoadError, ModelLoadError, FileNotFoundError, UnknownName, EnvCheckError, ChatTemplateError,
            RewardModelError, RewardConfigError, EmbeddingError, TripletDataError,
            JudgeAuditError, JudgeAuditFailed) as e:
        _fail(str(e))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def ttrl(
    args: Optional[list[str]] = typer.Argument(None, help="overrides like loop.steps=20; task.options.* go to the wrapped task"),
    task: str = typer.Option(..., "--task", help="the task whose prompts to train on without labels: arith, count-a, ..."),
    mode: str = typer.Option("majority", "--mode", help="majority (TTRL: agree with the group's majority answer) or "
                             "discover (TTT-Discover: beat the best score so far)"),
    extractor: Optional[str] = typer.Option(None, "--extractor", help="majority: last_number, boxed, last_line, exact"),
    state: Optional[Path] = typer.Option(None, "--state", help="discover: JSON file keeping the best score (and "
                                         "completion) so far, read at start, rewritten after every group"),
    eval_samples: int = typer.Option(4, "--eval-samples", help="completions per held-out prompt: the n of maj@n"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the resolved config and exit"),
) -> None:
    """Test-time RL on a task's unlabelled prompts (docs/ttrl.md): `posttrain train` with a label-free reward."""
    from posttrain.config import ConfigError, load_config, to_yaml
    from posttrain.envs.check import EnvCheckError
    from posttrain.envs.custom import TaskLoadError
    from posttrain.loop import train as run_train
    from posttrain.models.load import ModelLoadError
    from posttrain.models.template_check import ChatTemplateError

    overrides = list(args or [])
    if mode not in ("majority", "discover"):
        _fail(f"--mode must be 'majority' or 'discover', got {mode!r}")
    if eval_samples < 1:
        _fail(f"--eval-samples must be >= 1, got {eval_samples}")
    if state is not None and mode != "discover":
        _fail("--state is for --mode discover (it keeps the best score so far)")
    for a in overrides:
        if "=" not in a:
            _fail(f"unexpected argument {a!r}: ttrl takes overrides like loop.steps=20 (no config file)")
        if a.split("=", 1)[0] in ("task.name", "task.options.base", "task.options.mode"):
            _fail(f"{a.split('=', 1)[0]} is set by ttrl: use --task / --mode")
    keys = {a.split("=", 1)[0] for a in overrides}
    base = ["task.name=ttrl", f"task.options.base={task}", f"task.options.mode={mode}"]
    base += [f"task.options.extractor={extractor}"] if extractor else []
    base += [f"task.options.state_file={state}"] if state is not None else []
    if mode == "majority":  # maj@n needs n sampled completions per held-out prompt
        base += [] if "loop.eval_samples" in keys else [f"loop.eval_samples={eval_samples}"]
        base += [] if "sampling.eval_temperature" in keys or eval_samples == 1 else ["sampling.eval_temperature=0.7"]
    try:
        cfg = load_config(None, base + overrides)
    except ConfigError as e:
        _fail(str(e))
    if dry_run:
        typer.echo(to_yaml(cfg), nl=False)
        return
    try:
        result = run_train(cfg)
    except (TaskLoadError, ModelLoadError, FileNotFoundError, EnvCheckError, ChatTemplateError) as e:
        _fail(str(e))
    names = [("eval/ttrl/pass_at_1", "pass@1 (labels, eval only)"),
             ("eval/ttrl/majority_correct", f"maj@{cfg.loop.eval_samples} (majority right)"),
             ("eval/ttrl/majority_share", "majority share"), ("eval/ttrl/best_score", "best score so far")]
    for key, label in names:
        if key in result.before or key in result.after:
            fmt = lambda m: f"{m[key]:.3f}" if key in m else "-"  # noqa: E731
            typer.echo(f"{label}: {fmt(result.before)} -> {fmt(result.after)}")


@app.command("eval")
def eval_cmd(
    model: str = typer.Option("default", "--model", help="'default', 'tiny-random', a HF folder, a run's final/ folder"),
    task: str = typer.Option("json-extract", "--task"),
    prompts: int = typer.Option(48, "--prompts", help="held-out prompts to evaluate"),
    temperature: float = typer.Option(0.0, "--temperature"),
    samples: int = typer.Option(1, "--samples", help="completions per prompt (needs --temperature > 0)"),
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
                 f"loop.eval_prompts={prompts}", f"loop.eval_samples={samples}"]
    if max_tokens:
        overrides.append(f"sampling.max_tokens={max_tokens}")
    from posttrain.rewards.embedding import EmbeddingError
    from posttrain.rewards.reward_model import RewardModelError

    try:
        cfg = load_config(None, overrides)
        c = build(cfg, log=lambda s: typer.echo(s, err=True))
    except (ConfigError, TaskLoadError, ModelLoadError, FileNotFoundError, RewardModelError, EmbeddingError) as e:
        _fail(str(e))
    m, _ = evaluate(c.env, c.sampler, c.task.eval_rows[:prompts], c.eval_params, samples)
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
def auto(
    program: Optional[Path] = typer.Argument(None, help="program.md: goal, metric, budget, search space, frozen keys"),
    base_config: Optional[Path] = typer.Argument(None, help="the base config every trial changes (default: defaults)"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue the stopped search in SEARCH_DIR"),
    out: Optional[Path] = typer.Option(None, "--out", help="the search directory (default RUN.OUTPUT_DIR/auto-<time>)"),
) -> None:
    """Tune a config autonomously: each trial a config diff run for a fixed budget, kept only past the seed noise."""
    from posttrain.auto import ProgramError, SearchError, resume_search, start_search

    try:
        if resume is not None:
            if program is not None or base_config is not None:
                _fail("--resume continues with the program.md and base.yaml copied into SEARCH_DIR; pass no files")
            result = resume_search(resume)
        else:
            if program is None:
                _fail("give a program.md (see examples/auto/program.md) or --resume SEARCH_DIR")
            result = start_search(program, base_config, out)
    except (ProgramError, SearchError, ImportError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        typer.secho("stopped; continue with: posttrain auto --resume SEARCH_DIR", err=True)
        raise typer.Exit(130)
    typer.echo(f"results: {result.search_dir / 'results.tsv'}" + (f"\nreport: {result.report}" if result.report else ""))


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


@app.command()
def serve(
    model: str = typer.Option("default", "--model", help="'default', 'tiny-random', a HF folder, a hub id"),
    lora: Optional[str] = typer.Option(None, "--lora", help="a LoRA adapter folder (a run's final/) to serve on its base"),
    host: str = typer.Option("127.0.0.1", "--host", help="0.0.0.0 to accept other machines (no auth!)"),
    port: int = typer.Option(8000, "--port"),
    request_timeout: float = typer.Option(300.0, "--request-timeout", help="seconds one generation may take"),
    weights_dir: Optional[str] = typer.Option(None, "--weights-dir", help=(
        "accept POST /update_weights_from_disk: load a trainer's pushes (loop/weight_ipc.py FileWeights) from here")),
) -> None:
    """Serve a model as an OpenAI-compatible endpoint (/v1/chat/completions, /v1/completions, /v1/models)."""
    from posttrain.models.load import ModelLoadError
    from posttrain.sampling.http_serve import run_forever
    from posttrain.sampling.openai_server import build_model_app

    try:
        api = build_model_app(model, lora, request_timeout_s=request_timeout, log=lambda s: typer.echo(s, err=True),
                              weights_dir=weights_dir)
    except (ModelLoadError, FileNotFoundError) as e:
        _fail(str(e))
    typer.echo(f"serving {lora or model} at http://{host}:{port}/v1", err=True)
    run_forever(api, host, port)


env_app = typer.Typer(add_completion=False, help="Environments and tasks (serve over the OpenEnv protocol, ...).")
app.add_typer(env_app, name="env")


@env_app.command("serve")
def env_serve(
    task: str = typer.Option(..., "--task", help="a built-in task, 'path/file.py:make_task' or 'module:make_task'"),
    model: str = typer.Option("default", "--model", help="whose tokenizer and chat template render prompts"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8001, "--port"),
) -> None:
    """Serve a task as an OpenEnv environment (WebSocket /ws, /reset, /step, /state, /schema)."""
    from posttrain.envs.custom import TaskLoadError
    from posttrain.envs.openenv_server import build_task_app
    from posttrain.models.load import ModelLoadError
    from posttrain.sampling.http_serve import run_forever

    try:
        api = build_task_app(task, model, log=lambda s: typer.echo(s, err=True))
    except (TaskLoadError, ModelLoadError, FileNotFoundError) as e:
        _fail(str(e))
    typer.echo(f"serving task {task} (OpenEnv protocol) at http://{host}:{port}", err=True)
    run_forever(api, host, port)


@env_app.command("check")
def env_check(
    task: Optional[list[str]] = typer.Option(None, "--task", help="a task to check (repeatable); default: every built-in"),
    model: str = typer.Option("default", "--model", help="--preflight: the model to measure"),
    preflight: bool = typer.Option(False, "--preflight", help="also measure model x task: baseline, variance, memory"),
    prompts: int = typer.Option(16, "--prompts", help="--preflight: prompts for the baseline pass rate"),
    groups: int = typer.Option(4, "--groups", help="--preflight: sampled groups for the zero-variance share"),
    steps: Optional[int] = typer.Option(None, "--steps", help="--preflight: planned loop.steps, for the run-time estimate"),
) -> None:
    """Smoke-check envs (known-good passes, known-bad fails, smoke commands); exit 1 if any check fails."""
    from posttrain.config import ConfigError, load_config
    from posttrain.envs import check as env_checks
    from posttrain.envs.custom import TaskLoadError, load_task
    from posttrain.envs.tasks import BUILTIN_TASKS
    from posttrain.models.load import ModelLoadError
    from posttrain.obs import console as con

    names = list(task or BUILTIN_TASKS)
    from posttrain.rewards.embedding import EmbeddingError
    from posttrain.rewards.reward_model import RewardModelError

    tasks = []
    for n in list(names):
        try:
            tasks.append(load_task(n))
        except (RewardModelError, EmbeddingError) as e:
            if task:  # asked for by name: its missing prerequisite is an error
                _fail(str(e))
            # every built-in: one whose reward model is not trained yet or whose extra is not installed is skipped
            typer.secho(f"skipped {n}: {e}", fg=typer.colors.YELLOW, err=True)
            names.remove(n)
        except TaskLoadError as e:
            _fail(str(e))
    results = env_checks.check_tasks(tasks)
    con.console.print(env_checks.results_table(results))
    if preflight:
        from rich.table import Table

        for n in names:
            try:
                over = [f"model.name={model}", f"task.name={n}"] + ([f"loop.steps={steps}"] if steps is not None else [])
                rep = env_checks.preflight(load_config(None, over), prompts, groups, log=lambda s: typer.echo(s, err=True))
            except (ConfigError, TaskLoadError, ModelLoadError, FileNotFoundError) as e:
                _fail(str(e))
            table = Table(title=f"preflight: {model} on {n}")
            table.add_column("measure")
            table.add_column("value", overflow="fold")
            for k, v in rep.rows():
                table.add_row(k, v)
            con.console.print(table)
            from posttrain.envs.preflight import format_verdicts

            con.console.print(format_verdicts(rep.verdicts, f"preflight verdicts: {model} on {n}"), markup=False,
                              highlight=False)
    if not all(r.ok for r in results):
        raise typer.Exit(1)


rm_app = typer.Typer(add_completion=False, help="Reward models: train one from chosen/rejected pairs (docs/reward_models.md).")
app.add_typer(rm_app, name="rm")


@rm_app.command("train")
def rm_train(
    data: str = typer.Option("product-blurb", "--data", help="'product-blurb' (built-in), a .jsonl of prompt/chosen/rejected, a saved datasets folder, or hf:NAME[:SPLIT]"),
    eval_data: Optional[str] = typer.Option(None, "--eval-data", help="held-out pairs (default: the data's own split, else 10% of it)"),
    model: str = typer.Option("default", "--model", help="base model: 'default', 'tiny-random' or a HF folder"),
    out: Optional[str] = typer.Option(None, "--out", help="folder to save (default: $POSTTRAIN_CACHE/reward_models/<data>)"),
    layers: Optional[int] = typer.Option(None, "--layers", help="keep only the first N decoder layers (faster on a CPU)"),
    train_layers: Optional[int] = typer.Option(None, "--train-layers", help="train only the top N layers (+ head); the rest stay frozen"),
    lora: bool = typer.Option(False, "--lora", help="train LoRA adapters + the head (saved merged)"),
    epochs: int = typer.Option(1, "--epochs"),
    lr: float = typer.Option(5e-5, "--lr"),
    batch_size: int = typer.Option(8, "--batch-size", help="pairs per step"),
    max_train_pairs: Optional[int] = typer.Option(None, "--max-train-pairs"),
    max_eval_pairs: Optional[int] = typer.Option(400, "--max-eval-pairs"),
    max_length: int = typer.Option(256, "--max-length", help="tokens per prompt+response (longer is cut)"),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", help="stop training after this many seconds of it (evals not counted), then evaluate and save"),
    seed: int = typer.Option(0, "--seed"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (default: all cores)"),
    device: str = typer.Option("cpu", "--device"),
) -> None:
    """Train a Bradley-Terry reward model; print per-epoch loss and held-out pair accuracy; save a HF folder."""
    from posttrain.models.load import ModelLoadError
    from posttrain.rewards.rm_train import PreferenceDataError, RMTrainConfig, train_reward_model

    cfg = RMTrainConfig(data=data, eval_data=eval_data, model=model, out=out, layers=layers, train_layers=train_layers,
                        lora=lora, epochs=epochs,
                        lr=lr, batch_size=batch_size, max_train_pairs=max_train_pairs, max_eval_pairs=max_eval_pairs,
                        max_length=max_length, time_budget_s=time_budget, seed=seed, threads=threads, device=device)
    try:
        res = train_reward_model(cfg, log=typer.echo)
    except (PreferenceDataError, ModelLoadError, FileNotFoundError) as e:
        _fail(str(e))
    typer.echo(f"held-out pair accuracy: {res.eval_accuracy:.1%} ({res.n_eval} pairs; untrained: "
               f"{res.eval_accuracy_before:.1%})\nsaved: {res.out}")


@app.command()
def sft(
    data: Path = typer.Argument(..., help="a JSONL of {prompt, completion} rows, or a run's insights.jsonl (or its RUN_DIR)"),
    out: Path = typer.Option(..., "--out", help="the HF folder to save the trained model to"),
    target: str = typer.Option("insight", "--target", help="for insights.jsonl: 'insight' (task -> insight, SFTL;DR) "
                                                           "or 'answer' (task -> a completion that passed with insights)"),
    model: str = typer.Option("default", "--model", help="'default', 'tiny-random' or a HF folder"),
    steps: int = typer.Option(100, "--steps"),
    lr: float = typer.Option(1e-5, "--lr"),
    batch_size: int = typer.Option(8, "--batch-size"),
    seed: int = typer.Option(0, "--seed"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (default: all cores)"),
) -> None:
    """Supervised fine-tuning on (prompt, completion) rows; with a run's insights.jsonl, SFTL;DR (docs/feedback.md)."""
    from posttrain.models.load import ModelLoadError
    from posttrain.train.sft import SFTDataError, read_sft_rows, sft as run_sft

    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        rows = read_sft_rows(data, target)
        res = run_sft(rows, model, out, steps=steps, lr=lr, batch_size=batch_size, seed=seed, log=typer.echo)
    except (SFTDataError, ModelLoadError, FileNotFoundError) as e:
        _fail(str(e))
    typer.echo(f"nll/token {res['nll_first']:.3f} -> {res['nll_last']:.3f} on {res['rows']:.0f} rows "
               f"[{res['seconds']:.0f}s]; evaluate with: posttrain eval --model {out} --task ...")


judge_app = typer.Typer(add_completion=False, help="LLM judges: audit a task's judge against its verifier.")
app.add_typer(judge_app, name="judge")


@judge_app.command("audit", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def judge_audit(
    args: Optional[list[str]] = typer.Argument(None, help="[CONFIG.yaml] then overrides like task.name=word-use judge.audit_prompts=8"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Judge vs programmatic verifier: agreement, Cohen's kappa, confusion, injection probes, position flips."""
    import json

    from posttrain.config import ConfigError, load_config
    from posttrain.envs.custom import TaskLoadError
    from posttrain.models.load import ModelLoadError
    from posttrain.rewards.judges.audit import JudgeAuditError, audit

    args = list(args or [])
    config_path = args.pop(0) if args and "=" not in args[0] else None
    try:
        cfg = load_config(config_path, args)
        report = audit(cfg, log=lambda s: typer.echo(s, err=True))
    except (ConfigError, TaskLoadError, ModelLoadError, FileNotFoundError, JudgeAuditError) as e:
        _fail(str(e))
    typer.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.to_text())


init_app = typer.Typer(add_completion=False, help="Start something new from a runnable template.")
app.add_typer(init_app, name="init")


@init_app.command("task")
def init_task(
    name: str = typer.Argument(..., help="the task's name; writes NAME.py"),
    directory: Path = typer.Option(Path("."), "--dir", help="folder to write into"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing file"),
) -> None:
    """Write a runnable task file: rows, rewards, a demonstrate hook, smoke checks, and how to train it."""
    from posttrain.envs.scaffold import write_task_file

    try:
        path = write_task_file(name, directory, force)
    except (FileExistsError, ValueError) as e:
        _fail(str(e))
    typer.echo(f"wrote {path}\nnext:\n  posttrain env check --task {path}:make_task\n"
               f"  posttrain env check --task {path}:make_task --preflight\n"
               f"  posttrain train task.name={path}:make_task loop.steps=15")


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
