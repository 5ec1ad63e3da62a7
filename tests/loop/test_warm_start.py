"""Supervised warm start on a task's demonstrations (loop/warm_start.py)."""

import asyncio
import json
import re
import textwrap

import pytest
import torch

from posttrain.config import ConfigError, load_config
from posttrain.tasks import search_qa
from posttrain.envs.tool_env import ToolEnv
from posttrain.loop import train
from posttrain.loop.warm_start import WarmStartError, demonstration_trajectories
from posttrain.training.sft import batches, reply_end_token
from posttrain.obs import read_metrics
from posttrain.types import SampleParams

# count-a with a demonstrator that writes only 'a's (a tiny-random model learns to copy it in a few steps)
TASK_FILE = textwrap.dedent('''
    import dataclasses
    from posttrain.tasks import count_a

    def make_task(reply="a a a a a a", n_train=16):
        return dataclasses.replace(count_a.make_task(n_train=n_train, max_tokens=8), demonstrate=lambda row: [reply])
''')

FAST = ["model.name=tiny-random", "logging.tensorboard=false", "logging.console=false", "loop.eval_prompts=8",
        "task.env_check=off", "loop.save_every=0"]


def _cfg(tmp_path, *extra):
    f = tmp_path / "demo_task.py"
    f.write_text(TASK_FILE)
    return load_config(None, FAST + [f"run.output_dir={tmp_path}", f"task.name={f}:make_task"] + list(extra))


def test_warm_start_teaches_the_demonstrations_and_saves_the_model(tmp_path):
    cfg = _cfg(tmp_path, "warm_start.steps=25", "warm_start.lr=3e-3", "warm_start.batch_size=8", "loop.steps=0",
               "sampling.eval_temperature=0")
    res = train(cfg)
    summary = json.loads((res.run_dir / "summary.json").read_text())
    ws = summary["warm_start"]
    assert ws["demos"] == 16 and ws["demos_failed"] == 0
    assert ws["loss_last"] < ws["loss_first"] / 3, ws
    # the held-out eval before RL is after the warm start; the base model wrote almost no 'a'
    assert ws["base_eval"]["eval/reward/mean"] < 0.2
    assert res.before["eval/reward/mean"] > ws["base_eval"]["eval/reward/mean"] + 0.4
    assert (res.run_dir / "final" / "config.json").exists()  # warm start only: its model is the result
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "warm_start"]
    assert [r["warm_start/step"] for r in recs] == list(range(1, 26))


def test_warm_start_then_rl_in_one_run(tmp_path):
    cfg = _cfg(tmp_path, "warm_start.steps=4", "warm_start.lr=1e-3", "loop.steps=2", "loop.eval_before=false")
    res = train(cfg)
    kinds = [r["kind"] for r in read_metrics(str(res.run_dir))]
    assert kinds.count("warm_start") == 4 and kinds.count("train") == 2 and "warm_start_eval" not in kinds
    assert kinds.index("warm_start") < kinds.index("train")


@pytest.mark.parametrize("ws_eval, base, after_warm_start", [(None, False, False), (True, False, True),
                                                            (False, True, False)])
def test_warm_start_eval_is_separate_from_the_base_eval(tmp_path, ws_eval, base, after_warm_start):
    # loop.eval_before=false warm_start.eval=true: the base model's eval (minutes on a long task) is skipped, the
    # warm-started model's (the base of the RL gain) kept. Unset, warm_start.eval follows loop.eval_before.
    extra = [] if ws_eval is None else [f"warm_start.eval={str(ws_eval).lower()}"]
    res = train(_cfg(tmp_path, "warm_start.steps=1", "loop.steps=1", f"loop.eval_before={str(base).lower()}", *extra))
    recs = read_metrics(str(res.run_dir))
    assert any(r["kind"] == "warm_start_eval" for r in recs) is base
    assert any(r["kind"] == "eval" and r["step"] == 0 for r in recs) is after_warm_start
    assert bool(res.before) is after_warm_start


def test_warm_start_trains_with_the_runs_memory_settings(tmp_path, monkeypatch):
    # trainer.logits_chunk_tokens and trainer.gradient_checkpointing bound the memory of every training pass,
    # the warm start's included (its demonstrations are as long as the episodes).
    import posttrain.loop.warm_start as W

    seen = []

    class Spy(W.Trainer):
        def __init__(self, *a, **k):
            seen.append(k)
            super().__init__(*a, **k)

    monkeypatch.setattr(W, "Trainer", Spy)
    train(_cfg(tmp_path, "warm_start.steps=1", "loop.steps=0", "loop.eval_before=false",
               "trainer.logits_chunk_tokens=16", "trainer.gradient_checkpointing=true", "trainer.precision=bf16"))
    assert seen and seen[0]["logits_chunk_tokens"] == 16 and seen[0]["gradient_checkpointing"] is True
    assert seen[0]["precision"] == "bf16"  # and its arithmetic


def test_the_first_warm_start_step_says_how_long_the_rest_will_take(tmp_path, capsys):
    train(_cfg(tmp_path, "warm_start.steps=30", "warm_start.lr=1e-3", "loop.steps=0", "loop.eval_before=false",
               "logging.console=true"))
    out = capsys.readouterr().out
    first = next(line for line in out.splitlines() if "warm start 1/30" in line)
    assert re.search(r"about \d+ (s|min) more at this pace", first), first
    assert "warm start 2/30" not in out  # then every steps // 10 steps, as before


def test_async_loop_sampler_gets_the_warm_started_weights(tmp_path, monkeypatch):
    import posttrain.loop.run as run_mod
    from posttrain.loop import Run

    made = []

    def capture(*args, **kw):
        made.append(orig(*args, **kw))
        return made[-1]

    orig = run_mod.make_stepper
    monkeypatch.setattr(run_mod, "make_stepper", capture)
    cfg = _cfg(tmp_path, "warm_start.steps=3", "warm_start.lr=1e-2", "loop.steps=0", "loop.mode=async",
               "loop.eval_before=false")
    run = Run(cfg)
    before = {n: p.detach().clone() for n, p in run.c.model.named_parameters()}
    run.run()
    sampler = made[0].sync.sampler  # the async collector's own copy of the model
    assert sampler.model is not run.c.model
    changed = sum(int(not (p.detach() == before[n]).all()) for n, p in run.c.model.named_parameters())
    assert changed > 0 and sampler.policy_version == 0
    # The copy may hold its weights packed (sampling.packed_weights): compare what it computes, not its tensors.
    x = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(sampler.model(x).logits, run.c.model.eval()(x).logits, rtol=1e-4, atol=1e-4)


def test_task_without_demonstrations_is_refused(tmp_path):
    cfg = load_config(None, FAST + [f"run.output_dir={tmp_path}", "task.name=count-a", "warm_start.steps=2"])
    with pytest.raises(WarmStartError, match="no demonstrations"):
        train(cfg)


def test_failing_demonstrations_are_left_out_or_refused(tmp_path):
    # "zzz" has no 'a': every demonstration fails the rubric -> refused before any training
    cfg = _cfg(tmp_path, "warm_start.steps=2", "task.options={reply: zzz}")
    with pytest.raises(WarmStartError, match="none of the 16 demonstrations"):
        train(cfg)


def test_es_with_warm_start_is_refused():
    with pytest.raises(ConfigError, match="warm_start"):
        load_config(None, ["algorithm.name=es", "warm_start.steps=3"])


def test_batches_cover_every_demo_each_epoch():
    bs = batches(10, 4, 5, seed=0)
    assert [len(b) for b in bs] == [4] * 5
    flat = [i for b in bs for i in b]
    assert sorted(flat[:10]) == list(range(10))  # the first epoch covers all ten, no repeats
    assert batches(3, 8, 2, seed=0)[0] and len(batches(3, 8, 2, seed=0)[0]) == 3  # batch capped at n
    assert batches(10, 4, 5, seed=0) == bs


# ---- search-qa: the demonstrator is right on every row, and the tokens look like sampled ones --------------------


def test_search_qa_demonstrations_all_pass(tiny):
    _, tok = tiny
    task = search_qa.make_task(search_cost=0.1)
    params = SampleParams(max_tokens=task.max_tokens, stop=task.stop)
    env = ToolEnv(task, tok, params, task.tools, max_turns=task.max_turns, final_tool=task.final_tool)
    rows = task.train_rows[:80]
    ok, bad = asyncio.run(demonstration_trajectories(env, task, tok, rows, params))
    assert not bad and len(ok) == 80
    for t in ok:
        searches = t.reward_components["num_searches"]
        row = t.row
        if not row["given"]:
            assert searches == row["hops"]
        assert t.reward == pytest.approx(1.1 - 0.1 * searches)
    given = [t for t in ok if t.row["given"]]
    assert given and 0 < sum(t.reward_components["num_searches"] > 0 for t in given) < len(given)
    # each reply stops at '</tool_call>' with no end token, as sampling does; env tokens are masked out
    end = reply_end_token(tok)
    t = next(t for t in ok if t.row["hops"] == 2 and not t.row["given"])
    for turn in t.turns:
        assert tok.decode(turn.completion_ids).endswith("</tool_call>") and end not in turn.completion_ids
    ids, mask, _ = t.sequence()
    assert sum(mask) == sum(len(turn.completion_ids) for turn in t.turns) < len(ids) - len(t.prompt_ids)


def test_a_demonstration_too_short_for_the_episode_fails(tiny):
    _, tok = tiny
    task = search_qa.make_task()
    task.demonstrate = lambda row: [search_qa.tool_call_text("search", query="Tovenar")]  # never answers
    params = SampleParams(max_tokens=task.max_tokens, stop=task.stop)
    env = ToolEnv(task, tok, params, task.tools, max_turns=task.max_turns, final_tool=task.final_tool)
    ok, bad = asyncio.run(demonstration_trajectories(env, task, tok, task.train_rows[:2], params))
    assert not ok and len(bad) == 2 and "replies" in bad[0].error


def test_scored_demonstrations_stay_out_of_the_next_evals_metrics(tiny):
    """The decision ledger counts every scored sample: the warm start's demonstrations (right by construction) once
    reached the first held-out eval's decision/* metrics (n 260 for 60 prompts: accuracy 0.88 reported where the
    held-out accuracy was 0.63)."""
    from posttrain.envs.base import make_env
    from posttrain.tasks.load import load_task
    from posttrain.loop.evaluate import evaluate
    from posttrain.sampling.scripted import ScriptedSampler

    _, tok = tiny
    task = load_task("decision-routing")
    params = SampleParams(max_tokens=64)
    env = make_env(task, tok, params)
    ok, _ = asyncio.run(demonstration_trajectories(env, task, tok, task.train_rows[:12], params))
    assert len(ok) == 12
    rows = task.eval_rows[:5]
    wrong = '{"label": "other", "probs": {"other": 1.0}, "confidence": 1.0}'
    m, _ = evaluate(env, ScriptedSampler(tok, [wrong] * 5, end_token_id=reply_end_token(tok)), rows, params)
    assert m["eval/decision/n"] == 5  # the eval's own five samples, not the twelve demonstrations too
    assert m["eval/decision/accuracy"] == pytest.approx(sum(r["gold"].get("other", 0.0) for r in rows) / 5)


def test_a_crash_in_rl_keeps_the_warm_start(tmp_path, monkeypatch, crash_in_rl):
    """The warm start is checkpointed as step 0: a run that dies in RL resumes from the warm-started model
    without redoing it, and trains exactly as the uninterrupted run (a coding-agent run OOM-killed at RL step 4
    lost its 53-minute warm start before this)."""
    from posttrain.loop import run as run_mod
    from posttrain.loop.run import Run

    common = ["warm_start.steps=3", "warm_start.lr=1e-3", "loop.steps=3", "loop.eval_before=false", "run.seed=5"]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    straight = train(_cfg(tmp_path / "a", *common))
    cfg = _cfg(tmp_path / "b", *common, "run.name=crashy")
    run = crash_in_rl(cfg, at_step=1)
    assert (run.run_dir / "checkpoints" / "step_000000").is_dir()

    async def no_second_warm_start(*a, **k):
        raise AssertionError("the warm start ran again on resume")

    monkeypatch.setattr(run_mod, "run_warm_start", no_second_warm_start)
    resumed = Run(cfg, run_dir=run.run_dir, resume=True).run()

    def trained(run_dir):
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))}
                for r in read_metrics(str(run_dir)) if r["kind"] == "train"]

    assert [r["step"] for r in trained(resumed.run_dir)] == [1, 2, 3]
    assert trained(resumed.run_dir) == trained(straight.run_dir)
    kinds = [r["kind"] for r in read_metrics(str(resumed.run_dir))]
    assert kinds.count("warm_start") == 3  # the first run's records, kept and not redone


def _params(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("lora", [False, True])
def test_the_kl_reference_is_the_warm_started_policy(tmp_path, monkeypatch, lora):
    """With a warm start, `algorithm.beta` pulls toward the warm-started policy, not the base model the warm start
    moved away from (the field's SFT-model reference); it is saved for resume."""
    import posttrain.loop.run as run_mod
    from posttrain.loop import Run
    from posttrain.loop.reference import REFERENCE_FILE

    seen = {}

    def capture(cfg, c, *args, **kw):
        seen["policy"] = _params(c.model)  # the warm-started policy, before any RL step
        seen["stepper"] = orig(cfg, c, *args, **kw)
        return seen["stepper"]

    orig = run_mod.make_stepper
    monkeypatch.setattr(run_mod, "make_stepper", capture)
    extra = ["lora.enabled=true", "lora.r=4"] if lora else []
    cfg = _cfg(tmp_path, "warm_start.steps=3", "warm_start.lr=1e-2", "loop.steps=1", "loop.eval_before=false",
               "algorithm.beta=0.1", *extra)
    run = Run(cfg)
    base = _params(run.c.model)
    run.run()
    ref = seen["stepper"].ref_model
    assert ref is not None and seen["stepper"].ref_disable_adapter is None
    assert not any(p.requires_grad for p in ref.parameters())
    ref_params = _params(ref)
    moved = [n for n in seen["policy"] if not torch.equal(seen["policy"][n], base[n])]
    assert moved, "the warm start changed nothing: the test proves nothing"
    for n in moved:  # the reference holds the warm-started weights ...
        assert torch.equal(ref_params[n], seen["policy"][n]), n
    # ... and stays there while RL moves the policy
    assert any(not torch.equal(p.detach(), ref_params[n]) for n, p in run.c.model.named_parameters())
    saved = torch.load(run.run_dir / REFERENCE_FILE, weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in ref.state_dict().items())


def test_a_resumed_run_gets_the_saved_warm_started_reference(tmp_path, monkeypatch, crash_in_rl):
    import posttrain.loop.run as run_mod
    from posttrain.loop.reference import REFERENCE_FILE
    from posttrain.loop.run import Run

    cfg = _cfg(tmp_path, "warm_start.steps=3", "warm_start.lr=1e-2", "loop.steps=3", "loop.eval_before=false",
               "algorithm.beta=0.1", "loop.save_every=1", "run.name=kl")
    run = crash_in_rl(cfg, at_step=2)
    saved = torch.load(run.run_dir / REFERENCE_FILE, weights_only=True)
    made = []
    orig_make = run_mod.make_stepper
    monkeypatch.setattr(run_mod, "make_stepper", lambda *a, **k: made.append(orig_make(*a, **k)) or made[-1])
    Run(cfg, run_dir=run.run_dir, resume=True).run()
    ref = made[0].ref_model.state_dict()
    assert all(torch.equal(ref[k], v) for k, v in saved.items())
    (run.run_dir / REFERENCE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="KL reference"):
        Run(cfg, run_dir=run.run_dir, resume=True).run()
