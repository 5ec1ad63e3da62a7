"""Built-in tasks, by name. Each module exposes `make_task(**options) -> Task`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

BUILTIN_TASKS: dict[str, str] = {
    "json-extract": "posttrain.tasks.json_extract",
    "json-extract-judged": "posttrain.tasks.json_judged",
    "count-a": "posttrain.tasks.count_a",
    "code-tests": "posttrain.tasks.code_tests",
    "feature-deletion": "posttrain.tasks.feature_deletion",
    "search-qa": "posttrain.tasks.search_qa",
    "coding-agent": "posttrain.tasks.coding_agent.task",
    "product-blurb": "posttrain.tasks.product_blurb",
    "listing-summary": "posttrain.tasks.listing_summary",
    "reversal": "posttrain.tasks.reversal.task",
    "arith": "posttrain.tasks.arith",
    "ttrl": "posttrain.tasks.ttrl",
    "decision-routing": "posttrain.tasks.decision_routing",
    "drawing": "posttrain.tasks.drawing",
    "mixture": "posttrain.tasks.mixture",
}


def builtin_task_factory(name: str) -> Callable[..., Any]:
    module = importlib.import_module(BUILTIN_TASKS[name])
    return module.make_task
