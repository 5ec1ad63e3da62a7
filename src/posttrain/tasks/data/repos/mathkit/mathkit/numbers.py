"""Integer helpers."""


def is_prime(n):
    """True when `n` is a prime number."""
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def primes_up_to(n):
    """All primes <= n, ascending."""
    return [k for k in range(2, n + 1) if is_prime(k)]


def gcd(a, b):
    """Greatest common divisor of two non-negative integers (gcd(0, 0) == 0)."""
    while b:
        a, b = b, a % b
    return a


def digits(n):
    """Decimal digits of a non-negative integer, most significant first."""
    if n == 0:
        return [0]
    out = []
    while n:
        out.append(n % 10)
        n //= 10
    return out[::-1]
