"""Property test (issue #42): no model output makes a built-in env raise or stall.

Failure isolation (envs/isolate.py) keeps a raising env from stopping a run, but a sample lost that way is lost to
training: the envs themselves must take whatever a policy writes. Here every built-in task's env is driven by a
sampler that answers with hostile text, and `env.rollout` + `env.score` are called DIRECTLY (no isolation): no
exception may escape, and each sample must finish within a generous bound. Nor may a reward function raise on the
text (the rubric would isolate it, but the sample would be lost to training): a hostile output is a wrong answer,
scored like one. Only the sandbox-graded tasks may fail a sample, for a reason of the grading itself (a baseline
that could not be graded on a loaded machine), never for an exception out of parsing the text.

Families (docs/sandbox.md, "Hostile model outputs"): deeply nested JSON (bare, in a <tool_call>, as tool
arguments), deeply nested Python (in a code block, in an edit_file call), huge numbers, invalid UTF-8 / lone
surrogates / replacement characters, NUL bytes, megabyte-long lines, pathological regexes as `search`
arguments, tool calls of wrong types / huge sizes / unknown tools, many calls at once, and empty output.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.tasks.load import load_task
from posttrain.envs.base import make_env
from posttrain.tasks import BUILTIN_TASKS
from posttrain.envs.tools import Tool
from posttrain.sampling.hf_sampler import cut_at_stop
from posttrain.types import Completion, SampleParams
from posttrain.envs.scoring import scored_by

PER_SAMPLE_S = 20.0  # generous: a bound on hangs and blow-ups, not a timing

# Small, offline and short: few rows, few turns per episode (a hostile reply repeats every turn).
OPTIONS: dict[str, dict[str, Any]] = {
    "json-extract": {"n_train": 2, "n_eval": 0},
    "json-extract-judged": {"judge_model": "tiny-random", "n_train": 2, "n_eval": 0},
    "count-a": {"n_train": 2, "n_eval": 0},
    "search-qa": {"n_train": 2, "n_eval": 0, "max_turns": 2},
    "coding-agent": {"max_turns": 2, "tool_timeout_s": 30.0},
    "product-blurb": {"reward": "rule", "n_train": 2, "n_eval": 0},  # the reward model / judge are trained models
    "listing-summary": {"n_train": 2, "n_eval": 0},
    "reversal": {"n_train": 2, "n_eval": 0, "max_turns": 3},
    "arith": {"n_train": 2, "n_eval": 0},
    "ttrl": {"n_train": 2, "n_eval": 0},
    "decision-routing": {"n_train": 2, "n_eval": 0},
    "mixture": {"tasks": [{"name": "count-a", "options": {"n_train": 2, "n_eval": 0}},
                          {"name": "reversal", "options": {"n_train": 2, "n_eval": 0, "max_turns": 3}}]},
}
SANDBOX_TASKS = {"code-tests", "feature-deletion", "coding-agent"}
# A reward function that raised on the text (the rubric writes "reward 'name' raised Type: ...").
PARSE_ERROR = re.compile(r"raised (RecursionError|MemoryError|OverflowError|Unicode\w*Error|ValueError|TypeError|"
                         r"KeyError|IndexError|AttributeError)")


def _sandbox_reason() -> str | None:
    from posttrain.sandbox import SandboxConfig
    from posttrain.sandbox.backends import resolve_backend

    try:
        resolve_backend(SandboxConfig())
    except Exception as e:  # noqa: BLE001 - no isolating backend on this machine
        return str(e)[:200]
    return None


class HostileSampler:
    """Answers every call with `text` (or the texts in turn, cycling), as written: the ids are those of the text
    with what a tokenizer refuses (lone surrogates) replaced, because a real sampler's ids always decode; the env
    reads `text`, which is what is under test. Like ScriptedSampler, the text is cut before a stop string and
    max_tokens is not applied (an env must not rely on the sampler to keep it safe)."""

    def __init__(self, tok: Any, text: str | list[str]):
        self.tok, self.texts, self.policy_version, self.calls = tok, [text] if isinstance(text, str) else text, 0, 0
        self.context = None  # Sampler.context: a budget this sampler does not know
        for t in self.texts:  # tokenized now: the harness's own time is not the env's
            _ids(tok, t)

    def decode(self, token_ids: list[int]) -> str:
        return self.tok.decode(token_ids, skip_special_tokens=True)

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        text = self.texts[self.calls % len(self.texts)]
        self.calls += 1
        ids = list(_ids(self.tok, text))
        shown = cut_at_stop(text, params.stop) if params.stop else text
        return [[Completion(list(ids), [-0.5] * len(ids), "stop", 0, text=shown) for _ in range(n)]
                for _ in prompts_P]


@functools.lru_cache(maxsize=4)  # a megabyte reply is tokenized once for all the tasks, not once per task
def _ids(tok: Any, text: str) -> tuple[int, ...]:
    safe = text.encode("utf-8", "replace").decode("utf-8")
    return tuple(int(i) for i in tok(safe, add_special_tokens=False)["input_ids"]) + (
        tok.convert_tokens_to_ids("<|im_end|>"),)


_ENVS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def tok():
    from posttrain.models import load_model

    return load_model("tiny-random", seed=0)[1]


def _env(name: str, tok: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(task, env, row) for a built-in task, built once per test session."""
    if name in SANDBOX_TASKS and (why := _sandbox_reason()) is not None:
        pytest.skip(f"{name} grades in the sandbox, which this machine lacks: {why}")
    if name not in _ENVS:
        if name == "listing-summary":
            pytest.importorskip("sentence_transformers", reason="listing-summary scores with sentence-transformers")
        try:
            task = load_task(name, OPTIONS.get(name, {}))
        except Exception as e:  # noqa: BLE001 - a missing embedding model is the only expected reason
            if name == "listing-summary":
                pytest.skip(f"listing-summary needs its embedding model offline: {e}")
            raise
        env = make_env(task, tok, SampleParams(max_tokens=task.max_tokens or 64, stop=list(task.stop)))
        _ENVS[name] = (task, env, task.train_rows[0])
    return _ENVS[name]


def _tool_names(task: Any) -> list[str]:
    return [t.name if isinstance(t, Tool) else Tool.from_function(t).name for t in task.tools]


def play(name: str, tok: Any, reply: str | list[str]) -> Any:
    """One rollout and its scoring, straight through the env (the replies in turn); asserts the time bound."""
    task, env, row = _env(name, tok)

    sampler = HostileSampler(tok, reply)

    async def go():
        traj = await env.rollout(row, sampler)
        (traj,) = await scored_by(env, [traj])
        return traj

    t0 = time.monotonic()
    traj = asyncio.run(go())
    took = time.monotonic() - t0
    assert took < PER_SAMPLE_S, f"{name}: one sample took {took:.1f}s (reply {str(reply)[:80]!r}...)"
    assert traj.turns and isinstance(traj.reward, float)
    lost = traj.failed and (name not in SANDBOX_TASKS or PARSE_ERROR.search(traj.error or ""))
    assert not lost, f"{name}: the sample failed instead of scoring as a wrong answer: {traj.error}"
    return traj


# ---- the families ----------------------------------------------------------------------------------------------

def call(name: Any, arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def raw_call(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


D = 50_000  # nesting depth: far past every recursion limit
NESTED_ARRAY = "[" * D + "]" * D
NESTED_OBJECT = '{"a":' * D + "1" + "}" * D
BIG_INT = "9" * 5000  # past Python's 4300-digit int conversion limit
MB = 1 << 20
SURROGATES = b"\xff\xfe\xc3(\xed\xa0\x80".decode("utf-8", "surrogateescape")  # invalid UTF-8, as surrogateescape
DEEP_PYTHON = {
    "parens": "(" * 199 + "1" + ")" * 199,  # the parser's own limit is 200
    "unary": "-" * 7000 + "1",  # ast.parse: MemoryError
    "binop": "x" + " + x" * 7000,  # ast.parse: RecursionError
    "not": "not " * 3000 + "x",
    "lambda": "lambda: " * 3000 + "1",
    "attribute": "x" + ".a" * 7000,
    "call": "f" + "()" * 7000,
}
REGEXES = ["(a+)+$", "(?:(?:a{100}){100}){100}", "(a|a)*b", "(a*)*$", "a{1000000000}", "(", "[", "\\1",
           "(?R)", "(?P<x>a)(?P=y)", "((((((((((a))))))))))" * 50, "\\p{", "(?<=a+)b", "x" * 100_000]


def worst_cases() -> list[tuple[str, str]]:
    """(family/case, reply) for every task; tool calls name the tools a tool task has, and unknown ones."""
    cases = [
        ("empty", ""),
        ("whitespace", " \n\t" * 1000),
        ("nested-json/array", NESTED_ARRAY),
        ("nested-json/object", NESTED_OBJECT),
        ("nested-json/unclosed", "[" * 200_000),
        ("nested-json/open-braces", "{" * 200_000),
        ("nested-json/fenced", "```json\n" + NESTED_OBJECT + "\n```"),
        ("nested-json/tool-call", raw_call(NESTED_OBJECT)),
        ("nested-json/tool-args", raw_call('{"name": "search", "arguments": ' + NESTED_OBJECT + "}")),
        ("nested-json/args-string", raw_call(json.dumps({"name": "search", "arguments": NESTED_ARRAY}))),
        ("nested-json/bare-call", '{"name": "search", "arguments": ' + NESTED_OBJECT + "}"),
        ("huge-number/int", BIG_INT),
        ("huge-number/json-int", '{"a": ' + BIG_INT + ', "price": ' + BIG_INT + "}"),
        ("huge-number/inf", '{"price": 1e999, "confidence": 1e999, "probs": {"billing": 1e999}, "label": "billing"}'),
        ("huge-number/nan", '{"price": NaN, "confidence": -Infinity, "probs": {"billing": NaN}, "label": "billing"}'),
        ("huge-number/arith", "-" + BIG_INT),
        ("huge-number/float", "1e999"),
        ("huge-number/drawing", f"canvas({BIG_INT}, 1e999)\nfor i in range({BIG_INT}):\n"
                                f"    circle(1e999, -1e999, {BIG_INT}, \"red\")"),
        ("huge-number/tool-arg", raw_call('{"name": "read_file", "arguments": {"path": "x.py", "start_line": ' + BIG_INT
                                          + ', "end_line": 1e999}}')),
        ("utf8/replacement", "\ufffd" * 10_000),
        ("utf8/surrogateescape", SURROGATES * 100),
        ("utf8/lone-surrogate", "\ud800 \udfff {\"a\": \"\ud800\"}"),
        ("utf8/json-escaped-surrogate", '{"name": "\\ud800", "text": "\\udfff", "label": "\\ud800"}'),
        ("utf8/surrogate-tool-args", call("search", {"pattern": "\ud800", "query": "\udfff", "text": "\ud800"})),
        ("utf8/escaped-surrogate-tool-args", raw_call('{"name": "edit_file", "arguments": {"path": "\\ud800.py", '
                                                      '"new": "\\udfff", "old": "\\ud800"}}')),
        ("nul/text", "\x00" * 10_000),
        ("nul/json", '{"a\\u0000": "\\u0000", "label": "\x00"}'),
        ("nul/tool-args", call("read_file", {"path": "a\x00b.py", "pattern": "\x00", "query": "\x00"})),
        ("nul/code", fenced("def f(x):\x00\n    return x\x00")),
        ("megabyte/line", "a" * MB),
        ("megabyte/json", "{" + '"a": 1, ' * (MB // 8) + '"b": 2}'),
        ("megabyte/fenced", fenced("x = 1  # " + "a" * MB)),
        ("megabyte/tool-arg", call("search", {"pattern": "a" * MB, "query": "a" * MB})),
        ("megabyte/newlines", "\n" * MB),
        ("tools/unknown", call("rm_rf", {"path": "/"})),
        ("tools/name-not-string", raw_call('{"name": 5, "arguments": {}}')),
        ("tools/args-not-object", raw_call('{"name": "search", "arguments": [1, 2, 3]}')),
        ("tools/args-null", raw_call('{"name": "search", "arguments": null}')),
        ("tools/args-json-string", raw_call(json.dumps({"name": "search", "arguments": "{\"pattern\": 1}"}))),
        ("tools/wrong-types", call("search", {"pattern": {"a": [1]}, "regex": "yes", "query": 3.5})),
        ("tools/unterminated", "<tool_call>{\"name\": \"search\", \"arguments\": {\"pattern\": \"a"),
        ("tools/many-calls", call("list_files", {}) * 2000),
        ("tools/block-argument",
         "```\n" + "a" * 10_000 + "\n```\n" + call("edit_file", {"path": "x.py", "new": "```"})),
        ("tools/nested-tags", "<tool_call>" * 10_000 + "</tool_call>" * 10_000),
        ("tools/fences", "```" * 50_000),
    ]
    for k, code in DEEP_PYTHON.items():
        cases.append((f"nested-python/{k}", fenced(code)))
        cases.append((f"nested-python/def-{k}", fenced(f"def f(x):\n    return {code}")))
    for i, pattern in enumerate(REGEXES):
        cases.append((f"regex/{i}", call("search", {"pattern": pattern, "regex": True})))
    return cases


SUBMIT = call("submit", {})
EDIT = {"path": "inventory/report.py", "old": "raise NotImplementedError"}
CODING_AGENT_CASES = [  # hostile code that gets past edit_file's caps, then submitted: the grader sees it
    (f"nested-python/edit-{k}", [call("edit_file", {**EDIT, "new": f"return {code[:7500]}"}), SUBMIT])
    for k, code in DEEP_PYTHON.items()
] + [
    ("nested-python/edit-block", [fenced(DEEP_PYTHON["binop"][:7500]) + call(
        "edit_file", {"path": "inventory/report.py", "start_line": 1, "end_line": 1, "new": "```"}), SUBMIT]),
    ("nul/edit", [call("edit_file", {**EDIT, "new": "return '\x00'\x00"}), SUBMIT]),
    ("utf8/edit-surrogate", [raw_call('{"name": "edit_file", "arguments": {"path": "inventory/report.py", '
                                      '"old": "raise NotImplementedError", "new": "return \\"\\ud800\\""}}'),
                             SUBMIT]),
    ("utf8/edit-surrogate-raw", [raw_call(json.dumps({"name": "edit_file",
                                                      "arguments": {**EDIT, "new": "return '\ud800'"}},
                                                     ensure_ascii=False)), SUBMIT]),
    ("huge-number/edit", [call("edit_file", {**EDIT, "new": f"return {BIG_INT}"}), SUBMIT]),
]

TASKS = sorted(BUILTIN_TASKS)
WORST = worst_cases()


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("case", WORST, ids=[c for c, _ in WORST])  # case by case: a reply is tokenized once
def test_worst_cases_neither_raise_nor_stall(tok, name, case):
    play(name, tok, case[1])


@pytest.mark.parametrize("case", CODING_AGENT_CASES, ids=[c for c, _ in CODING_AGENT_CASES])
def test_hostile_code_reaches_the_coding_agents_grader_safely(tok, case):
    play("coding-agent", tok, case[1])


# ---- generated: hypothesis composes the families -------------------------------------------------------------

HOSTILE_STRINGS = st.one_of(
    st.text(max_size=50),
    st.sampled_from(["\x00", "\ud800", "\ufffd", SURROGATES, BIG_INT, "1e999", "NaN", "```", "<tool_call>",
                     "</tool_call>", "\n" * 100, "(a+)+$", "(?:(?:a{100}){100}){100}", *DEEP_PYTHON.values()]),
    st.integers(min_value=1, max_value=200_000).map(lambda n: "[" * n + "]" * n),
    st.integers(min_value=1, max_value=MB).map(lambda n: "a" * n),
)
JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), HOSTILE_STRINGS)
JSON_VALUES = st.recursive(
    JSON_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner,
                                                                                     max_size=4)),
    max_leaves=12)


@st.composite
def hostile_reply(draw, tools: list[str]) -> str:
    """A reply built from the families: text, nesting, a tool call of any shape to a real or unknown tool, in a
    fenced block or not, repeated."""
    kind = draw(st.sampled_from(["text", "nested", "call", "raw-call", "fenced", "mixed"]))
    if kind == "text":
        return draw(HOSTILE_STRINGS)
    if kind == "nested":
        n = draw(st.integers(1, 100_000))
        open_, close = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ("(", ")")]))
        return open_ * n + draw(st.sampled_from(["", "1", "x"])) + close * draw(st.integers(0, n))
    name = draw(st.one_of(st.sampled_from(tools or ["search"]), st.text(max_size=20), st.integers()))
    if kind == "call":
        args = draw(st.one_of(st.dictionaries(st.one_of(st.sampled_from(["path", "pattern", "regex", "query", "new",
                                                                          "old", "start_line", "end_line", "text"]),
                                                         st.text(max_size=10)), JSON_VALUES, max_size=5),
                              JSON_VALUES))
        return call(name, args) * draw(st.integers(1, 3))
    if kind == "raw-call":
        return raw_call(draw(HOSTILE_STRINGS))
    if kind == "fenced":
        return fenced(draw(HOSTILE_STRINGS))
    return draw(HOSTILE_STRINGS) + call(name, draw(JSON_VALUES)) + draw(HOSTILE_STRINGS)


@pytest.mark.parametrize("name", TASKS)
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_hostile_replies_neither_raise_nor_stall(tok, name, data):
    task, _, _ = _env(name, tok)
    reply = data.draw(hostile_reply(_tool_names(task)), label="reply")
    play(name, tok, reply)


# ---- fixes the families found, pinned ---------------------------------------------------------------------------

def test_a_huge_number_is_a_wrong_answer_not_a_failed_sample(tok):
    """arith read the answer with int(), which refuses more than 4300 digits: the reward raised and the sample
    failed instead of scoring 0."""
    from posttrain.tasks.arith import last_integer

    traj = play("arith", tok, BIG_INT)
    assert not traj.failed and traj.reward == 0.0
    assert last_integer("x = -" + BIG_INT) == "-" + BIG_INT and last_integer("007 and -0") == "0"


def test_the_local_judge_reads_a_clipped_completion():
    """A megabyte reply made the json-extract-judged judge's forward pass run for minutes, holding the model for
    every later call (each then timed out): the judge now reads at most MAX_JUDGED_CHARS of a completion."""
    from posttrain.tasks.json_judged import (MAX_JUDGED_CHARS, QUESTION, ClippedPairwiseJudge,
                                                  ClippedPointwiseJudge)

    class Stats:
        def add(self, **kw):
            pass

    class Runner:
        def __init__(self):
            self.asked: list[str] = []
            self.stats = Stats()

        def ask(self, kind, question, questions, parse):
            self.asked += questions
            return [parse(0.5) for _ in questions]

    runner = Runner()
    judge = ClippedPointwiseJudge(runner, QUESTION, name="judge", yes_means_pass=False)
    short = [{"role": "assistant", "content": '{"a": 1}'}]
    assert judge([[{"role": "assistant", "content": "x" * MB}], short, "y" * MB]) == [0.5, 0.5, 0.5]
    assert all(len(q) < MAX_JUDGED_CHARS + len(QUESTION) + 10 for q in runner.asked)
    assert '{"a": 1}' in runner.asked[1]  # a completion within the limit is read whole
    judge(["\ud800 \udcff"])  # a lone surrogate: the judge's tokenizer raised UnicodeEncodeError
    assert runner.asked[-1].endswith("\ufffd \ufffd")
    pair = ClippedPairwiseJudge(Runner(), "A: {a}\nB: {b}\nIs A better?")
    pair(["x" * MB, "z"])
    assert all(len(q) < MAX_JUDGED_CHARS + 40 for q in pair.runner.asked)


def test_a_tool_result_with_a_lone_surrogate_is_tokenized(tok):
    """A tool that echoes what the model wrote can hand back a lone surrogate (a `\\udcff` from bytes decoded
    with surrogateescape, a JSON escape); the next turn's tokens were computed with the tokenizer, which raised
    TypeError on it."""
    from posttrain.envs.task import Task
    from posttrain.envs.tool_env import ToolEnv
    from posttrain.rewards.rubric import Rubric

    def echo(text: str) -> str:
        """Say it back."""
        return text + "\udcff"

    rows = [{"prompt": [{"role": "user", "content": "echo"}]}]
    task = Task("echo", rows, [], Rubric.from_funcs([lambda completions, **kw: [0.0] * len(completions)]),
                tools=[echo], max_turns=2)
    env = ToolEnv(task, tok, SampleParams(max_tokens=16), task.tools, max_turns=2)
    traj = asyncio.run(env.rollout(rows[0], HostileSampler(tok, [call("echo", {"text": "hi"}), "done"])))
    assert len(traj.turns) == 2 and traj.messages[2]["content"] == "hi\ufffd"


# ---- what comes back from tools and envs: any size, any content, within the context (issue #52) -----------------

TOOL_RESULTS = st.one_of(HOSTILE_STRINGS, JSON_VALUES.map(lambda v: v if isinstance(v, str) else json.dumps(v)),
                         st.integers(min_value=1, max_value=5 * MB).map(lambda n: "z" * n))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(results=st.lists(TOOL_RESULTS, min_size=1, max_size=4), budget=st.integers(min_value=1500, max_value=6000),
       overflow=st.sampled_from(["fail", "truncate"]))
def test_hostile_tool_results_are_bounded_and_keep_every_turn_within_the_context(tok, results, budget, overflow):
    """A tool answers with whatever the strategy draws (megabytes, nesting, lone surrogates, NULs), turn after turn:
    the episode never raises, every turn's prompt + max_tokens fits the sampler's budget, each result reaches the
    model cut to max_observation_chars, and the episode ends by its turns, its answer or a context stop."""
    from posttrain.envs.task import Task
    from posttrain.envs.tool_env import ToolEnv
    from posttrain.rewards.rubric import RewardComponent, Rubric
    from posttrain.sampling.context import ContextBudget
    from posttrain.sampling.scripted import ScriptedSampler

    answers = iter(results * 20)

    def read() -> str:
        """Read the next page."""
        return next(answers)

    rows = [{"prompt": [{"role": "user", "content": "read"}]}]
    task = Task("t", rows, rows, Rubric([RewardComponent("any", lambda completions, **_: [0.0] * len(completions))]),
                tools=[read], max_turns=8, max_observation_chars=500)
    env = ToolEnv(task, tok, SampleParams(max_tokens=16), task.tools, max_turns=8)
    first = len(env.initial_messages(rows[0])[0]["content"])
    ctx = ContextBudget(first + budget, overflow=overflow)
    sampler = ScriptedSampler(tok, ['<tool_call>{"name": "read", "arguments": {}}</tool_call>'], context=ctx)
    t0 = time.monotonic()
    traj = asyncio.run(env.rollout(rows[0], sampler))
    assert time.monotonic() - t0 < PER_SAMPLE_S
    assert traj.stop_reason in ("context", "max_turns")
    assert all(len(t.prompt_ids) + 16 <= ctx.max_context for t in traj.turns)
    assert all(len(m["content"]) <= 500 for m in traj.messages if m["role"] == "tool")


def test_a_long_reply_fits_the_judges_context_in_its_own_tokens():
    """The judge read at most MAX_JUDGED_CHARS characters, which a character-level tokenizer (tiny-random, context
    1024) spends 4000 tokens on: the judge prompt overflowed its context and the sample failed instead of scoring
    as a wrong answer (40 hostile cases failed on a machine whose judge cache was empty). Now the local judge cuts
    by its own tokens to the room its context leaves."""
    task = load_task("json-extract-judged", {"judge_model": "tiny-random", "n_train": 2, "n_eval": 0})
    judge, pair = task.judges["judge"], task.judges["pairwise_judge"]
    replies = ["x" * 5000, "\u00e9\u4e2d" * 3000, [{"role": "assistant", "content": "{" * 9000}], '{"a": 1}']
    scores = judge.score_all(replies)
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores), scores
    verdicts = pair.compare_many([(replies[0], replies[1]), (replies[3], replies[2])])
    assert not any(isinstance(v, Exception) for v in verdicts), verdicts
