"""The typer app every command module registers on, and the one way a command fails."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=False, help="RL post-training for language models and agents.")


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def main() -> None:
    app()
