"""Averages of a student's scores (each 0-100)."""


def average(scores, drop_lowest=0):
    """Mean of `scores` after dropping the `drop_lowest` lowest ones; 0.0 when none are left."""
    kept = sorted(scores)[drop_lowest:]
    return sum(kept) / len(kept) if kept else 0.0


def weighted(parts, weights, drop_lowest=None):
    """Sum over the named parts of average(part's scores) * weight. `drop_lowest` maps a part to how many of
    its lowest scores to drop. The weights must sum to 1."""
    if abs(sum(weights.values()) - 1) > 1e-9:
        raise ValueError("weights must sum to 1")
    drop_lowest = drop_lowest or {}
    return sum(average(parts.get(name, []), drop_lowest.get(name, 0)) * w for name, w in weights.items())
