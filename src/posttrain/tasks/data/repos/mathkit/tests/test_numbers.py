from mathkit.numbers import digits, gcd, is_prime, primes_up_to


def test_is_prime():
    assert [n for n in range(20) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19]


def test_primes_up_to():
    assert primes_up_to(10) == [2, 3, 5, 7]
    assert primes_up_to(1) == []


def test_gcd():
    assert gcd(12, 18) == 6
    assert gcd(7, 0) == 7
    assert gcd(0, 0) == 0


def test_digits():
    assert digits(1203) == [1, 2, 0, 3]
    assert digits(0) == [0]
