"""No prompt reaches the tokenizer when its characters are far over what the model's context could hold
(tasks/prompt_size.py): a 200 MB prompt line once made the tokenizer ask for 4 GiB and abort the process. The run
checks every row when the model's context is known (loop/components.build), before anything tokenizes a prompt."""

from __future__ import annotations

import json

import pytest

from posttrain.envs.task import Task, TaskLoadError
from posttrain.rewards.rubric import Rubric


def _task(prompts: list) -> Task:
    rows = [{"prompt": p} for p in prompts]
    return Task("t", train_rows=rows, eval_rows=rows[:1], rubric=Rubric.from_funcs([lambda completions, **k: [0.0]]))


def test_a_prompt_far_over_the_context_is_refused_by_split_and_row():
    from posttrain.tasks.prompt_size import CHARS_PER_TOKEN, check_prompt_sizes

    limit = 100 * CHARS_PER_TOKEN
    check_prompt_sizes(_task(["a", "b" * limit]), max_context=100)  # at the bound: the sampler's budget decides
    with pytest.raises(TaskLoadError) as e:
        check_prompt_sizes(_task(["a", "b", "c" * (limit + 1)]), max_context=100)
    assert str(e.value) == (
        f"task 't': train row 2's prompt is {limit + 1:,} characters, far over what the model's context of 100 "
        f"tokens holds (at most {limit:,} characters at {CHARS_PER_TOKEN} a token); shorten or drop that row")
    chat = [{"role": "system", "content": "x" * limit}, {"role": "user", "content": "y"}]
    with pytest.raises(TaskLoadError, match="train row 0's prompt is"):
        check_prompt_sizes(_task([chat]), max_context=100)


def test_the_run_refuses_it_before_any_prompt_is_tokenized(tmp_path, monkeypatch):
    """tiny-random has 1024 positions: a 40,000-character prompt cannot fit, and the tokenizer is never called."""
    from posttrain.config import load_config
    from posttrain.loop import components

    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(20)]
    rows[7]["prompt"] = "9 " * 20_000
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, ["model.name=tiny-random", f"task.dataset={data}", "task.rewards=[{fn: math}]",
                             "task.eval_fraction=0.05"])
    with pytest.raises(TaskLoadError, match="prompt is 40,000 characters, far over what the model's context of 1024"):
        components.build(cfg, log=lambda *a: None)
