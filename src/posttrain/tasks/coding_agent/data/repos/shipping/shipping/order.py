"""An order: lines of (SKU, quantity), its weight, shipping and total."""

from shipping.catalog import lookup, normalize
from shipping.rates import rate

FREE_SHIPPING_CENTS = 5000  # subtotals of this much or more ship free


class Order:
    def __init__(self, zone=1):
        self.zone = zone
        self.lines = {}  # catalog SKU -> quantity

    def add(self, sku, qty=1):
        """Add `qty` of `sku`; the same product added twice (in any spelling) is one line."""
        if qty <= 0:
            raise ValueError("qty must be positive")
        lookup(sku)
        key = normalize(sku)
        self.lines[key] = self.lines.get(key, 0) + qty

    def subtotal(self):
        """Sum of price * quantity, in cents."""
        return sum(lookup(sku)["cents"] * qty for sku, qty in self.lines.items())

    def weight_kg(self):
        """Total weight in kilograms."""
        return sum(lookup(sku)["grams"] * qty for sku, qty in self.lines.items()) / 1000

    def shipping(self):
        """Cents: free from FREE_SHIPPING_CENTS of subtotal, else rates.rate for the weight and the zone."""
        if self.subtotal() >= FREE_SHIPPING_CENTS:
            return 0
        return rate(self.weight_kg(), self.zone)

    def total(self):
        return self.subtotal() + self.shipping()
