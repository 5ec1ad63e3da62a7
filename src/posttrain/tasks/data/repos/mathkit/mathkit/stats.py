"""Descriptive statistics of a list of numbers."""


def mean(xs):
    """Arithmetic mean; ValueError on an empty list."""
    if not xs:
        raise ValueError("mean of an empty list")
    return sum(xs) / len(xs)


def median(xs):
    """Middle value of the sorted list, or the mean of the two middle values."""
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("median of an empty list")
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2


def mode(xs):
    """Most frequent value; the smallest one wins ties."""
    counts = {}
    for x in xs:
        counts[x] = counts.get(x, 0) + 1
    return min(counts, key=lambda x: (-counts[x], x))


def variance(xs):
    """Population variance: mean squared distance from the mean."""
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)
