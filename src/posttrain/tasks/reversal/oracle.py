"""The reset oracle: ground-truth recoverability, by BFS over the true transition graph (grid.move).

A state (position, goal) is recoverable when the goal can still be reached from it. The oracle reads the whole
map and the true dynamics; the agent and the shield never call it (the shield's precision/recall are measured
against it, and episodic mode uses it to end an episode that can no longer succeed).
"""

from __future__ import annotations

from posttrain.tasks.reversal.grid import GridMap, Pos, distances_from


def can_reach_goal(m: GridMap, pos: Pos, goal: Pos) -> bool:
    return goal in distances_from(m, pos)


def goal_distance(m: GridMap, pos: Pos, goal: Pos) -> int | None:
    """Fewest moves from pos to goal (None: unreachable)."""
    return distances_from(m, pos).get(goal)


def reachable(m: GridMap, pos: Pos) -> set[Pos]:
    return set(distances_from(m, pos))
