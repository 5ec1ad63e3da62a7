"""Commands that serve or start things: `serve`, `env serve|check`, `init task`, `auto`."""

from __future__ import annotations

from pathlib import Path

import typer

from posttrain.cli.app import app, fail


@app.command()
def auto(
    program: Path | None = typer.Argument(None, help="program.md: goal, metric, budget, search space, frozen keys"),
    base_config: Path | None = typer.Argument(None, help="the base config every trial changes (default: defaults)"),
    resume: Path | None = typer.Option(None, "--resume", help="continue the stopped search in SEARCH_DIR"),
    out: Path | None = typer.Option(None, "--out", help="the search directory (default RUN.OUTPUT_DIR/auto-<time>)"),
) -> None:
    """Tune a config autonomously: each trial a config diff run for a fixed budget, kept only past the seed noise."""
    from posttrain.auto import resume_search, start_search

    try:
        if resume is not None:
            if program is not None or base_config is not None:
                fail("--resume continues with the program.md and base.yaml copied into SEARCH_DIR; pass no files")
            result = resume_search(resume)
        else:
            if program is None:
                fail("give a program.md (see examples/auto/program.md) or --resume SEARCH_DIR")
            result = start_search(program, base_config, out)
    except KeyboardInterrupt:
        typer.secho("stopped; continue with: posttrain auto --resume SEARCH_DIR", err=True)
        raise typer.Exit(130) from None
    typer.echo(
        f"results: {result.search_dir / 'results.tsv'}" + (f"\nreport: {result.report}" if result.report else "")
    )


API_KEY_HELP = (
    "clients must send 'Authorization: Bearer KEY' (/health stays open); default: $POSTTRAIN_API_KEY. "
    "Required with a --host other than a loopback address"
)


def _guard(host: str, api_key: str | None, max_body_mb: float, header_timeout: float, body_timeout: float):
    """The HTTP guard from the flags; exits with the reason when binding `host` without a key, before anything
    is loaded or bound."""
    from posttrain.sampling.http_serve import HttpGuard, api_key_from, check_bind

    key = api_key_from(api_key)
    check_bind(host, key)
    try:
        return HttpGuard(
            api_key=key,
            max_body_bytes=int(max_body_mb * 2**20),
            header_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
        )
    except ValueError as e:  # HttpGuard's own check of the flags (a size or timeout out of range)
        fail(str(e))


@app.command()
def serve(
    model: str = typer.Option("default", "--model", help="'default', 'tiny-random', a HF folder, a hub id"),
    lora: str | None = typer.Option(None, "--lora", help="a LoRA adapter folder (a run's final/) to serve on its base"),
    host: str = typer.Option("127.0.0.1", "--host", help="0.0.0.0 to accept other machines (needs --api-key)"),
    port: int = typer.Option(8000, "--port"),
    request_timeout: float = typer.Option(300.0, "--request-timeout", help="seconds one generation may take"),
    weights_dir: str | None = typer.Option(
        None,
        "--weights-dir",
        help=(
            "accept POST /update_weights_from_disk: load a trainer's pushes "
            "(sampling/weight_ipc.py FileWeights) from here"
        ),
    ),
    api_key: str | None = typer.Option(None, "--api-key", help=API_KEY_HELP, show_default=False),
    max_body_mb: float = typer.Option(4.0, "--max-body-mb", help="largest request body; larger answers 413"),
    max_chars: int = typer.Option(
        1_000_000, "--max-chars", help="most characters of text (messages, tools, prompts) in one request"
    ),
    max_n: int = typer.Option(64, "--max-n", help="most completions per prompt (n) in one request"),
    header_timeout: float = typer.Option(
        10.0, "--header-timeout", help="seconds a client has to send a request's headers"
    ),
    body_timeout: float = typer.Option(
        30.0, "--body-timeout", help="seconds a client has to send a request's body (408)"
    ),
    tool_parser: str = typer.Option(
        "auto",
        "--tool-parser",
        help="how tool calls are read: auto (the chat template's), hermes, llama3, mistral, qwen3_coder",
    ),
    reasoning_parser: str = typer.Option(
        "auto", "--reasoning-parser", help="the reasoning block served as reasoning_content: auto, think, mistral, none"
    ),
) -> None:
    """Serve a model as an OpenAI-compatible endpoint (/v1/chat/completions, /v1/completions, /v1/models)."""
    guard = _guard(host, api_key, max_body_mb, header_timeout, body_timeout)
    from posttrain.sampling import http_serve, openai_server
    from posttrain.sampling.reply_parsers import check_parser_names

    check_parser_names(tool_parser, reasoning_parser)  # before the model loads

    try:
        limits = openai_server.RequestLimits(max_chars=max_chars, max_n=max_n)
    except ValueError as e:
        fail(str(e))
    api = openai_server.build_model_app(
        model,
        lora,
        request_timeout_s=request_timeout,
        log=lambda s: typer.echo(s, err=True),
        weights_dir=weights_dir,
        limits=limits,
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
    )
    typer.echo(
        f"serving {lora or model} at http://{host}:{port}/v1" + (" (API key required)" if guard.api_key else ""),
        err=True,
    )
    http_serve.run_forever(api, host, port, guard=guard)


env_app = typer.Typer(add_completion=False, help="Environments and tasks (serve over the OpenEnv protocol, ...).")
app.add_typer(env_app, name="env")


@env_app.command("serve")
def env_serve(
    task: str = typer.Option(..., "--task", help="a built-in task, 'path/file.py:make_task' or 'module:make_task'"),
    model: str = typer.Option("default", "--model", help="whose tokenizer and chat template render prompts"),
    host: str = typer.Option("127.0.0.1", "--host", help="0.0.0.0 to accept other machines (needs --api-key)"),
    port: int = typer.Option(8001, "--port"),
    api_key: str | None = typer.Option(None, "--api-key", help=API_KEY_HELP, show_default=False),
    max_body_mb: float = typer.Option(4.0, "--max-body-mb", help="largest HTTP request body; larger answers 413"),
    max_action_chars: int = typer.Option(200_000, "--max-action-chars", help="most characters in one action's message"),
    header_timeout: float = typer.Option(
        10.0, "--header-timeout", help="seconds a client has to send a request's headers"
    ),
    body_timeout: float = typer.Option(
        30.0, "--body-timeout", help="seconds a client has to send a request's body (408)"
    ),
) -> None:
    """Serve a task as an OpenEnv environment (WebSocket /ws, /reset, /step, /state, /schema)."""
    guard = _guard(host, api_key, max_body_mb, header_timeout, body_timeout)
    if max_action_chars < 1:
        fail(f"--max-action-chars must be >= 1, got {max_action_chars}")
    from posttrain.sampling import http_serve

    api = build_task_app(task, model, log=lambda s: typer.echo(s, err=True), max_action_chars=max_action_chars)
    typer.echo(
        f"serving task {task} (OpenEnv protocol) at http://{host}:{port}"
        + (" (API key required)" if guard.api_key else ""),
        err=True,
    )
    http_serve.run_forever(api, host, port, guard=guard)


@env_app.command("check")
def env_check(
    task: list[str] | None = typer.Option(None, "--task", help="a task to check (repeatable); default: every built-in"),
    model: str = typer.Option("default", "--model", help="--preflight: the model to measure"),
    preflight: bool = typer.Option(False, "--preflight", help="also measure model x task: baseline, variance, memory"),
    prompts: int = typer.Option(16, "--prompts", help="--preflight: prompts for the baseline pass rate"),
    groups: int = typer.Option(4, "--groups", help="--preflight: sampled groups for the zero-variance share"),
    steps: int | None = typer.Option(
        None, "--steps", help="--preflight: planned loop.steps, for the run-time estimate"
    ),
) -> None:
    """Smoke-check envs (known-good passes, known-bad fails, smoke commands); exit 1 if any check fails."""
    from posttrain.config import load_config
    from posttrain.envs import smoke_checks as env_checks
    from posttrain.loop import preflight as run_preflight
    from posttrain.obs import console as con
    from posttrain.tasks import BUILTIN_TASKS
    from posttrain.tasks.load import load_task

    names = list(task or BUILTIN_TASKS)
    from posttrain.rewards.embedding import EmbeddingError
    from posttrain.rewards.reward_model import RewardModelError

    tasks = []
    for n in list(names):
        try:
            tasks.append(load_task(n))
        except (RewardModelError, EmbeddingError) as e:
            if task:  # asked for by name: its missing prerequisite is an error
                fail(str(e))
            # every built-in: one whose reward model is not trained yet or whose extra is not installed is skipped
            typer.secho(f"skipped {n}: {e}", fg=typer.colors.YELLOW, err=True)
            names.remove(n)
    results = env_checks.check_tasks(tasks)
    con.console.print(env_checks.results_table(results))
    if preflight:
        from rich.table import Table

        for n in names:
            over = [f"model.name={model}", f"task.name={n}"] + ([f"loop.steps={steps}"] if steps is not None else [])
            rep = run_preflight.preflight(
                load_config(None, over), prompts, groups, log=lambda s: typer.echo(s, err=True)
            )
            table = Table(title=f"preflight: {model} on {n}")
            table.add_column("measure")
            table.add_column("value", overflow="fold")
            for k, v in rep.rows():
                table.add_row(k, v)
            con.console.print(table)
            from posttrain.obs.preflight_verdicts import format_verdicts

            con.console.print(
                format_verdicts(rep.verdicts, f"preflight verdicts: {model} on {n}"), markup=False, highlight=False
            )
    if not all(r.ok for r in results):
        raise typer.Exit(1)


init_app = typer.Typer(add_completion=False, help="Start something new from a runnable template.")
app.add_typer(init_app, name="init")


@init_app.command("task")
def init_task(
    name: str = typer.Argument(..., help="the task's name; writes NAME.py"),
    directory: Path = typer.Option(Path("."), "--dir", help="folder to write into"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing file"),
) -> None:
    """Write a runnable task file: rows, rewards, a demonstrate hook, smoke checks, and how to train it."""
    from posttrain.tasks.scaffold import write_task_file

    try:
        path = write_task_file(name, directory, force)
    except (FileExistsError, ValueError) as e:
        fail(str(e))
    typer.echo(
        f"wrote {path}\nnext:\n  posttrain env check --task {path}:make_task\n"
        f"  posttrain env check --task {path}:make_task --preflight\n"
        f"  posttrain train task.name={path}:make_task loop.steps=15"
    )


def build_task_app(task_name: str, model: str = "default", seed: int = 0, log=print, max_action_chars: int = 200_000):
    """`posttrain env serve`: a task by name (built-in, file.py:fn, module:fn) with `model`'s tokenizer."""
    from posttrain.envs import openenv_server
    from posttrain.models.load import ensure_pad_token, load_model
    from posttrain.tasks.load import load_task

    task = load_task(task_name, seed=seed)
    _, tok = load_model(model, seed=seed, log=log)
    ensure_pad_token(tok)
    return openenv_server.create_task_app(task, tok, max_action_chars=max_action_chars)
