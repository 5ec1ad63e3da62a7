"""Amounts as integer cents: parsing and formatting."""


def to_cents(text):
    """'12.5' -> 1250, '-3' -> -300, '0.07' -> 7. At most two decimals; ValueError otherwise."""
    text = text.strip()
    sign = -1 if text.startswith("-") else 1
    whole, _, frac = text.lstrip("+-").partition(".")
    if len(frac) > 2 or not (whole or frac) or not (whole + frac).isdigit():
        raise ValueError(f"not an amount: {text!r}")
    return sign * (int(whole or "0") * 100 + int(frac.ljust(2, "0")))


def format_cents(cents):
    """1250 -> '12.50', -7 -> '-0.07', 123456 -> '1,234.56' (thousands separated by commas)."""
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}{whole:,}.{frac:02d}"
