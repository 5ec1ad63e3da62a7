"""Run directories: resolved config, package versions, git commit and seed, written at start."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import time
from pathlib import Path

PACKAGES = ["posttrain", "torch", "transformers", "peft", "pydantic", "numpy", "gguf", "jsonschema"]


def make_run_dir(output_dir: str, name: str | None, task: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = name or f"{task.replace('/', '_').replace(':', '_')}-{stamp}"
    path = Path(output_dir) / base
    i = 1
    while path.exists():
        path = Path(output_dir) / f"{base}-{i}"
        i += 1
    path.mkdir(parents=True)
    return path


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def git_commit() -> str | None:
    try:
        src = Path(__file__).resolve().parent
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True, timeout=5)
        if r.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=src, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        return r.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def write_run_info(run_dir: Path, config_yaml: str, seed: int) -> None:
    (run_dir / "config.yaml").write_text(config_yaml)
    info = {
        "seed": seed,
        "git_commit": git_commit(),
        "versions": package_versions(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
    }
    (run_dir / "run_info.json").write_text(json.dumps(info, indent=2))
