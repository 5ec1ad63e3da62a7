"""Statements: one line per posting, then the balance."""

from ledger.money import format_cents


def statement(account):
    """'memo: amount' for each posting, then 'balance: amount'; amounts as format_cents writes them."""
    lines = [f"{memo}: {format_cents(cents)}" for memo, cents in account.postings]
    lines.append(f"balance: {format_cents(account.balance())}")
    return "\n".join(lines)


def totals(ledger):
    """{account name: balance in cents} for every account of the ledger."""
    return {name: acc.balance() for name, acc in sorted(ledger.accounts.items())}
