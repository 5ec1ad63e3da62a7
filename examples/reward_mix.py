"""A reward mix in the watercolours spirit: a cheap gate, a length shaping term, an LLM judge and a learned
scorer, with the programmatic rule as the held-out pass.

    posttrain rm train --layers 6 --max-train-pairs 2400 --out runs/rm/blurb     # the learned scorer (once)
    posttrain train task.name=examples/reward_mix.py:make_task task.options.rm=runs/rm/blurb loop.steps=30

The components, in the order the rubric scores them (a later one is never called for a sample a gate threw out):

| component | kind | weight | why |
|---|---|---|---|
| `plain_line` | gate (programmatic, free) | 0 | one line of plain text, no markup or links: fails zero the whole reward |
| `length` | shaping (programmatic) | 0.3 | 1 up to 20 words, falling linearly to 0 at 40: keeps blurbs short |
| `judge` | LLM judge (local default model, yes/no) | 0.5 | "does this describe a product?": a cheap semantic check |
| `reward_model` | learned scorer (Bradley-Terry RM) | 1.0 | the preferences; what the rule cannot say in a regex |
| `hidden_rule` | verifier, weight 0 | 0 | the held-out pass (names the colour, at most 20 words) |

The gate runs first and costs nothing, so the judge and the reward model only see samples worth scoring (the judge
also caches its answers on disk: docs/judges.md).
"""

import re

from posttrain.envs.task import Task
from posttrain.tasks import product_blurb
from posttrain.rewards.judges import JudgeRunner, LocalHFBackend, PointwiseJudge
from posttrain.rewards.reward_model import default_rm_dir, reward_model
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.rewards.text import completion_text

MARKUP = re.compile(r"https?://|www\.|[<>{}\[\]#*`|]")


def plain_line(completions, **kwargs) -> list[float]:
    """1.0 for one non-empty line of plain text (no markup, links or lists)."""
    out = []
    for c in completions:
        t = completion_text(c).strip()
        out.append(1.0 if t and "\n" not in t and not MARKUP.search(t) else 0.0)
    return out


def length(completions, max_words: int = 20, **kwargs) -> list[float]:
    """1 up to `max_words` words, then linearly down to 0 at twice that."""
    n = [len(completion_text(c).split()) for c in completions]
    return [max(0.0, min(1.0, 2.0 - k / max_words)) for k in n]


def make_rubric(judge, scorer) -> Rubric:
    return Rubric([
        RewardComponent("plain_line", plain_line, weight=0.0),
        RewardComponent("length", length, weight=0.3, pass_threshold=1.0),
        RewardComponent("judge", judge, weight=0.5, pass_threshold=0.5),
        RewardComponent("reward_model", scorer, weight=1.0, pass_threshold=0.0),
        RewardComponent("hidden_rule", product_blurb.hidden_rule, weight=0.0),
    ], pass_component="hidden_rule", gates=["plain_line"])


def make_task(rm: str | None = None, judge_model: str = "default", n_train: int = 400, n_eval: int = 48) -> Task:
    base = product_blurb.make_task(reward="rule", n_train=n_train, n_eval=n_eval)
    judge = PointwiseJudge(JudgeRunner(LocalHFBackend(judge_model), timeout_s=600, max_retries=0),
                           "Text: {completion}\n\nIs this text a description of a product? Answer Yes or No.",
                           name="judge")
    scorer = reward_model(rm or default_rm_dir("product-blurb"))
    return Task(name="product-blurb-mix", train_rows=base.train_rows, eval_rows=base.eval_rows,
                rubric=make_rubric(judge, scorer), max_tokens=base.max_tokens, stop=list(base.stop),
                judges={"judge": judge}, description="product blurbs rewarded by a gate, length, a judge and an RM")
