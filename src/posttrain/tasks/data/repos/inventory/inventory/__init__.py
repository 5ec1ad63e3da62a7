"""inventory: a tiny stock-keeping model."""
