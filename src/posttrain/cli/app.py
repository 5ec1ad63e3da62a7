"""The typer app every command module registers on, the one way a command fails, and the install check every
command runs first (models/install_check.py: a CUDA torchvision beside the CPU torch breaks every model load with
an error that names neither the cause nor the fix; before any command the packages' metadata is compared with
torch's, and an error that escapes a command with one of them in its chain gets the same fix printed)."""

from __future__ import annotations

from typing import Any, NoReturn

import typer

from posttrain.models.install_check import (  # noqa: F401 - FIX and the checks are re-exported for the CLI's tests
    FIX,
    broken_message,
    companion_in_chain,
    companion_mismatch,
    mismatched_companions,
)


class _App(typer.Typer):
    """typer.Typer whose every run turns an error that comes from a broken torch companion into the fix."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as e:
            name = companion_in_chain(e)
            if name is None:
                raise
            first = (str(e).splitlines() or [""])[0][:300]
            typer.secho(
                f"error: {type(e).__name__}: {first}\n{broken_message([f'{name} fails to import'])}",
                fg=typer.colors.RED,
                err=True,
            )
            raise SystemExit(2) from None


app = _App(add_completion=False, no_args_is_help=False, help="RL post-training for language models and agents.")


def _fail(msg: str) -> NoReturn:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def main() -> None:
    app()


@app.callback()
def _install_check(ctx: typer.Context) -> None:
    # No docstring: typer would show it as the app's help. Runs before every command (not for --help alone).
    if ctx.resilient_parsing:  # shell completion: say nothing
        return
    broken = mismatched_companions()
    if broken:
        _fail(broken_message(broken))
