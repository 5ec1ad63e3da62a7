"""`search-qa`: answer questions about a made-up world, searching a local BM25 index only when needed.

After the "Adaptive Instructed-Retriever" idea: the agent learns *when* to search, because the reward is answer
correctness minus a price per search:

    reward = correct + format_bonus * called_answer - search_cost * tool_steps

(tool_steps: replies before the final answer; in a well-formed episode, the number of searches)

The world is generated from `seed` (people, cities, countries, festivals, companies and the relations between
them), so no fact can be known from pretraining. Each entity has a 2-3 sentence document. Questions are single-hop
("Who is the mayor of Zorvan?"), two-hop ("Who is the mayor of the city where the Blue Lantern festival is
held?"), and a share `given_fraction` of them state the needed facts in the prompt ("Fact: ... Question: ..."),
where searching only costs. Train and held-out rows are split by question (a question and its "given" variant
land on the same side); the corpus, and so the entities, are shared.

Tools (bound to this task's corpus): `search(query)` returns the top-2 documents, `answer(text)` ends the episode
with `text` as the answer. See docs/search_qa.md.

The world and its questions are in search_qa_world.py.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import Task
from posttrain.envs.tools import parse_calls
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.rewards.text import completion_text
from posttrain.tasks import bm25
from posttrain.tasks.search_qa_world import EXAMPLE_QUERY, World, all_questions, build_world

TOP_K = 2

INSTRUCTIONS = (
    "Answer the question about a made-up world. If the facts are not given, search for them; each "
    "search has a cost. Make one call per reply, for example:\n"
    f'<tool_call>{{"name": "search", "arguments": {{"query": "{EXAMPLE_QUERY}"}}}}</tool_call>\n'
    'Finish by calling answer with the name as "text".'
)


def _hash01(*parts: Any) -> float:
    h = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def _row(q: dict[str, Any], given: bool) -> dict[str, Any]:
    facts = f"Fact: {' '.join(q['facts'])}\n" if given else ""
    user = f"{INSTRUCTIONS}\n\n{facts}Question: {q['question']}"
    return {
        "prompt": [{"role": "user", "content": user}],
        "question": q["question"],
        "answer": q["answer"],
        "answer_kind": q["answer_kind"],
        "hops": q["hops"],
        "given": given,
        "chain": list(q["chain"]),
    }


# ---- tools -----------------------------------------------------------------------------------------------------


def make_tools(world: World) -> list:
    """`search` and `answer`, bound to `world`'s index."""
    index = world.index

    def search(query: str) -> str:
        """Search the encyclopedia; returns the 2 best documents.

        Args:
            query: names or words to look for
        """
        hits = bm25.top_k(index, str(query)[:200], TOP_K)
        return "\n".join(f"[{index.ids[i]}] {index.texts[i]}" for i, _ in hits) or "no results"

    def answer(text: str) -> str:
        """Give your final answer and stop.

        Args:
            text: the answer, a name
        """
        return "ok"

    return [search, answer]


# ---- demonstrations (for the supervised warm start) ------------------------------------------------------------


def tool_call_text(name: str, **arguments: str) -> str:
    """One call in the format the prompt's example shows."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def make_demonstrator(seed: int = 0, search_given: float = 0.5):
    """demonstrate(row) -> replies: search each entity of the chain but the last, then answer. On rows whose facts
    are given it searches only for a `search_given` share of them (a seeded hash of the question decides).

    This teaches the mechanics (a working search call, reading the name out of a document, the answer call) but
    not the policy: on given rows the warm-started model is undecided whether to search, and on the others it
    always searches. What it should do at a given price per search is left to RL (see docs/search_qa.md)."""

    def demonstrate(row: dict[str, Any]) -> list[str]:
        chain = row["chain"]
        searches = [] if row["given"] and _hash01("demo", seed, row["question"]) >= search_given else chain[:-1]
        return [tool_call_text("search", query=q) for q in searches] + [tool_call_text("answer", text=row["answer"])]

    return demonstrate


# ---- rubric ----------------------------------------------------------------------------------------------------


def normalize(text: str) -> str:
    """Lowercase, punctuation to spaces, whitespace collapsed."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", str(text).lower()).split())


def still_a_call(text: str) -> bool:
    """The episode's last reply is a tool call, not an answer (the turns ran out before one)."""
    return "<tool_call>" in text or bool(parse_calls(text)[0])


def _names(calls: list[dict[str, Any]] | None, name: str) -> int:
    return sum(1 for c in calls or [] if c.get("name") == name)


def make_rubric(world: World, search_cost: float = 0.1, format_bonus: float = 0.1) -> Rubric:
    """correct (pass) + format_bonus * called answer + search_cost (= -lambda * tool steps: every reply before the
    final answer, which for a well-formed episode is the number of searches); num_searches is logged
    with weight 0. The format bonus is shaping: it pays a 135M model for producing the answer call at all, which
    it rarely does before training; it is small next to `correct` so it never beats a right answer."""
    by_kind = {k: [normalize(n) for n in world.names(k)] for k in ("person", "city", "country")}

    def correct(completions, answer, answer_kind, **kwargs) -> list[float]:
        """1 if the answer holds the gold name (whole words, normalized) and names no other entity of its kind:
        listing candidates does not pay. A reply that is still a tool call (turns ran out) is no answer."""
        out = []
        for c, gold, kind in zip(completions, answer, answer_kind):
            text = completion_text(c)
            if still_a_call(text):
                out.append(0.0)
                continue
            a, g = f" {normalize(text)} ", normalize(gold)
            others = [n for n in by_kind.get(kind, []) if n != g and f" {n} " in a]
            out.append(float(f" {g} " in a and not others))
        return out

    def num_searches(completions, tool_calls=None, **kwargs) -> list[float]:
        calls = tool_calls if tool_calls is not None else [[]] * len(completions)
        return [float(_names(c, "search")) for c in calls]

    def tool_steps(completions, tool_calls=None, num_turns=None, **kwargs) -> list[float]:
        """Replies spent before the final answer: searches, and also malformed calls or calls to unknown tools.
        Pricing only `search` calls let a policy at a high price escape every cost by emitting junk calls and
        never answering (reward 0 beats a two-search episode at -0.1; seen in a run at lambda 0.6)."""
        if num_turns is None:  # scored outside an episode (env check): count the calls
            return [float(len(c or []) - _names(c, "answer")) for c in (tool_calls or [[]] * len(completions))]
        out = []
        for c, n in zip(completions, num_turns):
            text = completion_text(c)
            ended = not still_a_call(text)  # answered, or a plain-text reply
            out.append(float(max(int(n) - int(ended), 0)))
        return out

    def search_penalty(completions, tool_calls=None, num_turns=None, **kwargs) -> list[float]:
        return [-search_cost * n for n in tool_steps(completions, tool_calls, num_turns)]

    def called_answer(completions, tool_calls=None, **kwargs) -> list[float]:
        calls = tool_calls if tool_calls is not None else [[]] * len(completions)
        return [float(_names(c, "answer") > 0) for c in calls]

    return Rubric(
        [
            RewardComponent("correct", correct, weight=1.0),
            RewardComponent("format", called_answer, weight=format_bonus),
            # passes (pass/search_cost) when the episode spent no step before answering
            RewardComponent("search_cost", search_penalty, weight=1.0, pass_threshold=0.0),
            # weight 0: logged only; passes (pass/num_searches) when the episode searched at least once
            RewardComponent("num_searches", num_searches, weight=0.0, pass_threshold=1.0),
        ],
        pass_component="correct",
    )


# ---- the task --------------------------------------------------------------------------------------------------


def make_task(
    n_train: int = 300,
    n_eval: int = 60,
    seed: int = 0,
    search_cost: float = 0.1,
    max_turns: int = 4,
    max_tokens: int = 64,
    hops: Iterable[int] = (1, 2),
    given_fraction: float = 0.25,
    format_bonus: float = 0.1,
    demo_search_given: float = 0.5,
) -> Task:
    """The `search-qa` task. Deterministic in `seed` (world, split, which questions state their facts). Held-out
    rows are the `n_eval` questions first in a seeded hash order, so they do not depend on `n_train`; training
    rows are the next ones (repeated in order when `n_train` exceeds the pool)."""
    if n_train < 1 or n_eval < 0:
        raise ValueError(f"need n_train >= 1 and n_eval >= 0, got n_train={n_train}, n_eval={n_eval}")
    if not 0.0 <= given_fraction <= 1.0:
        raise ValueError(f"given_fraction must be in [0, 1], got {given_fraction}")
    if search_cost < 0:
        raise ValueError(f"search_cost must be >= 0, got {search_cost}")
    world = build_world(seed)
    pool = sorted(all_questions(world, hops), key=lambda q: _hash01("split", seed, q["question"]))
    if len(pool) <= n_eval:
        raise ValueError(
            f"search-qa has {len(pool)} questions for hops={sorted(set(hops))}; n_eval={n_eval} "
            "leaves none for training"
        )
    rows = [_row(q, _hash01("given", seed, q["question"]) < given_fraction) for q in pool]
    eval_rows, train_pool = rows[:n_eval], rows[n_eval:]
    train_rows = [train_pool[i % len(train_pool)] for i in range(n_train)]
    first = train_rows[0]
    return Task(
        smoke_checks=[
            SmokeCheck("the gold answer passes", row=first, completion=first["answer"]),
            SmokeCheck("another name fails", row=first, completion="Nobody Atall", expect="fail"),
        ],
        name="search-qa",
        train_rows=train_rows,
        eval_rows=eval_rows,
        rubric=make_rubric(world, search_cost, format_bonus),
        description=f"Questions about a generated world ({len(world.entities)} documents); search a BM25 index "
        f"(top-{TOP_K}) at a cost of {search_cost:g} per search (or any other step before the answer), "
        "then call answer.",
        max_tokens=max_tokens,
        # One call per reply: stop once the call is closed. The text is cut before the stop string, which the
        # tool-call parser accepts (an unterminated final block parses when its JSON is complete); the sampled
        # token ids keep "</tool_call>".
        stop=["</tool_call>"],
        tools=make_tools(world),
        max_turns=max_turns,
        final_tool="answer",
        demonstrate=make_demonstrator(seed, demo_search_given),
    )
