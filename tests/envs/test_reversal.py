"""REVERSAL-BENCH grids: the BFS reset oracle agrees with brute-force enumeration of action sequences; rho couples
maps (1 = no hazards, hazards only grow as rho falls); the first goal is always reachable; the local shield has
recall 1 against the oracle; the gymnasium env's episodic / reset-free / shield behaviour."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from posttrain.tasks.reversal.grid import (DOOR_CHARS, PIT, STAY, WALL, UP, RIGHT, DOWN, LEFT, generate, move,
                                          shortest_plan)
from posttrain.tasks.reversal.gym_env import ReversalGridEnv, parse_move
from posttrain.tasks.reversal.oracle import can_reach_goal, goal_distance
from posttrain.tasks.reversal.shield import LocalShield, precision_recall

MOVES = (UP, RIGHT, DOWN, LEFT)
DEPTH = 7
maps = st.tuples(st.integers(3, 5), st.integers(0, 10**6), st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0]))


def brute_force_within(m, pos, goal, depth):
    """Every action sequence of length <= depth, enumerated (no memo, no pruning): does any reach the goal?"""
    if pos == goal:
        return True
    if depth == 0:
        return False
    return any(brute_force_within(m, move(m, pos, a), goal, depth - 1) for a in MOVES)


def non_wall(m):
    return [(r, c) for r in range(m.size) for c in range(m.size) if m.cells[r][c] != WALL]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(maps, st.data())
def test_oracle_agrees_with_exhaustive_search(spec, data):
    m = generate(*spec)
    pos = data.draw(st.sampled_from(non_wall(m)))
    d = goal_distance(m, pos, m.goal)
    assert can_reach_goal(m, pos, m.goal) == (d is not None)
    # found within DEPTH moves by enumeration <=> the oracle's distance is at most DEPTH (both directions)
    assert brute_force_within(m, pos, m.goal, DEPTH) == (d is not None and d <= DEPTH)


@settings(max_examples=80, deadline=None)
@given(maps)
def test_first_goal_reachable_and_rho_couples_maps(spec):
    size, seed, rho = spec
    m = generate(size, seed, rho)
    assert can_reach_goal(m, m.start, m.goal) and m.at(m.start) == "." and m.at(m.goal) == "."
    free = generate(size, seed, 1.0)
    full = generate(size, seed, 0.0)
    assert not any(ch in DOOR_CHARS + PIT for row in free.cells for ch in row)  # rho = 1: every move reversible
    assert (m.start, m.goal) == (free.start, free.goal) == (full.start, full.goal)
    for r in range(size):
        for c in range(size):
            assert (free.cells[r][c] == WALL) == (m.cells[r][c] == WALL) == (full.cells[r][c] == WALL)
            if m.cells[r][c] not in ".#":  # a hazard at rho is the same hazard at rho = 0
                assert full.cells[r][c] == m.cells[r][c]


@settings(max_examples=60, deadline=None)
@given(maps, st.integers(1, 3))
def test_local_shield_recall_is_one(spec, radius):
    m = generate(*spec)
    shield = LocalShield(radius)
    for pos in non_wall(m):
        if not can_reach_goal(m, pos, m.goal):
            continue
        for a in MOVES + (STAY,):
            if not can_reach_goal(m, move(m, pos, a), m.goal):
                assert shield.predicts_irrecoverable(m, pos, a), (m.cells, pos, a)


def test_precision_recall_edges():
    assert precision_recall(3, 1, 0) == (0.75, 1.0)
    assert precision_recall(0, 0, 0) == (None, None)


def _pit_map():
    """A map and seed whose start has a pit next to it."""
    for seed in range(500):
        m = generate(5, seed, 0.0)
        for a in MOVES:
            if m.at(move(m, m.start, a)) == PIT:
                return seed, a
    raise AssertionError("no map with a pit next to the start")


@pytest.mark.parametrize("mode", ["episodic", "reset_free"])
def test_a_pit_absorbs_and_ends_the_episode(mode):
    seed, a = _pit_map()
    env = ReversalGridEnv(size=5, rho=0.0, mode=mode)
    env.reset(seed=seed)
    obs, r, term, trunc, info = env.step(a)
    assert term and not trunc and r == 0.0 and info["absorbed"] and "pit" in obs
    m = env.episode_metrics()
    assert m["absorbed"] == 1.0 and m["success"] == 0.0 and m["shield_tp"] == 1.0


def test_shield_on_vetoes_the_pit_and_says_so():
    seed, a = _pit_map()
    env = ReversalGridEnv(size=5, rho=0.0, shield="on")
    env.reset(seed=seed)
    start = env.pos
    obs, r, term, trunc, info = env.step(a)
    assert env.pos == start and not term and info["vetoed"] and "vetoed" in obs
    assert env.episode_metrics()["vetoes"] == 1.0


def test_episodic_goal_and_reset_free_next_goal():
    env = ReversalGridEnv(size=6, rho=0.5, mode="episodic")
    env.reset(seed=3)
    plan = shortest_plan(env.map, env.pos, env.goal)
    for i, a in enumerate(plan):
        _, r, term, trunc, _ = env.step(a)
    assert r == 1.0 and term and env.episode_metrics()["success"] == 1.0
    rf = ReversalGridEnv(size=6, rho=0.5, mode="reset_free", n_goals=3)
    rf.reset(seed=3)
    first = rf.goal
    for a in shortest_plan(rf.map, rf.pos, rf.goal):
        _, r, term, _, info = rf.step(a)
    assert r == 1.0 and not term and rf.goal != first and rf.can_reach_goal()  # a new, reachable goal
    assert rf.episode_metrics()["success"] == pytest.approx(1 / 3)


def test_same_seed_same_map_and_gymnasium_checker():
    from gymnasium.utils.env_checker import check_env

    a, b = ReversalGridEnv(size=5), ReversalGridEnv(size=5)
    assert a.reset(seed=11)[0] == b.reset(seed=11)[0]
    check_env(ReversalGridEnv(size=5), skip_render_check=True)


def test_bad_options_and_actions_have_clear_errors():
    with pytest.raises(ValueError, match="mode must be one of"):
        ReversalGridEnv(mode="forever")
    with pytest.raises(ValueError, match="rho must be in"):
        ReversalGridEnv(rho=1.5)
    with pytest.raises(ValueError, match="'on' or 'off'"):
        ReversalGridEnv(shield="maybe")
    env = ReversalGridEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action must be 0..4"):
        env.step(9)
    assert parse_move("I think I should go Right") == 1 and parse_move("left... no, down") == 2
    with pytest.raises(ValueError, match="no move found"):
        parse_move("jump")


def test_runs_without_gymnasium_installed():
    """The `envs` extra is optional: without gymnasium the task still loads and passes its smoke checks."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['gymnasium'] = None\n"
            "from posttrain.tasks.load import load_task\nfrom posttrain.envs.smoke_checks import check_task\n"
            "assert all(r.ok for r in check_task(load_task('reversal', {'rho': 0.0}))); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
