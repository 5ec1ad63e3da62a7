"""A recoverability shield that does not read the oracle: a rule over the agent's visible neighbourhood.

`LocalShield(radius)` sees the cells within `radius` (Chebyshev distance) of the agent, nothing else, and predicts
that an action enters an irrecoverable state when, after it, the agent could not walk back to where it stands
using only visible cells (pits are never left; cells outside the window count as walls). In words: "do not make a
move you cannot see yourself undo".

Why this rule: if the current state is recoverable and the next one is not, the current position cannot be
reachable from the next (else next -> here -> goal would be a route), so no path back exists in the window either.
Every truly irrecoverable move is therefore vetoed: recall against the oracle is 1 by construction (a test checks
it). Precision is what the bench measures: a move that cannot be undone locally may still leave the goal
reachable (another way round, or the goal is ahead), and the shield, which does not know where the goal is, vetoes
it anyway. That cost shows up as lower success where goals lie behind one-way doors.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.tasks.reversal.grid import PIT, STAY, GridMap, Pos, distances_from, move


@dataclass
class LocalShield:
    radius: int = 2

    def window(self, m: GridMap, pos: Pos) -> set[Pos]:
        r0, c0 = pos
        k = self.radius
        return {(r, c) for r in range(r0 - k, r0 + k + 1) for c in range(c0 - k, c0 + k + 1) if m.inside((r, c))}

    def predicts_irrecoverable(self, m: GridMap, pos: Pos, action: int) -> bool:
        if action == STAY or m.at(pos) == PIT:
            return False  # staying changes nothing; in a pit nothing can be changed
        nxt = move(m, pos, action)
        if nxt == pos:
            return False
        if m.at(nxt) == PIT:
            return True
        return pos not in distances_from(m, nxt, allowed=self.window(m, pos))


def confusion(predicted: bool, truly_irrecoverable: bool) -> str:
    """tp / fp / fn / tn for one shield decision against the oracle label."""
    return ("t" if predicted == truly_irrecoverable else "f") + ("p" if predicted else "n")


def precision_recall(tp: float, fp: float, fn: float) -> tuple[float | None, float | None]:
    """(precision, recall); None where there is nothing to divide by (no vetoes / no irrecoverable moves)."""
    precision = tp / (tp + fp) if tp + fp > 0 else None
    recall = tp / (tp + fn) if tp + fn > 0 else None
    return precision, recall
