"""Finding a task's judges and applying the run's judge settings (`judge.*` config) to them."""

from __future__ import annotations

from typing import Any

from posttrain.rewards.judges.cache import JudgeCache


def task_judges(task: Any) -> list[Any]:
    """Every distinct judge of a task (objects with a `runner`): rubric components, group rewards, `task.judges`."""
    from posttrain.rewards.telemetry import metric_sources

    return [obj for obj in metric_sources(task) if hasattr(obj, "runner")]


def configure_task_judges(task: Any, cache: str | None = "default") -> None:
    """Point every judge of `task` at the cache file `cache` ('default', a path, or None for no cache). Judges
    that share a runner share the new cache too."""
    shared: list[tuple[Any, JudgeCache]] = []  # (old cache, its replacement): runners that shared one still do
    for j in task_judges(task):
        old = j.runner.cache
        new = next((n for o, n in shared if o is old), None)
        if new is None:
            new = JudgeCache(cache)
            shared.append((old, new))
        j.runner.cache = new
