"""A verifiers (0.4, `verifiers.v1`) environment trained by posttrain, written against verifiers' public API:

    posttrain train task.name=verifiers:examples/verifiers_env.py:load_environment model.name=tiny-random \
        loop.steps=30 trainer.lr=3e-3 algorithm.num_generations=8

An addition question per task; the headline reward is the exact answer, a small second reward prefers short
replies. posttrain plays it through its token-capturing endpoint (docs/verifiers.md), so the trained tokens are the
ones sampled. The same file with any verifiers Taskset or Env is how you bring your own.
"""

from __future__ import annotations

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str = ""


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0, priority=1)
    async def exact(self, task: SumData, trace: vf.Trace) -> float:
        """The headline: the reply is the sum and nothing else."""
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.2)
    async def brief(self, trace: vf.Trace) -> float:
        """Shaping: replies of at most three characters."""
        return 1.0 if len(trace.last_reply.strip()) <= 3 else 0.0


class SumConfig(vf.TasksetConfig):
    n: int = 200


class SumSet(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        for i in range(self.config.n):
            a, b = i % 10, (i * 7) % 10
            yield SumTask(SumData(prompt=f"What is {a} + {b}? Answer with the number only.", answer=str(a + b)),
                          self.config.task)


def load_environment(n: int = 200):
    return SumSet(SumConfig(n=n))
