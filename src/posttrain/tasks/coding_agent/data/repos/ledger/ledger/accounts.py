"""Accounts hold postings; a balance is the sum of their amounts in cents."""

from ledger.money import to_cents


class Account:
    def __init__(self, name):
        self.name = name
        self.postings = []  # (memo, cents)

    def post(self, memo, amount):
        """Record `amount`, a string such as '12.50' (negative for money going out)."""
        self.postings.append((memo, to_cents(amount)))

    def balance(self):
        """Sum of the postings, in cents."""
        return sum(cents for _, cents in self.postings)


class Ledger:
    def __init__(self):
        self.accounts = {}

    def open(self, name):
        """A new empty account; ValueError if `name` is taken."""
        if name in self.accounts:
            raise ValueError(f"account {name!r} exists")
        self.accounts[name] = Account(name)
        return self.accounts[name]

    def transfer(self, src, dst, amount, memo="transfer"):
        """Move a positive `amount` (a string) out of account `src` and into account `dst`."""
        if to_cents(amount) <= 0:
            raise ValueError("transfer amounts must be positive")
        self.accounts[src].post(memo, "-" + amount.strip())
        self.accounts[dst].post(memo, amount)
