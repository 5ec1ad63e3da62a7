"""A task rewarded only by a reference-guided LLM judge: arithmetic, where the judge is shown the right answer.

The policy never sees the answer; the judge does, and is asked whether the reply gives it. A 135M judge cannot
tell good JSON from prose (docs/judges.md), but comparing a reply with a given number is within its reach, which is
the point of reference-guided judging (verifiers' JudgeRubric passes the answer the same way). The programmatic
check (the last integer equals the answer) has weight 0: it is only the held-out pass rate, so any gain comes from
the judge alone.

    posttrain judge audit task.name=examples/judged_arith.py:make_task
    posttrain train task.name=examples/judged_arith.py:make_task
"""

from __future__ import annotations

from posttrain.envs.task import Task
from posttrain.envs.tasks import arith
from posttrain.rewards.judges import JudgeRunner, LocalHFBackend, PointwiseJudge
from posttrain.rewards.rubric import RewardComponent, Rubric

QUESTION = ("Question: {prompt}\nCorrect answer: {answer}\nStudent's reply: {completion}\n\n"
            "Is the student's reply exactly the correct answer {answer}? Answer Yes or No.")


def make_task(seed: int = 0, n_train: int = 64, n_eval: int = 32, judge_model: str = "default",
              max_value: int = 20) -> Task:
    base = arith.make_task(n_train=n_train, n_eval=n_eval, seed=seed, max_value=max_value)
    judge = PointwiseJudge(JudgeRunner(LocalHFBackend(judge_model), batch_size=8, timeout_s=600.0, max_retries=0),
                           QUESTION, name="judge")
    rubric = Rubric([
        RewardComponent("judge", judge, weight=1.0, pass_threshold=0.5),
        RewardComponent("correct", arith.correct, weight=0.0),  # measured, never rewarded
    ], pass_component="correct")
    return Task(name="arith-judged", train_rows=base.train_rows, eval_rows=base.eval_rows, rubric=rubric,
                max_tokens=base.max_tokens, description="arithmetic rewarded only by a reference-guided judge",
                smoke_checks=base.smoke_checks, judges={"judge": judge})
