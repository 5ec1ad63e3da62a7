"""The built-in `search-qa` task: world, BM25, tools, rubric, and a scripted ToolEnv episode."""

from __future__ import annotations

import asyncio
import math

import pytest

from posttrain.tasks.load import load_task
from posttrain.envs.task import Task
from posttrain.tasks import bm25, builtin_task_factory
from posttrain.tasks.search_qa import make_task, make_tools, normalize
from posttrain.tasks.search_qa_world import EXAMPLE_QUERY, all_questions, build_world
from posttrain.envs.tool_env import ToolEnv
from posttrain.sampling.scripted import ScriptedSampler as _Scripted
from posttrain.types import SampleParams
from posttrain.envs.scoring import scored_by


@pytest.fixture(scope="module")
def task() -> Task:
    return make_task()


# ---- world and questions ---------------------------------------------------------------------------------------


def test_world_and_task_are_deterministic_in_seed(task: Task) -> None:
    a, b, c = build_world(0), build_world(0), build_world(1)
    assert [e.text for e in a.entities.values()] == [e.text for e in b.entities.values()]
    assert [e.text for e in a.entities.values()] != [e.text for e in c.entities.values()]
    again = make_task()
    assert again.train_rows == task.train_rows and again.eval_rows == task.eval_rows
    # held-out rows do not depend on n_train
    assert make_task(n_train=10).eval_rows == task.eval_rows


def test_shape_and_split(task: Task) -> None:
    assert task.name == "search-qa" and task.conversational
    assert len(task.train_rows) == 300 and len(task.eval_rows) == 60
    assert task.final_tool == "answer" and [t.__name__ for t in task.tools] == ["search", "answer"]
    assert task.max_turns == 4 and task.max_tokens == 64 and task.stop == ["</tool_call>"]
    assert builtin_task_factory("search-qa") is make_task
    train_q = {r["question"] for r in task.train_rows}
    eval_q = {r["question"] for r in task.eval_rows}
    assert not train_q & eval_q  # split by question: a question and its "given" variant stay on one side
    for rows in (task.train_rows, task.eval_rows):
        assert {r["hops"] for r in rows} == {1, 2}
        assert 0.1 < sum(r["given"] for r in rows) / len(rows) < 0.45  # given_fraction=0.25
    prompt = task.train_rows[0]["prompt"][0]["content"]
    assert prompt.count("<tool_call>") == 1 and EXAMPLE_QUERY in prompt  # one example call, exact format
    assert {r["hops"] for r in make_task(hops=(1,), n_train=20, n_eval=5).train_rows} == {1}


def test_names_are_distinct_words() -> None:
    world = build_world(0)
    words = [w for e in world.entities.values() if e.kind != "company" for w in normalize(e.name).split()]
    words += [normalize(e.name).split()[0] for e in world.entities.values() if e.kind == "company"]
    assert len(words) == len(set(words))
    assert EXAMPLE_QUERY.lower() not in words


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_question_is_answerable(task: Task, seed: int) -> None:
    """Searching each entity name of the chain (subject, then bridge) finds its document in the top 2, and that
    document names the next entity; a "given" row states every needed fact in the prompt."""
    world = build_world(seed)
    search = make_tools(world)[0]
    for q in all_questions(world):
        assert normalize(q["answer"]) not in normalize(q["question"]), q
        for name, nxt in zip(q["chain"], q["chain"][1:]):
            result = search(name)
            assert f"[{world.entities[name].doc_id}] {world.doc(name)}" in result.split("\n"), (q, name)
            assert nxt in world.doc(name)
    for row in task.train_rows + task.eval_rows:
        text = row["prompt"][0]["content"]
        assert row["question"] in text
        if row["given"]:
            assert all(name in text.split("Question:")[0] for name in row["chain"]) and row["answer"] in text
        else:
            assert "Fact:" not in text and row["answer"] not in text


# ---- BM25 ------------------------------------------------------------------------------------------------------


def test_bm25_matches_a_hand_computed_score() -> None:
    index = bm25.build_index([("d0", "Apple banana."), ("d1", "apple CHERRY cherry"), ("d2", "date")])
    assert bm25.tokenize("Apple, CHERRY-pie 2x!") == ["apple", "cherry", "pie", "2x"]
    # N=3, lengths 2,3,1 -> avgdl=2. "cherry": n=1, idf=ln((3-1+0.5)/(1+0.5)+1)=ln(8/3)=0.98083.
    # d1: tf=2, dl=3: 2*2.5 / (2 + 1.5*(0.25 + 0.75*3/2)) = 5/4.0625 = 1.23077 -> 1.20718
    assert bm25.score(index, "cherry", 1) == pytest.approx(1.207174, abs=1e-5)
    assert bm25.score(index, "cherry", 1) == pytest.approx(math.log(8 / 3) * 5 / 4.0625)
    # "apple": n=2, idf=ln(1.5/2.5+1)=ln(1.6)=0.47000; d0: tf=1, dl=2: 2.5/(1+1.5)=1 -> 0.47000
    assert bm25.score(index, "apple", 0) == pytest.approx(math.log(1.6), abs=1e-9)
    assert bm25.score(index, "apple apple", 0) == bm25.score(index, "apple", 0)  # distinct query terms count once
    assert bm25.score(index, "zebra", 0) == 0.0
    assert [i for i, _ in bm25.top_k(index, "apple cherry", 2)] == [1, 0]
    assert bm25.top_k(index, "zebra") == []


# ---- rubric ----------------------------------------------------------------------------------------------------


def _calls(n_search: int, answer: str | None) -> list[dict]:
    calls = [{"name": "search", "arguments": {"query": f"q{i}"}} for i in range(n_search)]
    return calls + ([{"name": "answer", "arguments": {"text": answer}}] if answer is not None else [])


def _score(task: Task, row: dict, text: str, calls: list[dict]):
    extra = {k: v for k, v in row.items() if k != "prompt"}
    (s,) = task.rubric.score([[{"role": "assistant", "content": text}]],
                             [{**extra, "tool_calls": calls, "num_turns": len(calls)}])
    return s


@pytest.mark.parametrize("lam", [0.1, 0.3])
@pytest.mark.parametrize("n_search", [0, 1, 2])
def test_rubric_correct_answer_pays_minus_lambda_per_search(lam: float, n_search: int) -> None:
    task = make_task(n_train=20, n_eval=5, search_cost=lam)
    row = task.train_rows[0]
    s = _score(task, row, f"It is {row['answer']}.", _calls(n_search, row["answer"]))
    assert s.passed and not s.failed
    assert s.components["correct"] == 1.0 and s.components["format"] == 1.0
    assert s.components["num_searches"] == n_search
    assert s.components["search_cost"] == pytest.approx(-lam * n_search)
    assert s.reward == pytest.approx(1.0 + 0.1 - lam * n_search)


def test_every_step_before_the_answer_costs_so_junk_calls_do_not_dodge_the_price() -> None:
    task = make_task(n_train=20, n_eval=5, search_cost=0.6)
    row = task.train_rows[0]
    junk = '<tool_call>{"name": "Gipa", "arguments": {"masca": "Gipa"}}'  # unknown tool; turns run out
    extra = {k: v for k, v in row.items() if k != "prompt"}
    (s,) = task.rubric.score([[{"role": "assistant", "content": junk}]],
                             [{**extra, "tool_calls": [{"name": "Gipa", "arguments": {}}] * 4, "num_turns": 4}])
    assert s.components["num_searches"] == 0 and s.components["search_cost"] == pytest.approx(-4 * 0.6)
    # a plain-text guess after one malformed reply: one wasted step
    (g,) = task.rubric.score([[{"role": "assistant", "content": "Nobody"}]],
                             [{**extra, "tool_calls": [], "num_turns": 2}])
    assert g.components["search_cost"] == pytest.approx(-0.6)
    # an honest two-search episode costs exactly its searches, and beats the junk episode
    honest = _score(task, row, row["answer"], _calls(2, row["answer"]))
    assert honest.components["search_cost"] == pytest.approx(-1.2) and honest.reward > s.reward


def test_rubric_wrong_partial_hedged_and_unanswered(task: Task) -> None:
    world = build_world(0)
    row = next(r for r in task.train_rows if r["answer_kind"] == "person")
    other = next(n for n in world.names("person") if n != row["answer"])
    wrong = _score(task, row, other, _calls(1, other))
    assert not wrong.passed and wrong.components["correct"] == 0.0 and wrong.reward == pytest.approx(0.1 - 0.1)
    first_name_only = row["answer"].split()[0]
    assert _score(task, row, first_name_only, _calls(0, first_name_only)).components["correct"] == 0.0
    hedge = f"{row['answer']} or {other}"
    assert _score(task, row, hedge, _calls(0, hedge)).components["correct"] == 0.0
    loud = f"  {row['answer'].upper()}!! "
    assert _score(task, row, loud, _calls(0, loud)).components["correct"] == 1.0
    # turns ran out on a search that names the answer: not an answer, no format bonus
    cut = f'<tool_call>{{"name": "search", "arguments": {{"query": "{row["answer"]}"}}}}'
    s = _score(task, row, cut, _calls(4, None))
    assert s.components["correct"] == 0.0 and s.components["format"] == 0.0
    assert s.reward == pytest.approx(-0.4)


# ---- ToolEnv episode -------------------------------------------------------------------------------------------


def ScriptedSampler(tok, replies):  # noqa: N802 - the shared test sampler, ending turns with <|im_end|>
    return _Scripted(tok, replies, end_token_id=tok.convert_tokens_to_ids("<|im_end|>"))


def _call(name: str, key: str, value: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"{key}": "{value}"}}}}</tool_call>'


def test_two_hop_episode_on_tiny_random(tiny, task: Task) -> None:
    _, tok = tiny
    row = next(r for r in task.train_rows if r["hops"] == 2 and not r["given"])
    subject, bridge, gold = row["chain"]
    params = SampleParams(max_tokens=task.max_tokens, stop=task.stop)
    env = ToolEnv(task, tok, params, task.tools, max_turns=task.max_turns, final_tool=task.final_tool)
    sampler = ScriptedSampler(tok, [_call("search", "query", subject), _call("search", "query", bridge),
                                    _call("answer", "text", gold), "unused"])
    traj = asyncio.run(env.rollout(row, sampler))
    (traj,) = asyncio.run(scored_by(env, [traj]))
    assert len(traj.turns) == 3 and traj.completion_text == gold
    assert traj.metrics["tool_calls"] == 3 and traj.metrics["malformed_calls"] == 0
    assert traj.passed and traj.reward == pytest.approx(1.0 + 0.1 - 2 * 0.1)
    assert traj.reward_components["num_searches"] == 2.0
    # the stop string was cut from the text, yet each call parsed; the search results reached the policy
    assert all(not m["content"].endswith("</tool_call>") for m in traj.messages if m["role"] == "assistant")
    tool_msgs = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert bridge in tool_msgs[0] and gold in tool_msgs[1]
    _, mask, _ = traj.sequence()  # token fidelity holds across the turns
    assert sum(mask) == sum(len(t.completion_ids) for t in traj.turns)


def test_given_row_answered_without_search(tiny, task: Task) -> None:
    _, tok = tiny
    row = next(r for r in task.train_rows if r["given"])
    env = ToolEnv(task, tok, SampleParams(max_tokens=64, stop=task.stop), task.tools, max_turns=task.max_turns,
                  final_tool=task.final_tool)
    traj = asyncio.run(env.rollout(row, ScriptedSampler(tok, [_call("answer", "text", row["answer"])])))
    (traj,) = asyncio.run(scored_by(env, [traj]))
    assert len(traj.turns) == 1 and traj.passed and traj.reward == pytest.approx(1.1)
    # short prompt (the model is small and CPU-bound): ToolEnv's tool schemas + our instructions, ~250 BPE tokens
    assert sum(len(m["content"]) for m in env.initial_messages(row)) < 1100


def test_load_task_by_name() -> None:
    t = load_task("search-qa", {"n_train": 12, "n_eval": 4, "search_cost": 0.3, "hops": [2]})
    assert len(t.train_rows) == 12 and len(t.eval_rows) == 4 and {r["hops"] for r in t.train_rows} == {2}
    row = t.train_rows[0]
    assert _score(t, row, row["answer"], _calls(2, row["answer"])).reward == pytest.approx(1.1 - 0.6)
