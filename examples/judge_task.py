"""A custom task that mixes an LLM judge with programmatic rewards: a gate, a judge, a verifier.

    posttrain judge audit task.name=examples/judge_task.py:make_task judge.audit_prompts=8
    posttrain train task.name=examples/judge_task.py:make_task judge.min_agreement=0.6 loop.steps=30

- `json_parse` (programmatic) gates the judge: text that is not JSON scores 0 whatever the judge says, so the
  judge is never asked to rescue, or be fooled by, prose.
- `judge` (an LLM, pointwise yes/no) rewards JSON that states the row's facts; it sees the facts column.
- `json_exact` (programmatic, weight 0) is the pass: what the audit compares the judge against and what the
  held-out pass rate measures.
- `ranking` (optional, `JUDGE_URL` set): a capable served judge ranks all G completions of a prompt in one
  call, as a group reward.

The judge runs on the built-in default model in process, or on any OpenAI-compatible endpoint when
`JUDGE_URL` is set (`posttrain serve --model M --port 8001`, vLLM, a hosted API with OPENAI_API_KEY).
"""

import os

from posttrain.envs.task import Task
from posttrain.tasks import json_extract
from posttrain.rewards.json_rewards import json_exact, json_parse
from posttrain.rewards.judges import (JudgeRunner, LocalHFBackend, OpenAIBackend, PointwiseJudge, RankingJudge)
from posttrain.rewards.rubric import RewardComponent, Rubric

QUESTION = ("Facts: {facts}\n\nJSON: {completion}\n\nDoes the JSON state these facts correctly? "
            "Answer Yes or No.")


def make_task(n_train: int = 200, n_eval: int = 32) -> Task:
    base = json_extract.make_task(n_train=n_train, n_eval=n_eval)
    url = os.environ.get("JUDGE_URL")
    backend = OpenAIBackend(url, timeout_s=30) if url else LocalHFBackend("default")
    judge = PointwiseJudge(JudgeRunner(backend, timeout_s=120, max_retries=2), QUESTION, name="judge")
    rubric = Rubric([
        RewardComponent("json_parse", json_parse, weight=0.2, pass_threshold=1.0),
        RewardComponent("judge", judge, weight=1.0, gate="json_parse", pass_threshold=0.5),
        RewardComponent("json_exact", json_exact, weight=0.0, pass_threshold=1.0),
    ], pass_component="json_exact")
    # The judge's question reads a `facts` column: the user message of each row (json-extract keeps the facts there).
    rows = lambda rs: [{**r, "facts": r["prompt"][-1]["content"]} for r in rs]  # noqa: E731
    return Task(name="json-judge-example", train_rows=rows(base.train_rows), eval_rows=rows(base.eval_rows),
                rubric=rubric, max_tokens=base.max_tokens, stop=list(base.stop),
                group_rewards=[RankingJudge(JudgeRunner(backend, timeout_s=120))] if url else [],
                judges={"judge": judge})
