"""Shipping rates by weight band and zone, in cents."""

# (upper bound in kg, inclusive; price in cents in zone 1). Parcels heavier than the last bound cannot ship.
BANDS = [(1.0, 500), (5.0, 900), (20.0, 1500)]
ZONE_FACTOR = {1: 1.0, 2: 1.5, 3: 2.0}


def rate(kg, zone):
    """Cents to ship `kg` kilograms to `zone`: the price of the first band whose bound is >= kg, times the
    zone's factor, rounded. ValueError for an unknown zone or a parcel over the last bound."""
    if zone not in ZONE_FACTOR:
        raise ValueError(f"unknown zone {zone}")
    for bound, cents in BANDS:
        if kg <= bound:
            return round(cents * ZONE_FACTOR[zone])
    raise ValueError(f"{kg} kg is over the {BANDS[-1][0]} kg limit")
