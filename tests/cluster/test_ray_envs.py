"""cluster.envs=ray: each episode's tools and state on Ray env workers across two (simulated) nodes; a worker
killed with SIGKILL mid-episode is replaced and its episodes run again; a hung one is killed; retired past
max_restarts; a task loaded from a file ships its code to the workers; bad settings are refused."""

import asyncio
import os
import signal
import sys
import time

import pytest

from posttrain.cluster.ray_episodes import EnvWorkerPoolError, EnvWorkers, remote_env
from posttrain.config import load_config
from posttrain.envs.scoring import scored_by
from posttrain.envs.task import Task
from posttrain.envs.tool_env import EpisodeEnd
from posttrain.envs.tools import ToolError
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams

try:  # the workers cannot import this test module by name: its classes and functions travel by value
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ImportError:  # the refusal tests below run without Ray
    pass

BUMP = '<tool_call>{"name": "bump", "arguments": {"by": 1}}</tool_call>'
BAD = '<tool_call>{"name": "bump", "arguments": {"by": -1}}</tool_call>'
ANSWER = '<tool_call>{"name": "answer", "arguments": {"text": "done"}}</tool_call>'


KILL = '<tool_call>{"name": "bump", "arguments": {"by": 7}}</tool_call>'


# Like tests/envs/test_tool_env.py's _Counter, with faults; kept here because the workers get this module by value
# (importing that one would pickle it by a name the workers cannot import).
class Counter:
    """Per-episode state: a counter only this episode's calls move. `marker`: a file whose absence makes the
    first `bump(by=7)` (fault "kill") or the first `finish` (fault "hang") kill or hang its worker, once."""

    def __init__(self, row, marker=None, fault=None):
        self.n, self.marker, self.fault = 0, marker, fault
        self.tools = [self.bump, self.answer]

    def _fault_once(self, kind):
        if self.fault != kind or self.marker is None:
            return
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))  # once, across every worker process
        except FileExistsError:
            return
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)  # hang: the driver's timeout must end it

    def bump(self, by: int = 1) -> str:
        """Add to the counter."""
        if by == 7:
            self._fault_once("kill")
            by = 1
        if by < 0:
            raise ToolError("by must be >= 0")
        self.n += by
        return str(self.n)

    def answer(self, text: str) -> str:
        """Final answer."""
        return "ok"

    def finish(self, final_call):
        self._fault_once("hang")
        return EpisodeEnd(metrics={"count": float(self.n), "pid": float(os.getpid())},
                          columns={"count": self.n})


def _task(marker=None, fault=None):
    def counted(completions, count, **kw):
        return [float(c) for c in count]

    rows = [{"prompt": [{"role": "user", "content": "count"}]}]
    t = Task("counter", rows, rows, Rubric([RewardComponent("counted", counted)]), tools=Counter(None).tools,
             max_turns=5, final_tool="answer")
    t.episode = lambda row: Counter(row, marker, fault)
    return t


def _cc(**kw):
    over = ["cluster.envs=ray", "cluster.address=auto", "cluster.num_env_workers=2", "cluster.env_worker_num_cpus=1",
            "cluster.actor_timeout_s=60"] + [f"cluster.{k}={v}" for k, v in kw.items()]
    return load_config(None, over).cluster


def _sampler(tok, replies):
    return ScriptedSampler(tok, replies, end_token_id=tok.convert_tokens_to_ids("<|im_end|>"))


def _rollouts(env, tok, scripts):
    async def go():
        trajs = await asyncio.gather(*(env.rollout(env.task.train_rows[0], _sampler(tok, s)) for s in scripts))
        trajs = await scored_by(env, trajs)
        return trajs

    return asyncio.run(go())


def test_episodes_live_on_workers_on_both_nodes(two_nodes, tiny):
    _, tok = tiny
    workers = EnvWorkers.start(_cc(), _task())
    try:
        assert len({s.node_id for s in workers.slots}) == 2  # one worker per one-CPU node
        env = remote_env(_task(), workers, tok, SampleParams())
        trajs = _rollouts(env, tok, [[BUMP, BAD, BUMP, ANSWER], [BUMP, ANSWER], [ANSWER], [BUMP, BUMP, BUMP, ANSWER]])
        assert [t.metrics["count"] for t in trajs] == [2, 1, 0, 3]  # each episode its own state
        assert [t.reward for t in trajs] == [2.0, 1.0, 0.0, 3.0]  # finish's columns reached the rubric
        assert {int(t.metrics["pid"]) for t in trajs} == {s.pid for s in workers.slots}  # ran on the workers
        assert os.getpid() not in {int(t.metrics["pid"]) for t in trajs}
        tool_msgs = [m["content"] for m in trajs[0].messages if m["role"] == "tool"]
        assert tool_msgs[1] == "error: bump: by must be >= 0"  # a worker's ToolError reads as a local one
        m = workers.drain_metrics()
        assert m["cluster/env_episodes"] == 4 and m["cluster/env_nodes"] == 2
        assert m["cluster/env_worker_restarts"] == 0 and m["cluster/env_workers_alive"] == 2
        assert workers.drain_metrics()["cluster/env_episodes"] == 0  # counters are per drain
    finally:
        workers.close()


def test_worker_killed_mid_episode_is_replaced_and_the_episode_runs_again(two_nodes, tiny, tmp_path):
    _, tok = tiny
    task = _task(str(tmp_path / "killed"), "kill")
    workers = EnvWorkers.start(_cc(), task)
    try:
        env = remote_env(task, workers, tok, SampleParams())
        # The first episode's first call SIGKILLs its worker: it starts over (with the script's next replies) on the
        # replacement; the second episode, opened at the same time on the other worker, is not touched.
        trajs = _rollouts(env, tok, [[KILL, BUMP, ANSWER], [BUMP, BUMP, ANSWER]])
        assert [t.metrics["count"] for t in trajs] == [1, 2]  # complete episodes, the first counted from zero
        assert not any(t.failed for t in trajs)
        m = workers.drain_metrics()
        assert m["cluster/env_worker_restarts"] == 1 and m["cluster/env_reissued"] == 1
        assert m["cluster/env_workers_alive"] == 2
        assert sorted(s.incarnation for s in workers.slots) == [0, 1]
    finally:
        workers.close()


def test_hung_worker_is_killed_after_the_timeout_and_replaced(two_nodes, tiny, tmp_path):
    _, tok = tiny
    task = _task(str(tmp_path / "hung"), "hang")
    workers = EnvWorkers.start(_cc(actor_timeout_s=15), task)  # the replacement's start must fit in it
    try:
        env = remote_env(task, workers, tok, SampleParams())
        t0 = time.perf_counter()
        (traj,) = _rollouts(env, tok, [[BUMP, ANSWER, BUMP, ANSWER]])
        assert traj.metrics["count"] == 1 and time.perf_counter() - t0 < 100  # not the hang's 120 s
        m = workers.drain_metrics()
        assert m["cluster/env_worker_restarts"] == 1 and m["cluster/env_reissued"] == 1
    finally:
        workers.close()


def test_past_max_restarts_the_workers_retire_and_the_rollout_fails_clearly(two_nodes, tiny, tmp_path):
    _, tok = tiny
    task = _task(str(tmp_path / "killed"), "kill")
    workers = EnvWorkers.start(_cc(max_restarts=0, num_env_workers=1), task)
    try:
        env = remote_env(task, workers, tok, SampleParams())
        with pytest.raises(EnvWorkerPoolError, match="lost its env worker 1 times"):
            _rollouts(env, tok, [[KILL, ANSWER]])
        with pytest.raises(EnvWorkerPoolError, match="every env worker is retired"):
            _rollouts(env, tok, [[ANSWER]])
    finally:
        workers.close()


TASK_FILE = '''
import os

def bump(by: int = 1) -> str:
    """Report the process."""
    return str(os.getpid())

def pid_seen(completions, **kw):
    return [0.0 for _ in completions]

def make_task():
    rows = [{"prompt": "call bump"}] * 8
    return {"train": rows, "eval": rows[:2], "rewards": [pid_seen], "tools": [bump], "max_turns": 2}
'''


def test_a_run_from_a_task_file_trains_with_its_tools_on_the_workers(two_nodes, tmp_path):
    from posttrain.loop import train
    from posttrain.obs import read_metrics

    path = tmp_path / "pid_task.py"
    path.write_text(TASK_FILE)  # a module the workers cannot import by name: its code must travel by value
    cfg = load_config(None, ["model.name=tiny-random", "model.threads=1", f"task.name={path}:make_task",
                             "logging.tensorboard=false", "logging.console=false", "loop.steps=2",
                             "loop.prompts_per_step=2", "algorithm.num_generations=2", "loop.eval_prompts=2",
                             "loop.save_every=0", "cluster.envs=ray", "cluster.address=auto",
                             "cluster.env_worker_num_cpus=0.5", f"run.output_dir={tmp_path}"])
    res = train(cfg)
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert len(recs) == 2
    # The tiny model rarely calls the tool, but every episode is opened on a worker (its finish runs there); step
    # 1's count also holds the env check's and the first eval's episodes.
    assert recs[0]["cluster/env_episodes"] >= 4 and recs[1]["cluster/env_episodes"] == 4
    assert all(r["cluster/env_workers_alive"] == 2 and r["cluster/env_worker_restarts"] == 0 for r in recs)
    assert two_nodes.is_initialized()  # the test's Ray: the run leaves it running


def test_bad_env_worker_settings_are_refused(tmp_path):
    from posttrain.config import ConfigError

    with pytest.raises(ConfigError, match="num_env_workers"):
        load_config(None, ["cluster.envs=ray", "cluster.num_env_workers=0"])
    with pytest.raises(ConfigError, match="envs"):
        load_config(None, ["cluster.envs=docker"])


def test_a_task_without_tools_is_refused_before_ray_starts(monkeypatch):
    import posttrain.cluster.ray_episodes as mod

    monkeypatch.setattr(mod.RaySession, "connect", lambda cc: pytest.fail("Ray must not start"))
    rows = [{"prompt": "x"}]
    plain = Task("plain", rows, rows, Rubric([RewardComponent("r", lambda completions, **kw: [0.0])]))
    with pytest.raises(ValueError, match="has no tools"):
        EnvWorkers.start(_cc(), plain)
    own = Task("own", rows, rows, plain.rubric, tools=Counter(None).tools, env_factory=lambda *a: None)
    with pytest.raises(ValueError, match="env_factory"):
        EnvWorkers.start(_cc(), own)


def test_coding_agent_demonstrations_resolve_with_episodes_on_the_workers(two_nodes, tiny):
    """The built-in multi-turn agent: each episode's repository copy, its edits, run_tests and the final grade on
    a worker; the scripted demonstrations resolve their issues there as they do in process."""
    from posttrain.tasks.load import load_task

    _, tok = tiny
    task = load_task("coding-agent")
    workers = EnvWorkers.start(_cc(), task)
    try:
        env = remote_env(task, workers, tok, SampleParams(max_tokens=512))
        rows = task.train_rows[:2]

        async def go():
            trajs = await asyncio.gather(*(env.rollout(r, _sampler(tok, task.demonstrate(r))) for r in rows))
            trajs = await scored_by(env, trajs)
            return trajs

        trajs = asyncio.run(go())
        assert [t.reward_components["tests_passed"] for t in trajs] == [1.0, 1.0]
        m = workers.drain_metrics()
        assert m["cluster/env_episodes"] == 2 and m["cluster/env_nodes"] == 2 and m["cluster/env_calls"] >= 10
    finally:
        workers.close()
