"""Scripted policies for the bench (no LLM) and the episode runner.

Both policies read only what the agent sees (the map, where it stands, the goal, whether its last move was
vetoed); neither calls the oracle.

  * random: a uniformly random move each step.
  * greedy: a move that brings it closer to the goal (Manhattan distance), ignoring hazards, a random move with
    probability `eps` or when the last move did not get it anywhere (a wall, a veto). A naive agent: it walks
    into pits and through one-way doors whenever they lie on the straight way, which is what makes the cliff.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import Any

from posttrain.tasks.reversal.grid import DELTAS, DOWN, LEFT, RIGHT, UP
from posttrain.tasks.reversal.gym_env import ReversalGridEnv
from posttrain.tasks.reversal.shield import precision_recall

MOVES = (UP, RIGHT, DOWN, LEFT)
Policy = Callable[[ReversalGridEnv], int]


def random_policy(rng: random.Random) -> Policy:
    return lambda env: rng.choice(MOVES)


def greedy_policy(rng: random.Random, eps: float = 0.1) -> Policy:
    last: dict[str, Any] = {"pos": None, "action": None}

    def act(env: ReversalGridEnv) -> int:
        stuck = last["pos"] == env.pos and last["action"] is not None
        (r, c), (gr, gc) = env.pos, env.goal
        closer = [
            a for a in MOVES if abs(r + DELTAS[a][0] - gr) + abs(c + DELTAS[a][1] - gc) < abs(r - gr) + abs(c - gc)
        ]
        if stuck:
            closer = [a for a in closer if a != last["action"]]
        a = (
            rng.choice(closer)
            if closer and rng.random() >= eps
            else rng.choice([m for m in MOVES if not stuck or m != last["action"]])
        )
        last["pos"], last["action"] = env.pos, a
        return a

    return act


POLICIES: dict[str, Callable[[random.Random], Policy]] = {"random": random_policy, "greedy": greedy_policy}


def run_episode(env: ReversalGridEnv, policy: Policy, seed: int) -> dict[str, float]:
    env.reset(seed=seed)
    done = False
    while not done:
        _, _, term, trunc, _ = env.step(policy(env))
        done = term or trunc
    return env.episode_metrics()


def run_config(
    policy_name: str,
    seeds: list[int],
    size: int,
    rho: float,
    mode: str,
    shield: str,
    n_goals: int = 3,
    policy_seed: int = 0,
) -> dict[str, float]:
    """Mean metrics of a policy over maps. Episodic: `n_goals` episodes per map (a reset between them), success =
    share that reached the goal. Reset-free: one life per map over `n_goals` goals, success = goals / n_goals.
    Same number of goals either way, so the two modes are comparable."""
    env = ReversalGridEnv(size=size, rho=rho, mode=mode, shield=shield, n_goals=n_goals)
    rng = random.Random(policy_seed)
    runs = []
    for s in seeds:
        for _ in range(n_goals if mode == "episodic" else 1):
            runs.append(run_episode(env, POLICIES[policy_name](rng), s))
    tot = {k: sum(r[k] for r in runs) for k in runs[0]}
    precision, recall = precision_recall(tot["shield_tp"], tot["shield_fp"], tot["shield_fn"])
    return {
        "success": statistics.fmean(r["success"] for r in runs),
        "absorbed": statistics.fmean(r["absorbed"] for r in runs),
        "vetoes": tot["vetoes"] / len(runs),
        "steps": tot["steps"] / len(runs),
        "shield_precision": precision if precision is not None else float("nan"),
        "shield_recall": recall if recall is not None else float("nan"),
        "episodes": float(len(runs)),
    }
