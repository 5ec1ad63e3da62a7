"""The Inventory: item name -> (quantity, unit price)."""


class OutOfStock(Exception):
    """Raised when removing more units than are in stock."""


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty, price):
        """Add `qty` units of `name` at unit `price` (the latest price wins)."""
        if qty <= 0:
            raise ValueError("qty must be positive")
        old_qty = self.items.get(name, (0, price))[0]
        self.items[name] = (old_qty + qty, price)

    def remove(self, name, qty):
        """Take `qty` units out; OutOfStock if there are fewer; the item disappears at zero."""
        have = self.items.get(name, (0, 0))[0]
        if qty > have:
            raise OutOfStock(name)
        if qty == have:
            del self.items[name]
        else:
            self.items[name] = (have - qty, self.items[name][1])

    def quantity(self, name):
        """Units of `name` in stock (0 if unknown)."""
        return self.items.get(name, (0, 0))[0]

    def total_value(self):
        """Sum of quantity * price over all items."""
        return sum(q * p for q, p in self.items.values())
