"""Built-in tasks, by name. Each module exposes `make_task(**options) -> Task`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

BUILTIN_TASKS: dict[str, str] = {
    "json-extract": "posttrain.envs.tasks.json_extract",
    "json-extract-judged": "posttrain.envs.tasks.json_judged",
    "count-a": "posttrain.envs.tasks.count_a",
    "code-tests": "posttrain.envs.tasks.code_tests",
    "feature-deletion": "posttrain.envs.tasks.feature_deletion",
    "search-qa": "posttrain.envs.tasks.search_qa",
    "coding-agent": "posttrain.envs.coding_agent.task",
    "product-blurb": "posttrain.envs.tasks.product_blurb",
    "listing-summary": "posttrain.envs.tasks.listing_summary",
    "reversal": "posttrain.envs.reversal.task",
    "arith": "posttrain.envs.tasks.arith",
    "ttrl": "posttrain.envs.tasks.ttrl",
    "decision-routing": "posttrain.envs.tasks.decision_routing",
    "drawing": "posttrain.envs.tasks.drawing",
}


def builtin_task_factory(name: str) -> Callable[..., Any]:
    module = importlib.import_module(BUILTIN_TASKS[name])
    return module.make_task
