"""Shared constants for the sandbox tests (a plain module: tests/ has no packages)."""

import os

import pytest

MARK = f"ptsbmark{os.getpid()}"  # attack code names files and processes with this, so leftovers are findable

# Out-of-process pytest grading gives each of its two processes a uid of its own, which only root can do.
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="out-of-process grading needs root (a uid per process)")
