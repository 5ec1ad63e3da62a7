"""verifiers (v1) environments run as posttrain envs (`task.name=verifiers:...`, envs/verifiers_env.py).

The environments are written here against verifiers' public API (no hub, no sandbox): a single-turn QA taskset
scored by exact match, a guessing game whose Env answers each guess (multi-turn, through `agent.interaction`),
envs that raise or hang, and the `say_a` taskset the learning test trains on (a reward for writing the letter a,
which a tiny random model learns within seconds, as count-a). The `load_*` functions are what `task.name` names.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1")
pytest.importorskip("fastapi")

THIS_FILE = __file__


# ---- environments, against verifiers' public API ----------------------------------------------------------------


class QAData(vf.TaskData):
    answer: str = ""


class QATask(vf.Task[QAData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0, priority=1)
    async def exact(self, task: QAData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.5)
    async def brevity(self, task: QAData, trace: vf.Trace) -> float:
        return 1.0 if len(trace.last_reply) <= 3 else 0.0

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class QASetConfig(vf.TasksetConfig):
    n: int = 6


class QASet(vf.Taskset[QATask, QASetConfig]):
    def load(self):
        for i in range(self.config.n):
            yield QATask(QAData(prompt=f"What is {i} + 1? Answer with the number.", answer=str(i + 1),
                                system_prompt="You add numbers."), self.config.task)


def load_qa(n: int = 6):
    return QASet(QASetConfig(n=n))


class GuessData(vf.TaskData):
    secret: int = 3
    max_guesses: int = 4
    reply_chars: int = 0  # pad the env's answers (an env that talks too much)
    explode: bool = False  # the env raises after the first guess
    hang: bool = False  # the env never answers
    slow_reward: bool = False  # the reward takes longer than the task's scoring timeout


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def found(self, task: GuessData, trace: vf.Trace) -> float:
        if task.slow_reward:
            await asyncio.sleep(30)
        return float(any((m.content or "").strip() == str(task.secret) for m in trace.assistant_messages))

    @vf.reward(weight=-0.1)
    async def guesses(self, task: GuessData, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class GuessSet(vf.Taskset[GuessTask, vf.TasksetConfig]):
    rows: list[dict] = [{}]

    def load(self):
        for r in self.rows:
            yield GuessTask(GuessData(prompt="I picked a number from 1 to 9. Guess it: reply with one number.", **r),
                            self.config.task)


class GuessEnv(vf.Env[vf.SingleAgentEnvConfig]):
    """The env answers each guess (higher / lower) until it is right or the guesses run out: verifiers v1's
    multi-turn env, its `env_response` written as control flow between `interaction.turn`s."""

    async def run(self, task, agents):
        data = task.data
        async with agents.agent.interaction(task) as play:
            segment = await play.turn()
            for _ in range(data.max_guesses - 1):
                if segment.terminated or segment.last_reply == str(data.secret):
                    return
                if data.explode:
                    raise RuntimeError("the guessing env broke")
                if data.hang:
                    await asyncio.sleep(3600)
                segment = await play.turn(_answer(segment.last_reply, data.secret) + "!" * data.reply_chars)


def _answer(reply: str, secret: int) -> str:
    try:
        return "higher" if int(reply) < secret else "lower"
    except ValueError:
        return "reply with one number"


def load_guess(rows: list[dict] | None = None):
    taskset = GuessSet(vf.TasksetConfig())
    taskset.rows = rows or [{}]
    return taskset, GuessEnv


def load_qa_with_a_user(n: int = 2):
    """verifiers' own two-agent env: a modeled user (untrainable, `null` harness) tells the assistant the task."""
    from verifiers.v1.envs.user_sim import UserSimEnv

    return QASet(QASetConfig(n=n)), UserSimEnv


class SayAData(vf.TaskData):
    word: str = ""


class SayATask(vf.Task[SayAData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def a_fraction(self, trace: vf.Trace) -> float:
        text = trace.last_reply
        return text.count("a") / len(text) if text else 0.0


class SayASet(vf.Taskset[SayATask, vf.TasksetConfig]):
    def load(self):
        words = ["cat", "dog", "sun", "map", "key", "box", "cup", "pen"]
        for i in range(80):
            w = words[(i * 5) % len(words)]
            yield SayATask(SayAData(prompt=[vf.UserMessage(content=f"say a {w} {i}")], word=w), self.config.task)


def load_say_a():
    return SayASet(vf.TasksetConfig())


# ---- helpers ------------------------------------------------------------------------------------------------------


def _spec(fn: str) -> str:
    return f"verifiers:{THIS_FILE}:{fn}"


def _load(fn: str, **options):
    from posttrain.tasks.load import load_task

    return load_task(_spec(fn), options)


def _play(task, tok, sampler, rows, params=None):
    """Roll out and score `rows` concurrently through the task's env; (trajectories, their counts: what the step's
    record reads of them)."""
    from posttrain.envs.base import make_env
    from posttrain.envs.scoring import scored_by
    from posttrain.types import SampleParams

    params = params or SampleParams(max_tokens=8)
    env = make_env(task, tok, params)

    async def go():
        trajs = await asyncio.gather(*(env.rollout(r, sampler, params) for r in rows))
        trajs = await scored_by(env, list(trajs))  # the scores joined into new records (Trajectory is frozen)
        await env.close()
        return trajs

    trajs = asyncio.run(go())
    counts = {
        "rollouts": len(trajs),
        "failed": sum(t.failed for t in trajs),
        "timeouts": int(sum(t.metrics["verifiers/timed_out"] for t in trajs)),
        "dropped_calls": int(sum(t.metrics["verifiers/dropped_calls"] for t in trajs)),
    }
    return trajs, counts


@pytest.fixture(scope="module")
def tok():
    from posttrain.models.tiny import tiny_tokenizer

    return tiny_tokenizer()


def _scripted(tok, replies):
    from posttrain.sampling.scripted import ScriptedSampler

    return ScriptedSampler(tok, replies)


# ---- loading --------------------------------------------------------------------------------------------------------


def test_a_taskset_becomes_rows_and_its_rewards_the_rubric():
    task = _load("load_qa", n=10, n_eval=3)
    assert len(task.train_rows) == 7 and len(task.eval_rows) == 3
    assert {r["verifiers_task"]["answer"] for r in task.train_rows + task.eval_rows} == {str(i) for i in range(1, 11)}
    assert task.train_rows[0]["prompt"].startswith("What is")
    comps = {c.name: c.weight for c in task.rubric.components}
    assert comps == {"exact": 1.0, "brevity": 0.5, "verifiers_other": 1.0}
    assert task.rubric.pass_component == "exact"  # the first reward verifiers runs (highest priority)
    assert _load("load_qa", pass_reward="brevity").rubric.pass_component == "brevity"


PLUGIN = """
import verifiers.v1 as vf

class CountConfig(vf.TasksetConfig):
    n: int = 3

class Count(vf.Taskset[vf.Task, CountConfig]):
    def load(self):
        for i in range(self.config.n):
            yield vf.Task(vf.TaskData(prompt=f"count to {i}"), self.config.task)

__all__ = ["Count"]
"""


def test_plugin_file_and_env_options(tmp_path):
    """`verifiers:path/env.py`: the file is a verifiers plugin module (a taskset package in one file);
    task.options are its env config, verifiers' `[env]` block."""
    plugin = tmp_path / "count_env.py"
    plugin.write_text(PLUGIN)
    from posttrain.tasks.load import load_task

    task = load_task(f"verifiers:{plugin}", {"taskset": {"n": 4}, "eval": {"taskset": {"n": 2}}})
    assert len(task.train_rows) == 4 and len(task.eval_rows) == 2


def test_bad_names_and_returns_are_one_line_errors(tmp_path):
    from posttrain.envs.task import TaskLoadError
    from posttrain.tasks.load import load_task

    bad = tmp_path / "bad.py"
    bad.write_text("def make():\n    return 3\n")
    with pytest.raises(TaskLoadError, match="must return a verifiers Env"):
        load_task(f"verifiers:{bad}:make")
    with pytest.raises(TaskLoadError, match="no-such-taskset"):
        load_task("verifiers:no-such-taskset")
    with pytest.raises(TaskLoadError, match="rejected|unexpected keyword"):
        _load("load_qa", bogus=1)


# ---- single turn -----------------------------------------------------------------------------------------------------


def test_single_turn_rewards_are_the_verifiers_rewards(tok):
    task = _load("load_qa", n=4, n_eval=0)
    rows = sorted(task.train_rows, key=lambda r: r["verifiers_task"]["answer"])  # answers 1, 2, 3, 4
    trajs, stats = _play(task, tok, _scripted(tok, ["2"]), rows)
    assert stats == {"rollouts": 4, "failed": 0, "timeouts": 0, "dropped_calls": 0}
    assert [t.reward for t in trajs] == [0.5, 1.5, 0.5, 0.5]  # exact (weight 1) + brevity (weight 0.5)
    assert [t.passed for t in trajs] == [False, True, False, False]
    assert trajs[1].reward_components == {"exact": 1.0, "brevity": 1.0, "verifiers_other": 0.0}
    assert all(len(t.turns) == 1 and t.completion_text == "2" and not t.failed for t in trajs)
    assert trajs[0].metrics["verifiers/reply_chars"] == 1.0  # a @vf.metric
    assert [m["role"] for m in trajs[0].messages] == ["system", "user", "assistant"]
    assert trajs[0].messages[0]["content"] == "You add numbers."


def test_turn_tokens_are_the_sampled_tokens(tiny):
    """Token fidelity: every turn of every trajectory is exactly what the sampler produced (ids and logprobs), one
    turn per model call, and the env's messages between turns are loss-masked."""
    from posttrain.loop.batch import sequences_from_groups
    from posttrain.models import stop_token_ids
    from posttrain.sampling import HFSampler
    from posttrain.sampling.scripted import CapturingSampler
    from posttrain.types import Group, SampleParams

    model, tk = tiny
    sampler = CapturingSampler(HFSampler(model, tk, stop_token_ids(model, tk), seed=0))
    guess = _load("load_guess", rows=[{"secret": 100, "max_guesses": 3}])  # never guessed: 3 model calls
    qa = _load("load_qa", n=3, n_eval=0)
    params = SampleParams(max_tokens=6)
    trajs = _play(guess, tk, sampler, guess.train_rows * 3, params)[0] + _play(qa, tk, sampler, qa.train_rows,
                                                                               params)[0]
    produced = {tuple(c.token_ids): c.logprobs for _, c in sampler.seen}
    assert len(sampler.seen) == 3 * 3 + 3
    for t in trajs:
        assert not t.failed, t.error
        assert len(t.turns) == t.metrics["verifiers/calls"] and t.metrics["verifiers/dropped_calls"] == 0
        for turn in t.turns:
            assert produced[tuple(turn.completion_ids)] == turn.completion_logprobs
    assert [len(t.turns) for t in trajs] == [3, 3, 3, 1, 1, 1]
    seq = sequences_from_groups([Group(0, trajs[:1])])[0]
    sampled = sum(len(turn.completion_ids) for turn in trajs[0].turns)
    assert sum(seq.loss_mask) == sampled < len(seq.loss_mask)  # the env's answers are in the sequence, masked


# ---- multi turn -----------------------------------------------------------------------------------------------------


def test_guessing_game_plays_several_turns(tok):
    task = _load("load_guess", rows=[{"secret": 3}, {"secret": 8}])
    by_secret = {r["verifiers_task"]["secret"]: r for r in task.train_rows + task.eval_rows}
    (t3,), _ = _play(task, tok, _scripted(tok, ["5", "1", "3"]), [by_secret[3]])
    (t8,), _ = _play(task, tok, _scripted(tok, ["5", "1", "3", "9"]), [by_secret[8]])
    assert [m["content"] for m in t3.messages if m["role"] == "user"][1:] == ["lower", "higher"]
    assert len(t3.turns) == 3 and t3.reward_components["found"] == 1.0 and t3.passed
    assert t3.reward == pytest.approx(1.0 - 0.3)
    assert len(t8.turns) == 4 and t8.reward_components["found"] == 0.0 and not t8.passed  # out of guesses
    assert t8.reward == pytest.approx(-0.4)
    assert t8.metrics["verifiers/turns"] == 4


def test_env_messages_are_cut_to_max_observation_chars(tok):
    task = _load("load_guess", rows=[{"secret": 3, "reply_chars": 50_000}], max_observation_chars=300)
    (t,), _ = _play(task, tok, _scripted(tok, ["5", "3"]), task.train_rows)
    answer = [m["content"] for m in t.messages if m["role"] == "user"][1]
    assert answer.startswith("lower!!!") and "truncated" in answer and len(answer) <= 300
    assert not t.failed and t.passed


def test_the_configs_max_observation_chars_reaches_the_harness(tok):
    from posttrain.config.task import TaskConfig
    from posttrain.tasks.from_config import task_from_config

    options = {"rows": [{"secret": 3, "reply_chars": 50_000}]}
    task = task_from_config(TaskConfig(name=_spec("load_guess"), options=options, max_observation_chars=300,
                                       env_check="off"))
    (t,), _ = _play(task, tok, _scripted(tok, ["5", "3"]), task.train_rows)
    answer = [m["content"] for m in t.messages if m["role"] == "user"][1]
    assert "truncated" in answer and len(answer) <= 300 and task.max_observation_chars == 300


def test_a_modeled_user_is_the_env_not_the_policy(tok):
    """verifiers' user-sim env: the user seat is played by the policy model but marked untrainable, so only the
    assistant's calls are recorded and trained; the user's words are env tokens of the assistant's trajectory."""
    task = _load("load_qa_with_a_user", n=2, n_eval=0)
    row = next(r for r in task.train_rows if r["verifiers_task"]["answer"] == "1")
    sampler = _scripted(tok, ["What is 0 + 1?", "1", "###DONE###"])  # user, assistant, user
    (t,), _ = _play(task, tok, sampler, [row])
    assert sampler.calls == 3 and not t.failed, t.error
    assert len(t.turns) == 1 and t.completion_text == "1" and t.passed
    assert t.metrics["verifiers/untrained_traces"] == 0 and t.metrics["verifiers/user_turns"] == 2
    assert [m["content"] for m in t.messages] == ["You add numbers.", "What is 0 + 1?", "1"]


TOOLS = """
import verifiers.v1 as vf


class Calc(vf.Toolset[vf.ToolsetConfig, vf.State]):
    @vf.tool
    async def add(self, a: int, b: int) -> str:
        \"\"\"Add two integers.\"\"\"
        return str(a + b)


if __name__ == "__main__":
    Calc.run()
"""

CALC_ENV = """
import verifiers.v1 as vf
from vf_calc_tools import Calc


class CalcTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Calc(vf.ToolsetConfig())]

    @vf.reward
    async def used_the_tool(self, trace) -> float:
        return float(bool(trace.tool_messages) and trace.last_reply == "5")


class CalcSet(vf.Taskset[CalcTask, vf.TasksetConfig]):
    def load(self):
        yield CalcTask(vf.TaskData(prompt="What is 2 + 3? Use the tool."), self.config.task)


__all__ = ["CalcSet"]
"""


def test_a_tool_env_calls_its_mcp_toolset(tok, tmp_path, monkeypatch):
    """verifiers' ToolEnv equivalent: the task's Toolset (an MCP server, started by verifiers as `python -m` in
    the local subprocess runtime) serves the model's tool call; the result comes back as the next turn's env
    message."""
    (tmp_path / "vf_calc_tools.py").write_text(TOOLS)
    (tmp_path / "calc_env.py").write_text(CALC_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the tool server process imports the toolset module
    from posttrain.tasks.load import load_task

    task = load_task(f"verifiers:{tmp_path / 'calc_env.py'}")
    call = '<tool_call>{"name": "calc_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    port_files = set(Path("/tmp").glob("vf-port-*"))
    try:
        (t,), _ = _play(task, tok, _scripted(tok, [call, "5"]), task.train_rows)
    finally:  # verifiers leaves the file its tool server reported its port in
        for f in set(Path("/tmp").glob("vf-port-*")) - port_files:
            f.unlink(missing_ok=True)
    assert not t.failed, t.error
    assert len(t.turns) == 2 and t.metrics["verifiers/dropped_calls"] == 0
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant"]
    assert t.messages[2]["content"] == "5" and t.passed and t.reward == 1.0


# ---- failures: one sample, with the reason, within a bound -----------------------------------------------------


def test_raising_env_fails_that_sample_only(tok):
    task = _load("load_guess", rows=[{"secret": 3}, {"secret": 3, "explode": True}])
    rows = sorted(task.train_rows + task.eval_rows, key=lambda r: r["verifiers_task"].get("explode", False))
    (ok, broken), stats = _play(task, tok, _scripted(tok, ["5"]), rows)
    assert not ok.failed and len(ok.turns) == 4
    assert broken.failed and "the guessing env broke" in broken.error and broken.reward == 0.0
    assert stats["failed"] == 1


def test_a_reward_verifiers_could_not_compute_fails_the_sample(tok):
    """A scoring timeout leaves the reward unset (None on the trace): that is no score, not a score of 0."""
    task = _load("load_guess", rows=[{"secret": 5, "slow_reward": True, "timeout": {"scoring": 0.3}}])
    (t,), _ = _play(task, tok, _scripted(tok, ["5"]), task.train_rows)
    assert t.failed and "did not score found" in t.error and "scoring_timeout" in t.error


def test_hanging_env_times_out(tok):
    task = _load("load_guess", rows=[{"secret": 3, "hang": True}], timeout_s=1.5)
    t0 = time.perf_counter()
    (t,), stats = _play(task, tok, _scripted(tok, ["5"]), task.train_rows)
    assert time.perf_counter() - t0 < 15
    assert t.failed and "timed out after 1.5s" in t.error and stats["timeouts"] == 1


def test_slow_model_call_is_bounded(tok):
    """A call the sampler never finishes answers 504 within request_timeout_s; the sample fails with it."""
    from posttrain.sampling.scripted import ScriptedSampler

    task = _load("load_qa", n=2, n_eval=0, request_timeout_s=0.5)
    t0 = time.perf_counter()
    (t, _), _ = _play(task, tok, ScriptedSampler(tok, ["2"], delay_s=5), task.train_rows)
    assert time.perf_counter() - t0 < 5
    assert t.failed and ("504" in t.error or "timed out" in t.error.lower()), t.error


# ---- learning -----------------------------------------------------------------------------------------------------


def _train(tmp_path, steps, *extra):
    from posttrain.config import load_config
    from posttrain.loop import train

    cfg = load_config(None, ["model.name=tiny-random", f"task.name={_spec('load_say_a')}",
                             "task.options.n_eval=16", "task.options.max_tokens=16", "logging.tensorboard=false",
                             "logging.console=false", "loop.eval_prompts=16", f"loop.steps={steps}",
                             "loop.prompts_per_step=4", "algorithm.num_generations=8", "trainer.lr=3e-3",
                             "loop.save_every=0", f"run.output_dir={tmp_path}", *extra])
    return train(cfg)


def test_grpo_learns_a_verifiers_taskset(tmp_path):
    """count-a's learning test (tests/loop/test_rl_loop.py) on a verifiers taskset: ~50 s on 2 shared cores."""
    from posttrain.obs import read_metrics

    res = _train(tmp_path, 30)
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert len(recs) == 30 and sum(r["rollouts/failed"] for r in recs) == 0
    first = sum(r["reward/mean"] for r in recs[:5]) / 5
    last = sum(r["reward/mean"] for r in recs[-5:]) / 5
    before, after = res.before, res.after
    print(f"train reward {first:.3f} -> {last:.3f}; held-out reward {before['eval/reward/mean']:.3f} -> "
          f"{after['eval/reward/mean']:.3f}, pass {before['eval/pass_rate']:.3f} -> {after['eval/pass_rate']:.3f}")
    assert last > first + 0.3, (first, last)
    assert after["eval/reward/mean"] > before["eval/reward/mean"] + 0.3
    sample = json.loads((res.run_dir / "samples.jsonl").read_text().splitlines()[0])
    assert "a_fraction" in json.dumps(sample)
