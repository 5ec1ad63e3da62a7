"""A prompt's characters bounded against the model's context, before anything tokenizes it.

The sampler's context budget (sampling/context.py) fails a sample whose prompt does not fit, but only after the
prompt is tokenized: a 200 MB prompt line made the tokenizer ask for 4 GiB and abort the whole process. No text
averages more than a few characters a token (English about 4; a run of spaces in a large vocabulary a few dozen),
so a prompt over `CHARS_PER_TOKEN` characters for every position of the context cannot fit, and is refused by
split and row before any tokenizer sees it (loop/components.build, once the model's context is known; `--dry-run`
with sampling.max_context set).
"""

from __future__ import annotations

from typing import Any

from posttrain.envs.task import Task, TaskLoadError

CHARS_PER_TOKEN = 32


def prompt_chars(prompt: Any) -> int:
    """The characters a prompt's text takes: a string's, or the sum of its chat messages' text (content as a
    string, or as a list of parts with `text`)."""
    if isinstance(prompt, str):
        return len(prompt)
    total = 0
    for m in prompt if isinstance(prompt, list) else []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return total


def check_prompt_sizes(task: Task, max_context: int) -> None:
    """TaskLoadError naming the first row whose prompt is over `max_context` * CHARS_PER_TOKEN characters."""
    limit = max_context * CHARS_PER_TOKEN
    for split, rows in (("train", task.train_rows), ("eval", task.eval_rows)):
        for i, row in enumerate(rows):
            n = prompt_chars(row.get("prompt"))
            if n > limit:
                raise TaskLoadError(
                    f"task {task.name!r}: {split} row {i}'s prompt is {n:,} characters, far over what the model's "
                    f"context of {max_context} tokens holds (at most {limit:,} characters at {CHARS_PER_TOKEN} a "
                    "token); shorten or drop that row"
                )
