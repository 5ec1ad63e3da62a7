"""cluster.envs=ray with failure isolation: a rollout that raises in the driver after its episode was opened on an
env worker fails that sample only (envs/isolate.py), and the run goes on, so the episode must not stay open on the
worker (its state held for good, its slot counted busy)."""

import asyncio
import sys

from posttrain.cluster.ray_episodes import EnvWorkers, remote_env
from posttrain.config import load_config
from posttrain.envs.isolate import safe_rollout
from posttrain.envs.task import Task
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams

try:  # the workers cannot import this test module by name: its classes travel by value
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ImportError:
    pass

BUMP = '<tool_call>{"name": "bump", "arguments": {}}</tool_call>'
ANSWER = '<tool_call>{"name": "answer", "arguments": {"text": "done"}}</tool_call>'


class Counter:
    def __init__(self, row):
        self.n = 0
        self.tools = [self.bump, self.answer]

    def bump(self) -> str:
        """Add one."""
        self.n += 1
        return str(self.n)

    def answer(self, text: str) -> str:
        """Final answer."""
        return "ok"


def _task():
    rows = [{"prompt": [{"role": "user", "content": "count"}]}]
    one = RewardComponent("one", lambda completions, **kw: [1.0] * len(completions))
    t = Task("counter", rows, rows, Rubric([one]), tools=Counter(None).tools, max_turns=4, final_tool="answer")
    t.episode = Counter
    return t


class ChokesOnSecondTurn(ScriptedSampler):
    """Its second reply breaks the driver's side (as a parser choking on it would), after the first reply's tool
    call opened the episode on a worker."""

    async def sample(self, prompts_P, params, n=1):
        if self.calls == 1:
            raise RecursionError("maximum recursion depth exceeded while parsing the reply")
        return await super().sample(prompts_P, params, n)


def test_a_rollout_that_raises_mid_episode_leaves_nothing_open_on_its_worker(two_nodes, tiny):
    _, tok = tiny
    task = _task()
    cc = load_config(None, ["cluster.envs=ray", "cluster.address=auto", "cluster.num_env_workers=2",
                            "cluster.env_worker_num_cpus=1", "cluster.actor_timeout_s=60"]).cluster
    workers = EnvWorkers.start(cc, task)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    try:
        env = remote_env(task, workers, tok, SampleParams())
        row = task.train_rows[0]

        async def go():
            chokes = [ChokesOnSecondTurn(tok, [BUMP, ANSWER], end_token_id=end) for _ in range(3)]
            bad = await asyncio.gather(*(safe_rollout(env, row, s) for s in chokes))
            good = await safe_rollout(env, row, ScriptedSampler(tok, [BUMP, ANSWER], end_token_id=end))
            return bad, good

        bad, good = asyncio.run(go())
        assert all(t.failed and t.failed_in == "rollout" and "RecursionError" in t.error for t in bad)
        assert not good.failed and good.metrics["tool_calls"] == 2
        assert workers.drain_metrics()["cluster/env_episodes"] == 4  # the failed ones did open theirs
        assert [s.open for s in workers.slots] == [0, 0]
        assert sum(two_nodes.get([s.handle.open_episodes.remote() for s in workers.slots])) == 0
    finally:
        workers.close()
