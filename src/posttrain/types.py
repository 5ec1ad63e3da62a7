"""The core RL types, in one module: what flows between sampler, env, rewards, algos and trainer.

Data flow:  Task row ─► Env.rollout ─► Trajectory ─► Group (G per prompt) ─► advantages ─► Batch ─► Trainer

Tokens in, tokens out: a trajectory keeps the exact prompt and completion token ids the sampler saw and
produced, the sampler's logprob of every sampled token and the policy version that sampled it. Nothing
downstream re-tokenizes text to recover them. Shape suffixes name list/tensor sizes (`completions_G`).

This module imports no torch, so configs, envs and rewards stay importable without it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, replace
from typing import Any

# The column a mixture's rows carry (tasks/mixture.py): which of its tasks a row came from. Metrics break pass
# rates and rewards down by it (obs/rollout_stats.py).
TASK_COLUMN = "mixture_task"


@dataclass(frozen=True)
class Constraint:
    """Decoding held to a grammar (sampling/constrained.py): `kind` "json_schema" (`spec` the schema's JSON text)
    or "lark" (`spec` a Lark grammar, llguidance's syntax)."""

    kind: str
    spec: str


@dataclass
class SampleParams:
    """How to sample. `temperature=0` means greedy. Logprobs are always of softmax(logits / temperature)."""

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    # The caller will extend prompt + completion in a later call (a multi-turn env's next turn): a sampler with a
    # prefix cache keeps these rows' KV so that call prefills only the new tokens (sampling/prefix_cache.py).
    keep_prefix: bool = False
    # Every row's completion held to this grammar (sampling/constrained.py); its logprobs are then of the masked,
    # renormalised distribution it was sampled from. None: unconstrained.
    constraint: Constraint | None = None


@dataclass
class Completion:
    """One sampled completion, as the sampler produced it."""

    token_ids: list[int]
    logprobs: list[float]  # sampler's log p(token) for each token in token_ids
    # "stop" (eos or stop string) or "length"; "context_overflow": a row of a several-prompt call that did not fit
    # the context (sampling/context.py `fit_rows`): no tokens, the reason in `error`, the call's other rows served
    finish_reason: str
    policy_version: int  # of the first token (the oldest, when a sync landed mid-generation)
    text: str = ""  # decoded completion, cut before the first stop string (token_ids keep every token)
    # The policy version each token was sampled under: differs within a completion only when a weight sync landed
    # during its generation (an interruptible sampler, loop.interruptible). None: all are `policy_version`.
    token_versions: list[int] | None = None
    error: str | None = None  # why this row was not sampled (finish_reason "context_overflow"); None: it was


@dataclass
class Turn:
    """One model call inside an episode: the exact context the policy saw and what it produced."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    policy_version: int  # of the turn's first token
    finish_reason: str = "stop"
    token_versions: list[int] | None = None  # per completion token (Completion.token_versions); None: all the same

    def versions(self) -> list[int]:
        """The policy version of each completion token."""
        return list(self.token_versions) if self.token_versions else [self.policy_version] * len(self.completion_ids)


@dataclass
class Guidance:
    """What a guidance method attached to one episode, for its teacher or its profiles (empty in a run without
    one): read by the self-distillation teacher's hint function (loop/batch.py) and RISED (guidance/profiles.py)."""

    remedy_hint: str | None = None  # the format hint a remedy appended (loop/collect.py); a hint teacher reads it
    teacher_hint: str | None = None  # what a self-distillation teacher reads (guidance/insights.py, profiles.py)
    tags: list[str] | None = None  # RISED behaviour tags (rewards/tags.py); None: not tagged


@dataclass(frozen=True)
class Trajectory:
    """One episode. Single-turn envs produce one turn; multi-turn envs append one per model call.

    Frozen: a record flows one way. Scoring returns scores that envs/scoring.py joins into a new trajectory
    (`dataclasses.replace`), and shaping returns new ones (loop/shaping.py); nothing downstream edits one."""

    turns: list[Turn]
    prompt_text: str = ""
    completion_text: str = ""
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    passed: bool = False
    failed: bool = False  # a reward function raised: the sample is counted and kept out of training
    error: str | None = None
    row: dict[str, Any] = field(default_factory=dict)  # the task row it came from (columns for rewards)
    metrics: dict[str, float] = field(default_factory=dict)  # per-episode numbers (tool calls, turns, ...)
    # What one env or method keeps for itself (a gym env's actions, an insight key). Anything another module
    # reads is a typed field below instead.
    extra: dict[str, Any] = field(default_factory=dict)
    failed_in: str | None = None  # a failed sample: "rollout" or "score", where it raised (envs/isolate.py)
    messages: list[dict[str, Any]] | None = None  # a multi-turn episode's conversation (samples.jsonl shows it)
    tool_calls: list[Any] = field(default_factory=list)  # a tool episode's calls, in order (tool envs, RISED rules)
    # Sampled from the row with a remedy's format hint appended, trained as if from the plain prompt
    # (guidance/guided_hint.py): its sampler log-probs are not drift between sampler and trainer.
    guided: bool = False
    guidance: Guidance = field(default_factory=Guidance)  # a guidance method's hints and tags
    # This step's sample number (PolicyGradientStepper numbers every rollout of a step): the key its Sequence
    # carries, so what the trainer measured (SampleStats) finds its trajectory again.
    sample_id: int | None = None
    # What went wrong, in words (a failing test, a schema violation, a tool error), from the task's `feedback`
    # function or the env itself, and the index of the turn it is about (None: the last turn). Hint-conditioned
    # self-distillation (algorithm.hint_distill) puts it into the teacher's context right before that turn.
    # (The hint a teacher reads is chosen by the stepper's hint function: loop/batch.py `hint_fn`, `env_hint`.)
    feedback: str | None = None
    feedback_turn: int | None = None
    # Why a multi-turn episode ended: "answer" (a reply without a tool call), "final_tool", "max_turns", or
    # "context" (the next turn no longer fit the model's context: the episode is trained on as truncated, its last
    # turn marked finish_reason "length"). None: a single-turn episode, or an env that does not say.
    stop_reason: str | None = None
    # The episode's other prefix-consistent chains of turns, when its model calls did not all extend one another
    # (an agent that rewrote its history: envs/agent.py, sampling/recorder.py). Each is trained as a sequence of its
    # own with this episode's reward and advantage (`sequences_of`); `turns` is the chain of the last call.
    extra_chains: list[list[Turn]] = field(default_factory=list)

    @property
    def prompt_ids(self) -> list[int]:
        return self.turns[0].prompt_ids

    @property
    def completion_ids(self) -> list[int]:
        """All tokens after the first prompt (completions and, in multi-turn, env tokens)."""
        return self.sequence()[0][len(self.turns[0].prompt_ids) :]

    def sequence(self) -> tuple[list[int], list[int], list[float]]:
        """Flatten turns into (token_ids, loss_mask, sampler_logprobs) for the completion part.

        Returns the full token sequence and, for the positions after the first prompt, a loss mask
        (1 = sampled by the policy) and the sampler logprob (0.0 where mask is 0). Each turn's prompt must
        extend the previous turn's prompt + completion token for token; this is the prefix contract that
        multi-turn envs must keep (they add env tokens, never rewrite history).
        """
        first = self.turns[0]
        tokens = list(first.prompt_ids)
        mask: list[int] = []
        logps: list[float] = []
        for i, turn in enumerate(self.turns):
            if i > 0:
                if turn.prompt_ids[: len(tokens)] != tokens:
                    raise ValueError(f"turn {i} prompt does not extend the previous turns token for token")
                extra = turn.prompt_ids[len(tokens) :]
                tokens += extra
                mask += [0] * len(extra)
                logps += [0.0] * len(extra)
            tokens += turn.completion_ids
            mask += [1] * len(turn.completion_ids)
            logps += list(turn.completion_logprobs)
        return tokens, mask, logps

    @property
    def num_completion_tokens(self) -> int:
        """The policy tokens the episode sampled, in every chain (its extra chains' too)."""
        return sum(len(t.completion_ids) for chain in (self.turns, *self.extra_chains) for t in chain)

    @property
    def policy_version(self) -> int:
        """The oldest version that sampled any of its turns (its extra chains' too)."""
        return min(t.policy_version for chain in (self.turns, *self.extra_chains) for t in chain)

    def token_versions(self) -> list[int]:
        """The policy version of every policy token, all turns in order, then the extra chains' (what per-token
        staleness is about: the async loop's bound holds for every token trained)."""
        return [v for chain in (self.turns, *self.extra_chains) for t in chain for v in t.versions()]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}  # records from older versions may hold retired fields
        d["turns"] = [Turn(**t) for t in d["turns"]]
        d["extra_chains"] = [[Turn(**t) for t in chain] for chain in d.get("extra_chains") or []]
        if isinstance(d.get("guidance"), dict):
            d["guidance"] = Guidance(**d["guidance"])
        return cls(**d)


@dataclass
class Group:
    """G trajectories for the same prompt: the unit GRPO-style advantages are computed over."""

    task_index: int
    trajectories_G: list[Trajectory]

    @property
    def rewards_G(self) -> list[float]:
        return [t.reward for t in self.trajectories_G]


@dataclass(frozen=True)
class Sequence:
    """One training sequence: prompt + completion tokens, with per-completion-token data.

    `prompt_ids` are shared by every sequence of a group, which lets the trainer compute the prompt once
    per group (prefix sharing). Lists over completion tokens all have len(completion_ids). Frozen: a step adds
    per-sequence data by making new sequences (`dataclasses.replace`), never by writing into one.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    advantage: float = 0.0
    group_id: int = 0
    policy_version: int = 0
    reward: float = 0.0  # the trajectory's reward after shaping (advantages are computed from it)
    finish_reason: str = "stop"  # of the last turn: "length" means the completion was truncated
    ref_logprobs: list[float] | None = None  # the reference model's, when a KL term needs them
    teacher_logprobs: list[float] | None = None  # a distillation teacher's, on these tokens (algorithm.teacher)
    # The behaviour policy of the PPO ratio (algorithm.behavior_logprobs); None: the current policy, detached.
    old_logprobs: list[float] | None = None
    # A hint for a self-distillation teacher (the trajectory's feedback), and where it goes: the index in
    # prompt_ids + completion_ids at which the completion of the turn it is about starts.
    hint: str | None = None
    hint_at: int | None = None
    # Sampled from another prompt than the one it is trained on (a remedy's guided format hint): its sampler
    # log-probs are the behaviour policy's but not comparable to the trainer's, so drift metrics skip it.
    guided: bool = False
    sample_id: int | None = None  # its trajectory's Trajectory.sample_id: what the trainer measured is keyed by it
    # A piece of an episode trained as several sequences (Trajectory.extra_chains): which episode of the batch
    # (the pieces share it, the advantage statistics count it once, loop/batch.py), and the loss tokens of all its
    # pieces, which a per-sequence mean divides by instead of this piece's own (algos/aggregation.py), so an episode
    # weighs the same however many pieces it became. None: a whole episode.
    episode: int | None = None
    episode_tokens: int | None = None


@dataclass(frozen=True)
class SampleStats:
    """What a step's update measured of one sample, for the report (samples.jsonl, by Trajectory.sample_id): the
    advantage it was trained with, and the learner's log-prob of each completion token before the update (from
    the update's own first forward pass: Update.logprobs; a row outside the update is scored before it)."""

    advantage: float | None = None
    learner_logprobs: list[float] | None = None


@dataclass
class Batch:
    """What the trainer consumes for one optimizer step (possibly split into micro-batches)."""

    sequences: list[Sequence]
    policy_version: int = 0
    # Normalizers of the whole optimizer batch, when `sequences` is only the part that needs a forward pass
    # (sequences whose advantage is 0 change nothing but still count). None: counted from `sequences`.
    total_loss_tokens: float | None = None
    total_seqs: float | None = None
    # Every scored sequence's advantage by its `sample_id` (the trained part above may be a subset): for the
    # report, which shows the advantage each shown trajectory was trained with.
    advantage_of: dict[int, float] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.prompt_ids) + len(s.completion_ids) for s in self.sequences)

    @property
    def num_loss_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.sequences)


def sequence_of(
    traj: Trajectory, advantage: float = 0.0, group_id: int = 0, hint: tuple[str, int | None] | None = None
) -> Sequence:
    """A trajectory's `turns` as one training sequence: the first prompt, then everything after it with its loss
    mask (its `extra_chains` are `sequences_of`'s). `hint`: (text, turn index or None for the last turn) for a
    self-distillation teacher (guidance/teacher.py)."""
    tokens, mask, logps = traj.sequence()
    n_prompt = len(traj.prompt_ids)
    hint_at = None
    if hint is not None:
        k = len(traj.turns) - 1 if hint[1] is None else min(max(hint[1], 0), len(traj.turns) - 1)
        hint_at = len(traj.turns[k].prompt_ids)  # turn k's prompt is the whole history before its completion
    return Sequence(
        prompt_ids=tokens[:n_prompt],
        completion_ids=tokens[n_prompt:],
        loss_mask=mask,
        sampler_logprobs=logps,
        advantage=float(advantage),
        group_id=group_id,
        policy_version=min(t.policy_version for t in traj.turns),
        reward=traj.reward,
        finish_reason=traj.turns[-1].finish_reason,
        hint=hint[0] if hint is not None else None,
        hint_at=hint_at,
        guided=traj.guided,
        sample_id=traj.sample_id,
    )


def sequences_of(
    traj: Trajectory, group_id: int = 0, hint: tuple[str, int | None] | None = None, episode: int = 0
) -> list[Sequence]:
    """Every sequence a trajectory trains as: its `turns`, then each of its `extra_chains`. A trajectory without
    extra chains is one whole sequence; one with them becomes pieces marked with `episode` (unique in the batch) and
    the loss tokens of them all. Every piece carries the episode's reward and finish reason (a truncated episode is
    filtered whole by the overlong filter); the hint and the sample id stay on the first, the trajectory's own turns
    (what the report shows of it)."""
    main = sequence_of(traj, group_id=group_id, hint=hint)
    if not traj.extra_chains:
        return [main]
    extra = [
        replace(sequence_of(dataclasses.replace(traj, turns=chain, extra_chains=[]), group_id=group_id), sample_id=None)
        for chain in traj.extra_chains
        if chain
    ]
    pieces = [main, *extra]
    n = sum(sum(s.loss_mask) for s in pieces)
    return [replace(s, episode=episode, episode_tokens=n, finish_reason=main.finish_reason) for s in pieces]
