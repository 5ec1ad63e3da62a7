"""posttrain's command line: parsing and calling the library, nothing more. One module per group of commands;
importing them registers their commands on `app`, in the order `posttrain --help` lists them."""

from posttrain.cli.app import app, main

# Registration order is the help order: training first.
from posttrain.cli import train_cmds  # noqa: F401 - importing registers the commands  # isort: skip
from posttrain.cli import inspect_cmds  # noqa: F401 - importing registers the commands  # isort: skip
from posttrain.cli import serve_cmds  # noqa: F401 - importing registers the commands  # isort: skip
from posttrain.cli import reward_cmds  # noqa: F401 - importing registers the commands  # isort: skip

__all__ = ["app", "main"]
