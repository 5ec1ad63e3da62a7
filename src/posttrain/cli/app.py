"""The typer app every command module registers on, the one way a command fails, and the install check every
command runs first (models/install_check.py: a CUDA torchvision beside the CPU torch breaks every model load with
an error that names neither the cause nor the fix; before any command the packages' metadata is compared with
torch's, and an error that escapes a command with one of them in its chain gets the same fix printed).

Every error a user can cause is a `PosttrainError` (posttrain/errors.py): it is caught here, once, for every
command, and printed as `error: <message>` and its fix, exit 2, no traceback. Any other exception is a bug and
keeps its traceback. The catch sits in the root group's `invoke`, which every command (sub-groups included) runs
inside, whether it is started by `posttrain` or by a test's CliRunner."""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from posttrain.errors import PosttrainError
from posttrain.models.install_check import broken_message, companion_in_chain, mismatched_companions


def fail(msg: str) -> NoReturn:
    """The one way a command fails on a user's mistake: `error: <msg>` on stderr, exit 2 (every command module)."""
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _user_message(e: BaseException) -> str | None:
    """What the user reads for `e`, or None for a bug (it keeps its traceback). A broken torch companion in the
    chain comes first: whatever error it caused, installing the matching build is the fix."""
    if isinstance(e, (typer.Exit, typer.Abort)):  # a command's own exit (typer's names, whichever click it uses)
        return None
    name = companion_in_chain(e) if isinstance(e, Exception) else None
    if name is not None:
        first = (str(e).splitlines() or [""])[0][:300]
        return f"{type(e).__name__}: {first}\n{broken_message([f'{name} fails to import'])}"
    if isinstance(e, PosttrainError):
        return e.hint()
    return None


class _Group(TyperGroup):
    """The root command group: runs the command, and turns an error the user can fix into its message."""

    def invoke(self, ctx: Any) -> Any:  # Any: a newer typer has its own copy of click's Context, an older one click's
        try:
            return super().invoke(ctx)
        except Exception as e:
            msg = _user_message(e)
            if msg is None:
                raise
            fail(msg)


app = typer.Typer(
    cls=_Group, add_completion=False, no_args_is_help=False, help="RL post-training for language models and agents."
)


def main() -> None:
    app()


@app.callback()
def _install_check(ctx: typer.Context) -> None:
    # No docstring: typer would show it as the app's help. Runs before every command (not for --help alone).
    if ctx.resilient_parsing:  # shell completion: say nothing
        return
    broken = mismatched_companions()
    if broken:
        fail(broken_message(broken))
