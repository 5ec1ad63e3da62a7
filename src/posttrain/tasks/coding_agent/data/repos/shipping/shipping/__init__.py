"""shipping: a catalog, weight-banded shipping rates, and orders."""
