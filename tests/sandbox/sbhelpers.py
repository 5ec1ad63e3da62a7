"""Shared constants for the sandbox tests (a plain module: tests/ has no packages)."""

import os

MARK = f"ptsbmark{os.getpid()}"  # attack code names files and processes with this, so leftovers are findable
