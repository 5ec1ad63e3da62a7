"""env check: smoke checks catch a broken env; ensure_envs_ok refuses or drops it; preflight on tiny-random."""

import subprocess
import sys

import pytest

from posttrain.envs import smoke_checks as K
from posttrain.loop import preflight as P
from posttrain.envs.task import Task
from posttrain.tasks import code_tests as C
from posttrain.rewards.rubric import RewardComponent, Rubric

BROKEN_TASK = '''
from posttrain.tasks import code_tests as C

def make_task():
    good = {p["id"]: p for p in C.load_problems()}["add"]
    # The reference solution is wrong (it subtracts), so the env would reward the wrong behaviour.
    bad = dict(good, id="broken_add", solution=good["solution"].replace("a + b", "a - b"))
    return C.make_task(problems=[bad, dict(good)], eval_fraction=0.0)
'''


def _broken_code_task() -> Task:
    good = {p["id"]: p for p in C.load_problems()}["add"]
    bad = dict(good, id="broken_add", solution=good["solution"].replace("a + b", "a - b"))
    return C.make_task(problems=[bad], eval_fraction=0.0)


def _pass_everything_task() -> Task:
    """A grader bug: every completion gets full marks. The known-bad check must catch it."""
    rubric = Rubric([RewardComponent("ok", lambda completions, **kw: [1.0] * len(completions))], pass_component="ok")
    t = Task("lenient", [{"prompt": "say hi"}], [], rubric)
    t.smoke_checks = [K.SmokeCheck("right answer", completion="hi", expect="pass"),
                      K.SmokeCheck("wrong answer", completion="bye", expect="fail")]
    return t


def test_good_task_passes_every_check():
    results = K.check_task(C.make_task())
    assert results and all(r.ok and r.attempts == 1 for r in results), results


def test_broken_reference_is_caught_after_retries():
    results = K.check_task(_broken_code_task(), max_attempts=3)
    bad = [r for r in results if not r.ok]
    assert [r.check for r in bad] == ["reference train:broken_add"]
    assert bad[0].attempts == 3 and "passed=False" in bad[0].got


def test_pass_everything_grader_is_caught():
    (right, wrong) = K.check_task(_pass_everything_task(), max_attempts=1)
    assert right.ok and not wrong.ok


def test_scripted_episode_checks_play_through_the_tool_env():
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    def answer(text: str) -> str:
        """Final answer."""
        return "ok"

    def correct(completions, tool_calls, **kw):  # the answer counts only after the tool was used
        return [float(c[0]["content"] == "5" and any(x["name"] == "add" for x in calls))
                for c, calls in zip(completions, tool_calls)]

    rows = [{"prompt": [{"role": "user", "content": "2+3?"}]}]
    t = Task("tooly", rows, [], Rubric([RewardComponent("correct", correct)]), tools=[add, answer], max_turns=3,
             final_tool="answer", stop=["</tool_call>"])
    add_call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    answer_call = '<tool_call>{"name": "answer", "arguments": {"text": "5"}}</tool_call>'
    t.smoke_checks = [K.SmokeCheck("uses the tool", replies=[add_call, answer_call]),
                      K.SmokeCheck("answers blind", replies=[answer_call], expect="fail"),
                      K.SmokeCheck("script too short", replies=[add_call], expect="fail", max_attempts=1)]
    good, blind, short = K.check_task(t)
    assert good.ok and good.got.startswith("reward=1.00 passed=True") and blind.ok
    assert not short.ok and "the script has 1" in short.got  # the env asked for more replies than it had


def test_flaky_check_passes_on_a_later_attempt():
    calls = []

    def flaky(completions, **kw):
        calls.append(1)
        return [1.0 if len(calls) >= 3 else 0.0 for _ in completions]

    t = Task("flaky", [{"prompt": "x"}], [], Rubric([RewardComponent("r", flaky)], pass_component="r"))
    t.smoke_checks = [K.SmokeCheck("eventually", completion="y", expect="pass")]
    (r,) = K.check_task(t)
    assert r.ok and r.attempts == 3


def test_task_without_checks_gets_the_generic_one_and_raising_rewards_fail_it():
    def boom(completions, **kw):
        raise RuntimeError("grader down")

    t = Task("boom", [{"prompt": "x"}], [], Rubric([RewardComponent("r", boom)]))
    (r,) = K.check_task(t, max_attempts=1)
    assert not r.ok and "grader down" in r.got


def test_smoke_command_in_the_sandbox():
    t = _pass_everything_task()
    t.smoke_checks = [K.SmokeCheck("python runs", command=["python3", "-c", "print(6 * 7)"], expect_output="42"),
                      K.SmokeCheck("wrong output", command="python3 -c 'print(1)'", expect_output="2", max_attempts=2)]
    ok, bad = K.check_task(t)
    assert ok.ok and not bad.ok and bad.attempts == 2


def test_ensure_envs_ok_refuse_and_drop():
    good, broken = C.make_task(), _broken_code_task()
    assert K.ensure_envs_ok([good]) == [good]
    with pytest.raises(K.EnvCheckError, match="broken_add") as e:
        K.ensure_envs_ok([good, broken], max_attempts=1)
    assert any(not r.ok for r in e.value.results)
    logged = []
    assert K.ensure_envs_ok([good, broken], on_fail="drop", log=logged.append, max_attempts=1) == [good]
    assert "dropping code-tests" in logged[0]
    with pytest.raises(K.EnvCheckError):
        K.ensure_envs_ok([broken], on_fail="drop", log=logged.append, max_attempts=1)


def test_results_table_renders():
    from rich.console import Console

    con = Console(record=True, width=200)
    con.print(K.results_table(K.check_task(_pass_everything_task(), max_attempts=1)))
    text = con.export_text()
    assert "wrong answer" in text and "FAIL" in text and "ok" in text


def test_chat_template_prefix_check(tiny):
    _, tok = tiny
    assert P.chat_template_prefix_ok(tok)[0]

    orig = tok.chat_template
    try:  # a template that only renders the last message: rendering is not append-only
        tok.chat_template = ("{{ '<|im_start|>' + messages[-1]['role'] + '\n' + messages[-1]['content'] + "
                             "'<|im_end|>\n' }}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
        ok, detail = P.chat_template_prefix_ok(tok)
    finally:
        tok.chat_template = orig
    assert not ok and "not prefix-stable" in detail


def test_zero_variance_and_memory_estimate(tiny):
    assert P.zero_variance_fraction([[1, 1], [0, 1], [0.5, 0.5, 0.5], []]) == 2 / 3
    model, _ = tiny
    n = sum(p.numel() for p in model.parameters())
    mem = P.memory_estimate_gb(model, n, n, batch_seqs=8, seq_len=128)
    assert mem["adam"] == pytest.approx(2 * mem["grads"]) and mem["total"] > mem["weights"] > 0
    assert mem["kv_cache"] > 0 and "reference" not in mem


def test_preflight_on_tiny_random():
    from posttrain.config import load_config

    cfg = load_config(None, ["model.name=tiny-random", "task.name=count-a", "sampling.max_tokens=4", "model.threads=1"])
    rep = P.preflight(cfg, n_prompts=2, n_groups=2, log=lambda s: None)
    assert 0 <= rep.baseline_pass_rate <= 1 and 0 <= rep.zero_variance_frac <= 1
    assert rep.chat_template_ok and rep.params > 0 and rep.memory_gb["total"] > 0
    assert dict(rep.rows())["task"] == "count-a"


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "posttrain.cli", "env", "check", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_cli_env_check_ok_and_broken(tmp_path):
    r = _cli("--task", "code-tests")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "reference" in r.stdout and "FAIL" not in r.stdout
    (tmp_path / "broken.py").write_text(BROKEN_TASK)
    r = _cli("--task", f"{tmp_path / 'broken.py'}:make_task")
    assert r.returncode == 1 and "FAIL" in r.stdout, r.stdout + r.stderr
    r = _cli("--task", "no-such-task")
    assert r.returncode == 2 and "unknown task" in r.stderr
