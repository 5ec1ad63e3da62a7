"""Commands that read models and runs: `eval`, `report`, `diagnose`."""

from __future__ import annotations

from pathlib import Path

import typer

from posttrain.cli.app import app, fail

DATA = "<task.dataset>"  # the first task of an eval whose config builds it from data


@app.command("eval")
def eval_cmd(
    model: str = typer.Option(
        "default", "--model", help="'default', 'tiny-random', a HF folder, a run's final/ folder"
    ),
    task: list[str] = typer.Option(
        [],
        "--task",
        help="a task (default json-extract); repeat it for a suite "
        "(pass@1, pass@k and maj@k per task); with --set task.dataset=..., tasks after "
        "the data's",
    ),
    prompts: int = typer.Option(48, "--prompts", help="held-out prompts to evaluate (per task)"),
    temperature: float = typer.Option(0.0, "--temperature", help="0: greedy; a finite number >= 0"),
    samples: int = typer.Option(
        1, "--samples", help="completions per prompt, the k of pass@k: 1 to 1024 (> 1 needs --temperature > 0)"
    ),
    max_tokens: int | None = typer.Option(None, "--max-tokens"),
    option: list[str] = typer.Option(
        [],
        "--option",
        "-o",
        help="a task option KEY=VALUE (repeatable), as "
        "task.options.KEY=VALUE in train, e.g. -o rho=0.5 -o mode=reset_free; with "
        "several tasks, TASK:KEY=VALUE for one of them",
    ),
    answer_format: str = typer.Option(
        "auto",
        "--answer-format",
        help="how maj@k reads an answer: auto, answer_tag, boxed, last_line, last_number, none",
    ),
    json_out: Path | None = typer.Option(None, "--json", help="write the results (every task's metrics) here"),
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="a config override KEY=VALUE (repeatable), e.g. --set "
        "task.dataset=data.jsonl --set 'task.rewards=[{fn: math}]' for a task from data",
    ),
) -> None:
    """Pass rates of a model or a trained run on tasks' held-out prompts: one task's table, or a suite's."""
    from posttrain.config import load_config
    from posttrain.loop.components import build
    from posttrain.loop.evaluate import evaluate
    from posttrain.obs import console as con

    from_data = any(s.startswith("task.dataset=") for s in set_)  # the first task is the data's, not a name
    task = ([DATA] if from_data else []) + (list(task) or ([] if from_data else ["json-extract"]))
    options = _task_options(option, task)
    overrides = [
        f"model.name={model}",
        f"sampling.eval_temperature={temperature}",
        f"loop.eval_prompts={prompts}",
        f"loop.eval_samples={samples}",
    ] + ([] if from_data else [f"task.name={task[0]}"])
    if max_tokens:
        overrides.append(f"sampling.max_tokens={max_tokens}")
    overrides += [f"task.options.{k}={v}" for k, v in options[task[0]].items()] + list(set_)
    cfg = load_config(None, overrides)
    try:
        c = build(cfg, log=lambda s: typer.echo(s, err=True))
    except ValueError as e:  # a builtin ValueError from a component's own check of its settings
        fail(str(e))
    task[0] = c.task.name  # the data's task is named after its file
    options[task[0]] = options.pop(DATA, options.get(task[0], {}))
    if len(task) > 1 or json_out is not None:
        _eval_suite(c, task, options, prompts, samples, temperature, max_tokens, answer_format, json_out, model)
        return
    m, _ = evaluate(
        c.env,
        c.sampler,
        c.task.eval_rows[:prompts],
        c.eval_params,
        samples,
        progress=lambda s: typer.echo(s, err=True),
    )
    m["eval/reward"] = m["eval/reward/mean"]
    con.console.print(
        con.eval_table(
            f"{model} on {task[0]} ({min(prompts, len(c.task.eval_rows))} held-out prompts)",
            [(Path(model).name or model, m)],
        )
    )


def _task_options(option: list[str], tasks: list[str]) -> dict[str, dict[str, str]]:
    """-o KEY=VALUE for the only (or first) task, -o TASK:KEY=VALUE for a named one of a suite."""
    out: dict[str, dict[str, str]] = {t: {} for t in tasks}
    for o in option:
        key, eq, value = o.partition("=")
        target = tasks[0]
        for t in tasks:
            if key.startswith(t + ":"):
                target, key = t, key[len(t) + 1 :]
        if not eq or not key.strip():
            fail(f"--option takes KEY=VALUE (a task option), got {o!r}")
        out[target][key.strip()] = value
    return out


def _eval_suite(
    c,
    tasks: list[str],
    options: dict[str, dict[str, str]],
    prompts: int,
    samples: int,
    temperature: float,
    max_tokens: int | None,
    answer_format: str,
    json_out: Path | None,
    model: str,
) -> None:
    import json

    import yaml

    from posttrain.loop.eval_suite import SuiteSettings, SuiteTask, run_suite
    from posttrain.obs import console as con

    try:
        suite = [SuiteTask(c.task, prompts, answer_format, max_tokens)] + [
            SuiteTask.load(t, {k: yaml.safe_load(v) for k, v in options[t].items()}, prompts, answer_format)
            for t in tasks[1:]
        ]
    except ValueError as e:  # a builtin one: a task's own check of its options
        fail(str(e))
    for st in suite[1:]:
        st.max_tokens = max_tokens
    settings = SuiteSettings(samples=samples, temperature=temperature, max_tokens=max_tokens or 128)
    result = run_suite(suite, c.sampler, c.tokenizer, settings, progress=lambda s: typer.echo(s, err=True))
    con.console.print(con.suite_table(f"{model}: {len(suite)} tasks, {samples} samples per prompt", result.table()))
    if json_out is not None:
        json_out.write_text(json.dumps({"model": model, "temperature": temperature, **result.to_json()}, indent=2))
        typer.echo(f"wrote {json_out}", err=True)


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="a run directory (several with --compare)"),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="output path (default RUN_DIR/report.html; --compare: compare.html); a .png path writes the PNG summary",
    ),
    compare: bool = typer.Option(False, "--compare", help="overlay the curves of several runs in one page"),
    trace: Path | None = typer.Option(
        None, "--trace", help="also export the timeline as Chrome/Perfetto trace JSON to this path"
    ),
) -> None:
    """Write a self-contained HTML report of a run: curves, timing, timeline and a rollout viewer (docs/report.md)."""
    from posttrain.obs.html_report import write_chrome_trace, write_compare, write_html_report
    from posttrain.obs.report import write_report

    try:
        if compare:
            typer.echo(write_compare(run_dirs, out or Path("compare.html")))
            return
        if len(run_dirs) != 1:
            fail("report takes one run directory (pass --compare to overlay several)")
        run_dir = run_dirs[0]
        if not run_dir.is_dir():
            fail(f"run directory not found: {run_dir}")
        if trace is not None:
            typer.echo(write_chrome_trace(run_dir, trace))
        if out is not None and out.suffix.lower() == ".png":
            typer.echo(write_report(str(run_dir), str(out)))
        else:
            typer.echo(write_html_report(run_dir, out))
    except (ValueError, RuntimeError) as e:  # builtins from obs/report.py: no records, matplotlib missing
        fail(str(e))


@app.command()
def diagnose(
    run_dir: Path = typer.Argument(..., help="a run directory (finished or still running)"),
    as_json: bool = typer.Option(False, "--json", help="print the verdicts as JSON"),
) -> None:
    """Why a run stopped learning: the live diagnostics' verdicts and advice, from the run's files only."""
    import json

    from posttrain.obs.diagnose_run import diagnose as run_diagnose
    from posttrain.obs.diagnose_run import render

    if not run_dir.is_dir():
        fail(f"run directory not found: {run_dir}")
    try:
        diag = run_diagnose(run_dir)
    except ValueError as e:  # a builtin one: the run's config.yaml has diagnostics settings that do not validate
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(diag.to_json(), indent=2))
    else:
        typer.echo(render(diag))
