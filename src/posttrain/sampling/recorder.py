"""Server-side record of the model calls made under one rollout id, and their conversion to Trajectories.

An agent written against the `openai` client only ever sees text. The server records, per call, the exact
prompt token ids the sampler was given and the completion token ids and logprobs it produced; that record,
not the text the agent got back, is what the trainer uses.

Multi-turn and the prefix contract: a Trajectory needs each turn's prompt to extend the previous turn's prompt +
completion token for token. The server tries to make that true (it splices the policy's own completion tokens
into the next prompt, see chat_prompt.py), but an agent is free to rewrite history (drop messages, summarize,
start a fresh conversation). `chains()` therefore SPLITS the calls of a rollout into prefix-consistent chains:
each call joins the most recent chain whose last turn it extends, or starts a new chain. `episode(row, "all")`
keeps every chain: the Trajectory's turns are the chain of the last call, the others its `extra_chains`, each
trained as a sequence of its own (as tinker-cookbook splits a trace wherever a prompt stops extending the last
turn). `trajectory()` (and `episode(row, "longest")`) returns the chain with the most policy tokens (ties: the
later one); the calls in other chains are reported in `RolloutRecord.dropped_calls` and not trained on.
`trajectories()` returns every chain as a Trajectory of its own.

Per-rollout sampling defaults: a client that serves several rollouts (AgentEnv: the run's temperature, top_p,
top_k, max_tokens for each) stores them by rollout id (`set_defaults`); the server fills what a request leaves
unset from them (sampling/rollout_defaults.py) and counts the requests that set another temperature, which the
record returns (`temperature_overrides`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from posttrain.types import Trajectory, Turn


@dataclass
class RecordedCall:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    policy_version: int
    finish_reason: str
    text: str = ""  # the completion text returned to the client
    messages: list[dict[str, Any]] | None = None  # chat requests: the conversation as the client sent it
    tools: list[dict[str, Any]] | None = None
    reply: dict[str, Any] | None = None  # chat requests: the assistant message returned
    created: float = field(default_factory=time.time)
    token_versions: list[int] | None = None  # Completion.token_versions

    def as_turn(self) -> Turn:
        return Turn(
            prompt_ids=list(self.prompt_ids),
            completion_ids=list(self.completion_ids),
            completion_logprobs=list(self.logprobs),
            policy_version=self.policy_version,
            finish_reason=self.finish_reason,
            token_versions=self.token_versions,
        )


class _Call(Protocol):
    """What chains are made of: a RecordedCall, or an env's Turn (envs/tool_env.py splits its turns the same way)."""

    @property
    def prompt_ids(self) -> list[int]: ...
    @property
    def completion_ids(self) -> list[int]: ...


C = TypeVar("C", bound=_Call)


def extends(call: _Call, prev: _Call) -> bool:
    ctx = list(prev.prompt_ids) + list(prev.completion_ids)
    return len(call.prompt_ids) >= len(ctx) and list(call.prompt_ids[: len(ctx)]) == ctx


def split_chains(calls: list[C]) -> list[list[C]]:
    """Group calls (in call order) into prefix-consistent chains; see the module docstring."""
    chains: list[list[C]] = []
    for c in calls:
        for chain in reversed(chains):
            if extends(c, chain[-1]):
                chain.append(c)
                break
        else:
            chains.append([c])
    return chains


def chain_to_trajectory(chain: list[RecordedCall], row: dict[str, Any] | None = None) -> Trajectory:
    first = chain[0]
    prompt_text = ""
    if first.messages:
        prompt_text = "\n".join(f"[{m.get('role')}] {m.get('content')}" for m in first.messages)
    return Trajectory(
        turns=[c.as_turn() for c in chain], prompt_text=prompt_text, completion_text=chain[-1].text, row=dict(row or {})
    )


def chains_of_turns(turns: list[Turn]) -> tuple[list[Turn], list[list[Turn]]]:
    """An episode's turns (in order) as (the chain of its last turn, the other chains): a Trajectory's `turns` and
    `extra_chains`, as `RolloutRecord.episode(row, "all")` makes them."""
    if not turns:
        return [], []
    chains = split_chains(turns)
    main = next(ch for ch in chains if ch[-1] is turns[-1])
    return main, [ch for ch in chains if ch is not main]


CHAIN_MODES = ("all", "longest")


@dataclass(frozen=True)
class RolloutDefaults:
    """What a rollout's requests are sampled with where they set nothing. None: the server's own default. A chat
    request's max_tokens default is the server's (`default_max_tokens`, cut to fit the context); `max_tokens` here
    is for /v1/completions, whose own default is OpenAI's 16."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None


@dataclass
class RolloutRecord:
    calls: list[RecordedCall]
    # Requests that set a temperature other than the rollout's default (RolloutDefaults), and the last one asked.
    temperature_overrides: int = 0
    asked_temperature: float | None = None

    def chains(self) -> list[list[RecordedCall]]:
        return split_chains(self.calls)

    def trajectories(self, row: dict[str, Any] | None = None) -> list[Trajectory]:
        return [chain_to_trajectory(ch, row) for ch in self.chains()]

    def best_chain(self) -> list[RecordedCall]:
        chains = self.chains()
        if not chains:
            return []
        return max(reversed(chains), key=lambda ch: sum(len(c.completion_ids) for c in ch))

    def trajectory(self, row: dict[str, Any] | None = None) -> Trajectory | None:
        chain = self.best_chain()
        return chain_to_trajectory(chain, row) if chain else None

    @property
    def dropped_calls(self) -> int:
        return len(self.calls) - len(self.best_chain())

    def episode(self, row: dict[str, Any] | None = None, chains: str = "all") -> Trajectory | None:
        """The rollout as one Trajectory (None: no calls), its completion text the last reply. `chains="all"`: its
        turns are the chain of the last call and every other chain is one of its `extra_chains` (nothing dropped);
        "longest": the chain with the most policy tokens only (`dropped_calls` counts the rest)."""
        if chains not in CHAIN_MODES:
            raise ValueError(f"chains must be one of {CHAIN_MODES}, got {chains!r}")
        if not self.calls:
            return None
        all_chains = self.chains()
        last = self.calls[-1]
        main = self.best_chain() if chains == "longest" else next(ch for ch in all_chains if ch[-1] is last)
        traj = chain_to_trajectory(main, row)
        others = [[c.as_turn() for c in ch] for ch in all_chains if ch is not main] if chains == "all" else []
        return replace(traj, completion_text=last.text, extra_chains=others)


class RolloutRecorder:
    """Thread-safe store of RecordedCalls by rollout id. Calls without a rollout id are not recorded.

    `max_rollouts` bounds memory on a long-lived server whose clients never collect their records: the oldest
    rollout is evicted first.
    """

    def __init__(self, max_rollouts: int = 10_000):
        self.max_rollouts = max_rollouts
        self._calls: dict[str, list[RecordedCall]] = {}
        # Per-rollout sampling defaults, and the requests that overrode the temperature: (count, last asked).
        # Bounded like the calls; popped with them.
        self._defaults: dict[str, RolloutDefaults] = {}
        self._overrides: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def record(self, rollout_id: str, call: RecordedCall) -> None:
        with self._lock:
            if rollout_id not in self._calls and len(self._calls) >= self.max_rollouts:
                self._calls.pop(next(iter(self._calls)))
            self._calls.setdefault(rollout_id, []).append(call)

    def last(self, rollout_id: str) -> RecordedCall | None:
        with self._lock:
            calls = self._calls.get(rollout_id)
            return calls[-1] if calls else None

    def calls(self, rollout_id: str) -> list[RecordedCall]:
        with self._lock:
            return list(self._calls.get(rollout_id, []))

    def get(self, rollout_id: str) -> RolloutRecord:
        return RolloutRecord(self.calls(rollout_id))

    def pop(self, rollout_id: str) -> RolloutRecord:
        """The rollout's record, and everything kept for it forgotten (its calls, defaults and counts)."""
        with self._lock:
            self._defaults.pop(rollout_id, None)
            n, asked = self._overrides.pop(rollout_id, (0, None))
            return RolloutRecord(self._calls.pop(rollout_id, []), n, asked)

    def set_defaults(self, rollout_id: str, defaults: RolloutDefaults) -> None:
        with self._lock:
            if rollout_id not in self._defaults and len(self._defaults) >= self.max_rollouts:
                old = next(iter(self._defaults))
                self._defaults.pop(old)
                self._overrides.pop(old, None)
            self._defaults[rollout_id] = defaults

    def defaults(self, rollout_id: str) -> RolloutDefaults | None:
        with self._lock:
            return self._defaults.get(rollout_id)

    def count_temperature_override(self, rollout_id: str, asked: float) -> None:
        """A request of this rollout set `asked` where its default is another temperature (kept only for a
        rollout that has defaults, so the counts stay as bounded as they are)."""
        with self._lock:
            if rollout_id in self._defaults:
                self._overrides[rollout_id] = (self._overrides.get(rollout_id, (0, asked))[0] + 1, asked)

    def rollout_ids(self) -> list[str]:
        with self._lock:
            return list(self._calls)
