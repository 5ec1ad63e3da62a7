"""Text reports of an Inventory."""


def format_line(name, qty, price):
    """'apple x3 @ 0.50 = 1.50': name, quantity, unit price and line total with two decimals."""
    return f"{name} x{qty} @ {price:.2f} = {qty * price:.2f}"


def report(inv):
    """One format_line per item, sorted by name, then a 'TOTAL <value>' line with two decimals."""
    lines = [format_line(n, q, p) for n, (q, p) in sorted(inv.items.items())]
    lines.append(f"TOTAL {inv.total_value():.2f}")
    return "\n".join(lines)


def low_stock(inv, threshold):
    """Sorted names of the items with quantity below `threshold`."""
    return sorted(n for n, (q, _) in inv.items.items() if q < threshold)
