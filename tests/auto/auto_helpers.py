"""Helpers of the posttrain auto tests: a program.md writer and a scripted proposer."""


import yaml

from posttrain.auto.proposers import Proposal

BASE = {"model": {"name": "tiny-random"}, "task": {"name": "count-a"}, "loop": {"eval_prompts": 4},
        "logging": {"tensorboard": False}}


def program_text(**over) -> str:
    d = {"goal": "test", "metric": "eval/pass_rate", "direction": "max",
         "budget": {"trial": {"steps": 2, "timeout_s": 30}, "total": {"trials": 3}},
         "seeds": [0, 1], "noise": 0.0,
         "search": {"trainer.lr": {"low": 1e-6, "high": 1e-2, "log": True}},
         "frozen": ["model.name", "task.name"], "pruning": False}
    d.update(over)
    return "# a program\n\nsome prose\n\n```yaml\n" + yaml.safe_dump(d, sort_keys=False) + "```\n"


class Scripted:
    """A proposer that proposes a fixed list of params, in order."""

    def __init__(self, params_list):
        self.items = list(params_list)
        self.finished, self.baselines = [], []

    def baseline(self, params, value):
        self.baselines.append((params, value))

    def propose(self, incumbent=None, history=""):
        return Proposal(self.items.pop(0), "scripted", "test")

    def intermediate(self, p, step, value):
        return False

    def finish(self, p, value, state):
        self.finished.append((p.params, value, state))


