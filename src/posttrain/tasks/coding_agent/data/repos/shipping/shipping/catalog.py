"""Products by SKU. Weights are in grams, prices in cents."""

PRODUCTS = {
    "MUG": {"name": "Mug", "grams": 350, "cents": 1200},
    "TEE": {"name": "T-shirt", "grams": 200, "cents": 900},
    "LAMP": {"name": "Desk lamp", "grams": 1800, "cents": 4500},
    "BOOK": {"name": "Notebook", "grams": 500, "cents": 900},
}


def normalize(sku):
    """The catalog's spelling of a SKU: surrounding spaces removed, upper case."""
    return sku.strip().upper()


def lookup(sku):
    """The product of `sku` (any case); KeyError naming the SKU if there is none."""
    key = normalize(sku)
    if key not in PRODUCTS:
        raise KeyError(f"unknown SKU {sku!r}")
    return PRODUCTS[key]
