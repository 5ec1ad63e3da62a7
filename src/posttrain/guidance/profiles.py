"""RISED: rubric profiles of rollouts, and what a run does with them (algorithm.rised).

    env = ProfileEnv(task_env, taggers, book, cfg)     every scored rollout gets its tags (rewards/tags.py)
      score:   tags; a negative tag as a reward penalty, once per sample (negative="penalty"); a positive tag the
               sample missed but another rollout of its prompt showed, as a hint for the self-distillation teacher
               ("Make sure: ...")
      rollout: negative="hint": a row's recurring negative behaviours written into its prompt ("Avoid: ...")
    book = ProfileBook()                                per task row: the share of its recent rollouts with each tag
    rows = select_rows(book, candidates, k, target, recent)   profile-based prompt selection

Selection: the next batch's prompts are picked from a larger pool of candidates so that the batch's expected
behaviour profile (the mean of the chosen rows' profiles; a row never seen counts as the batch average) stays
close to a target composition, here the last batch's profile, while rows chosen within the last `window` steps
are not chosen again (no overlap with what was already selected). The step's metrics carry each tag's share
(`rised/<tag>`), so a run's profile report is a plot of those over steps.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from posttrain.envs.base import TaskEnv
from posttrain.envs.scoring import scored
from posttrain.guidance.insights import append_to_prompt, row_key
from posttrain.rewards.rubric import Score
from posttrain.rewards.tags import Tag, Taggers
from posttrain.types import SampleParams, Trajectory


class ProfileBook:
    """Per task row, an exponential moving average of its rollouts' tag shares (bounded number of rows)."""

    def __init__(self, tags: list[str], decay: float = 0.5, max_rows: int = 100_000):
        self.tags, self.decay, self.max_rows = list(tags), decay, max_rows
        self._p: OrderedDict[str, dict[str, float]] = OrderedDict()

    def update(self, key: str, tag_sets: list[list[str]]) -> None:
        if not tag_sets:
            return
        now = {t: sum(t in s for s in tag_sets) / len(tag_sets) for t in self.tags}
        old = self._p.pop(key, None)
        self._p[key] = (
            now if old is None else {t: self.decay * old.get(t, 0.0) + (1 - self.decay) * now[t] for t in self.tags}
        )
        while len(self._p) > self.max_rows:
            self._p.popitem(last=False)

    def get(self, key: str) -> dict[str, float] | None:
        return self._p.get(key)

    def recurring(self, key: str, names: list[str], at_least: float = 0.5) -> list[str]:
        p = self._p.get(key) or {}
        return [n for n in names if p.get(n, 0.0) >= at_least]

    def state_dict(self) -> dict[str, Any]:
        return {"tags": self.tags, "profiles": [[k, v] for k, v in self._p.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._p = OrderedDict((k, dict(v)) for k, v in state.get("profiles", []))


def batch_profile(tag_sets: list[list[str]], tags: list[str]) -> dict[str, float]:
    """The share of rollouts with each tag."""
    n = max(len(tag_sets), 1)
    return {t: sum(t in s for s in tag_sets) / n for t in tags}


def select_rows(
    profiles: list[dict[str, float] | None], k: int, target: dict[str, float] | None, excluded: set[int], seed: int = 0
) -> list[int]:
    """Pick k of the candidates (by position) so that the mean of their profiles is closest (L1) to `target`,
    greedily; candidates in `excluded` only when nothing else is left; a candidate without a profile counts as
    the target itself (neutral). Without a target, the first k allowed candidates. Pure and deterministic."""
    order = list(range(len(profiles)))
    allowed = [i for i in order if i not in excluded] or order
    if len(allowed) < k:
        allowed += [i for i in order if i not in allowed][: k - len(allowed)]
    if not target:
        return allowed[:k]
    names = list(target)
    vec = [[(p or target).get(n, 0.0) for n in names] for p in profiles]
    goal = [target[n] for n in names]
    chosen: list[int] = []
    total = [0.0] * len(names)
    rng = random.Random(seed)
    for _ in range(min(k, len(allowed))):
        best, best_d = None, None
        cands = [i for i in allowed if i not in chosen]
        rng.shuffle(cands)  # ties broken by a seeded shuffle, not by pool position
        for i in cands:
            m = len(chosen) + 1
            d = sum(abs((total[j] + vec[i][j]) / m - goal[j]) for j in range(len(names)))
            if best_d is None or d < best_d - 1e-12:
                best, best_d = i, d
        assert best is not None  # cands is never empty: at most len(allowed) picks, each a new one
        chosen.append(best)
        total = [total[j] + vec[best][j] for j in range(len(names))]
    return chosen


class ProfileEnv:
    """The task's env with rubric tags on every rollout and RISED's uses of them (see the module docstring)."""

    def __init__(
        self,
        env: TaskEnv,
        taggers: Taggers,
        vocabulary: list[Tag],
        book: ProfileBook,
        negative: str = "penalty",
        penalty: float = 0.1,
        positive_distill: bool = True,
    ):
        self.env, self.task, self.taggers, self.book = env, env.task, taggers, book
        self.negative, self.penalty, self.positive_distill = negative, penalty, positive_distill
        self.pos = [t for t in vocabulary if t.polarity == "positive"]
        self.neg = [t for t in vocabulary if t.polarity == "negative"]
        self._rows: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}  # steered rows live for the run

    async def rollout(self, row: dict[str, Any], sampler: Any, params: SampleParams | None = None) -> Trajectory:
        key, use = row_key(row), row
        avoid = self.book.recurring(key, [t.name for t in self.neg]) if self.negative == "hint" else []
        if avoid:
            text = "\n\nAvoid: " + "; ".join(t.description for t in self.neg if t.name in avoid) + "."
            use = self._rows.setdefault((key, tuple(avoid)), append_to_prompt(row, text))
        t = await self.env.rollout(use, sampler, params)
        return replace(t, extra={**t.extra, "profile_key": key, "steered": avoid})

    async def score(self, trajectories: list[Trajectory]) -> list[Score]:
        """The wrapped env's scores, with the penalty of a negative behaviour; the tags and hints go into each
        sample's `guidance` (the same object in the scored record score_groups makes)."""
        scores = list(await self.env.score(trajectories))
        now = [scored(t, s) for t, s in zip(trajectories, scores, strict=True)]
        ok = [i for i, t in enumerate(now) if not t.failed]
        self.taggers.tag([now[i] for i in ok])
        neg_names = {t.name for t in self.neg}
        by_key: dict[str, list[list[str]]] = {}
        for t in (now[i] for i in ok):
            by_key.setdefault(t.extra.get("profile_key", row_key(t.row)), []).append(t.guidance.tags or [])
        for i in ok:
            t = now[i]
            tags = t.guidance.tags or []
            if self.negative == "penalty":
                # Once per sample, not per tag: tags overlap (a JSON with a wrong value is also a schema violation),
                # and a per-tag sum made prose (one tag) cheaper than nearly-right JSON (measured: the policy
                # stopped writing JSON within 5 steps).
                pen = self.penalty * float(any(x in neg_names for x in tags))
                s = scores[i]
                scores[i] = replace(s, reward=s.reward - pen, components={**s.components, "rised_penalty": -pen})
            # A positive behaviour this sample missed but another rollout of the same prompt showed: reachable by the
            # policy here, so worth a hint (a shared vocabulary's tags that never apply to a task never hint).
            group = by_key[t.extra.get("profile_key", row_key(t.row))]
            missed = [p for p in self.pos if p.name not in tags and any(p.name in other for other in group)]
            if self.positive_distill and missed:
                t.guidance.teacher_hint = "\n\nMake sure: " + "; ".join(p.description for p in missed) + "."
        for key, sets in by_key.items():
            self.book.update(key, sets)
        return scores


def profile_metrics(trajs: list[Trajectory], tags: list[str], errors: int) -> dict[str, float]:
    """Per step: each tag's share among the step's tagged rollouts, and the tagging errors so far."""
    tagged = [t.guidance.tags for t in trajs if t.guidance.tags is not None]
    m = {f"rised/{k}": v for k, v in batch_profile(tagged, tags).items()} if tagged else {}
    m["rised/tag_errors"] = float(errors)
    return m


class Rised:
    """RISED's run state beside the stepper: the profile book, the selection's memory (what was chosen when) and
    the last batch's profile (the selection's target). `choose` is the collector's prompt selector; `metrics` and
    the state dict are the stepper's plugin interface."""

    def __init__(
        self,
        vocabulary: list[Tag],
        taggers: Taggers,
        book: ProfileBook,
        candidates: int = 4,
        window: int = 4,
        seed: int = 0,
    ):
        self.vocabulary, self.taggers, self.book = vocabulary, taggers, book
        self.candidates, self.window, self.seed = candidates, window, seed
        self.tags = [t.name for t in vocabulary]
        self.target: dict[str, float] | None = None
        self.chosen_at: dict[int, int] = {}  # row index -> the step it was last selected
        self.overlap = 0

    def pool_size(self, k: int) -> int:
        return k * self.candidates

    def choose(self, step: int, pool: list[int], rows: list[dict[str, Any]], k: int) -> list[int]:
        """k row indices out of `pool` (row indices), by profile (select_rows), none chosen in the last window."""
        pool = list(dict.fromkeys(pool))
        excluded = {j for j, i in enumerate(pool) if step - self.chosen_at.get(i, -(10**9)) <= self.window}
        picked = select_rows(
            [self.book.get(row_key(rows[i])) for i in pool], k, self.target, excluded, seed=self.seed * 1_000_003 + step
        )
        out = [pool[j] for j in picked]
        self.overlap = sum(1 for j in picked if j in excluded)
        for i in out:
            self.chosen_at[i] = step
        return out

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        m = profile_metrics(trajs, self.tags, self.taggers.errors)
        tagged = [t.guidance.tags for t in trajs if t.guidance.tags is not None]
        if tagged:
            self.target = batch_profile(tagged, self.tags)
        m["rised/selection_overlap"] = float(self.overlap)
        return m

    def state_dict(self) -> dict[str, Any]:
        return {
            "book": self.book.state_dict(),
            "target": self.target,
            "chosen_at": [[i, s] for i, s in self.chosen_at.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.book.load_state_dict(state.get("book", {}))
        self.target = state.get("target")
        self.chosen_at = {int(i): int(s) for i, s in state.get("chosen_at", [])}
