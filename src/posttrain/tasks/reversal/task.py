"""The `reversal` task: REVERSAL-BENCH grids played by the policy through the text adapter (envs/gym_text.py).

    posttrain train task.name=reversal task.options.rho=0.5 task.options.mode=reset_free task.options.shield=on

Options: rho (reversibility in [0, 1]; 1 = every move can be undone), mode (episodic | reset_free), shield
(on | off), size (grid side, 5..7 intended, 3..12 accepted), n_goals (reset-free goals per life), n_train /
n_eval (maps), max_turns (model calls per episode; default the env's step limit + 3 for bad replies),
shield_radius, max_tokens (per reply).

Train and held-out maps come from disjoint seed ranges, and a held-out map whose layout equals a training map's is
skipped, so no held-out map was seen in training.

Reward: goals reached / n_goals (episodic: 1 at the goal, else 0). The rubric component reads the episode the env
played (the `episode_return` column); without one (`posttrain env check`, a completion scored on its own) it replays
the completion as an open-loop plan of moves on the row's map, so the smoke checks run the real dynamics. It also
keeps the step's metrics (`drain_metrics`, logged as `reversal/...`): success, absorbed share, shield
precision/recall against the oracle, vetoes, bad-action rate, turns.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from posttrain.envs.gym_text import GymTextEnv
from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import (
    Task,
    TaskLoadError,  # a ValueError the CLI prints as a one-line error
)
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.rewards.text import completion_text
from posttrain.tasks.reversal.grid import ACTION_NAMES, PIT, shortest_plan
from posttrain.tasks.reversal.gym_env import LEGEND, MODES, ReversalGridEnv, parse_move, parse_switch
from posttrain.tasks.reversal.shield import precision_recall

EVAL_SEED_BASE = 1_000_000  # held-out maps: seeds from here on; training maps: 0 .. n_train - 1
MOVE_WORDS = re.compile(r"\b(up|down|left|right|stay|north|south|east|west|wait)\b", re.I)


def env_maker(
    size: int, rho: float, mode: str, shield: Any, n_goals: int, shield_radius: int, max_steps: int | None = None
):
    def make(row: dict[str, Any] | None = None) -> ReversalGridEnv:
        return ReversalGridEnv(
            size=size,
            rho=rho,
            mode=mode,
            shield=shield,
            n_goals=n_goals,
            max_steps=max_steps,
            shield_radius=shield_radius,
        )

    return make


def oracle_plan(env: ReversalGridEnv, seed: int) -> list[int]:
    """The moves of a shortest path to each goal in turn, played on `env` (for demonstrations and smoke checks;
    it reads the true map, so it is not a policy the benchmark would allow)."""
    env.reset(seed=seed)
    assert env.map is not None  # reset draws the map
    moves: list[int] = []
    while not env.done:
        plan = shortest_plan(env.map, env.pos, env.goal)
        if not plan:
            break
        goal = env.goal
        for a in plan:
            env.step(a)
            moves.append(a)
            if env.done or env.goal != goal or env.last_veto is not None:
                break
        if env.last_veto is not None:
            break  # the shield blocks the shortest way; a demonstration stops here
    return moves


class ReversalReward:
    """Rubric component: goals reached / n_goals, from the played episode or by replaying a plan. Keeps the
    played episodes' metrics until `drain_metrics()`."""

    __name__ = "reversal_success"

    def __init__(self, make_env):
        self.make_env = make_env
        self._lock = threading.Lock()
        self._episodes: list[dict[str, float]] = []

    def replay(self, text: str, seed: int) -> float:
        env = self.make_env()
        env.reset(seed=int(seed))
        for word in MOVE_WORDS.findall(text):
            if env.done:
                break
            env.step(parse_move(word))
        return env.goals_reached / env.n_goals

    def __call__(
        self,
        completions: list[Any],
        seed: list[int],
        episode_return: list[float] | None = None,
        episode: list[dict[str, float]] | None = None,
        **_: Any,
    ) -> list[float]:
        if episode_return is None:  # scored on its own: replay the completion as a plan
            return [self.replay(completion_text(c), s) for c, s in zip(completions, seed)]
        n_goals = self.make_env().n_goals
        scores = [float(r or 0.0) / n_goals for r in episode_return]
        with self._lock:  # recorded only once all scores are computed (the rubric retries a raising batch)
            self._episodes += [dict(e) for e in episode or []]
        return scores

    def drain_metrics(self) -> dict[str, float]:
        with self._lock:
            eps, self._episodes = self._episodes, []
        if not eps:
            return {}
        n = float(len(eps))
        tot = {
            k: sum(e.get(k, 0.0) for e in eps)
            for k in ("success", "absorbed", "vetoes", "bad_actions", "turns", "shield_tp", "shield_fp", "shield_fn")
        }
        out = {
            "reversal/episodes": n,
            "reversal/success": tot["success"] / n,
            "reversal/absorbed": tot["absorbed"] / n,
            "reversal/vetoes": tot["vetoes"] / n,
            "reversal/turns": tot["turns"] / n,
            "reversal/bad_action_rate": tot["bad_actions"] / max(tot["turns"], 1.0),
        }
        precision, recall = precision_recall(tot["shield_tp"], tot["shield_fp"], tot["shield_fn"])
        if precision is not None:
            out["reversal/shield_precision"] = precision
        if recall is not None:
            out["reversal/shield_recall"] = recall
        return out


def intro(mode: str, n_goals: int, shield: bool) -> str:
    goal = (
        "Reach the goal G."
        if mode == "episodic"
        else f"Reach the goal G; each time you do, a new goal appears, {n_goals} in all. There are no restarts: "
        "a pit or a one-way door into a dead end ends your chances for every later goal."
    )
    guard = " A shield vetoes moves it thinks you could not undo (you then stay in place)." if shield else ""
    return (
        f"You walk on a grid map. {goal}{guard}\n{LEGEND}\nRow 0 is at the top. Each turn reply with one move: "
        "up, down, left, right or stay."
    )


def make_task(
    rho: float = 0.5,
    mode: str = "episodic",
    shield: Any = "off",
    size: int = 5,
    n_goals: int = 3,
    n_train: int = 64,
    n_eval: int = 16,
    max_turns: int | None = None,
    shield_radius: int = 2,
    max_tokens: int = 16,
) -> Task:
    if mode not in MODES:
        raise TaskLoadError(f"reversal: mode must be one of {', '.join(MODES)}, got {mode!r}")
    try:
        rho = float(rho)
    except (TypeError, ValueError):
        raise TaskLoadError(f"reversal: rho must be a number in [0, 1], got {rho!r}") from None
    if not 0.0 <= rho <= 1.0:
        raise TaskLoadError(f"reversal: rho must be in [0, 1], got {rho}")
    if not 3 <= int(size) <= 12:
        raise TaskLoadError(f"reversal: size must be in [3, 12] (5..7 intended), got {size}")
    if n_train < 1 or n_eval < 0:
        raise TaskLoadError(f"reversal: n_train must be >= 1 and n_eval >= 0, got {n_train}, {n_eval}")
    try:
        shield_on = parse_switch(shield, "reversal: shield")
    except ValueError as e:
        raise TaskLoadError(str(e)) from None
    make_env = env_maker(int(size), rho, mode, shield_on, int(n_goals), int(shield_radius))
    probe = make_env()
    turns = int(max_turns) if max_turns is not None else probe.max_steps + 3
    if turns < 1:
        raise TaskLoadError(f"reversal: max_turns must be >= 1, got {max_turns}")
    prompt = [{"role": "user", "content": intro(mode, probe.n_goals, shield_on)}]

    def row(seed: int) -> dict[str, Any]:
        return {"prompt": prompt, "seed": seed, "rho": rho, "mode": mode}

    train_rows = [row(s) for s in range(n_train)]
    seen = set()
    for s in range(n_train):
        probe.reset(seed=s)
        assert probe.map is not None  # reset draws the map
        seen.add(probe.map.fingerprint())
    eval_rows: list[dict[str, Any]] = []
    s = EVAL_SEED_BASE
    while len(eval_rows) < n_eval:
        probe.reset(seed=s)
        assert probe.map is not None  # reset draws the map
        if probe.map.fingerprint() not in seen:
            eval_rows.append(row(s))
        s += 1

    reward = ReversalReward(make_env)
    rubric = Rubric(
        [RewardComponent("reversal_success", reward, pass_threshold=1.0)], pass_component="reversal_success"
    )

    def demonstrate(r: dict[str, Any]) -> list[str]:
        return [ACTION_NAMES[a] for a in oracle_plan(make_env(), r["seed"])] or ["stay"]

    def env_factory(task: Task, tokenizer: Any, params: Any) -> GymTextEnv:
        return GymTextEnv(
            task, tokenizer, params, make_env=make_env, obs_to_text=str, text_to_action=parse_move, max_turns=turns
        )

    return Task(
        name="reversal",
        train_rows=train_rows,
        eval_rows=eval_rows,
        rubric=rubric,
        description=f"REVERSAL-BENCH grid, rho={rho}, mode={mode}, shield={'on' if shield_on else 'off'}, size={size}",
        max_tokens=max_tokens,
        env_factory=env_factory,
        max_turns=turns,
        demonstrate=demonstrate,
        smoke_checks=_smoke_checks(train_rows, make_env),
    )


def _smoke_checks(rows: list[dict[str, Any]], make_env) -> list[SmokeCheck]:
    """Known-good: the oracle's plan on a map where it wins under these settings. Known-bad: a walk into a pit
    (or, on maps without pits, standing still). And a reply without moves scores 0."""
    env = make_env()
    checks = []
    good = next(
        ((r, p) for r in rows[:32] for p in [oracle_plan(env, r["seed"])] if p and env.goals_reached == env.n_goals),
        None,
    )
    if good is not None:
        r, plan = good
        checks.append(
            SmokeCheck(
                "the oracle's plan reaches every goal",
                row=r,
                completion=" ".join(ACTION_NAMES[a] for a in plan),
                expect="pass",
            )
        )
    bad = None
    for r in rows[:32]:
        env.reset(seed=r["seed"])
        pits = [(i, j) for i in range(env.size) for j in range(env.size) if env.map.cells[i][j] == PIT]
        plans = [p for p in (shortest_plan(env.map, env.pos, pit) for pit in pits) if p]
        if plans:
            bad = (r, " ".join(ACTION_NAMES[a] for a in min(plans, key=len)))
            break
    if bad is not None:  # with the shield on, it vetoes the last step; the walk must not pass either way
        checks.append(SmokeCheck("walking into a pit does not pass", row=bad[0], completion=bad[1], expect="fail"))
    else:  # no pits at this rho: standing still must not pass
        checks.append(SmokeCheck("standing still does not pass", row=rows[0], completion="stay stay", expect="fail"))
    checks.append(
        SmokeCheck("a reply without moves scores 0 without error", row=rows[0], completion="hello", expect="fail")
    )
    return checks
