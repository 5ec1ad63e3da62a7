"""What bench/weight_sync.py and bench/ray_weights_bench.py share: one timed row of the weight-sync table, printed
as it is made. Its own module so that the two scripts import it and not each other."""

from __future__ import annotations

import statistics


def row(path: str, engine: str, dtype: str, mb: float, times: list[float]) -> dict:
    r = {"transport": path, "engine": engine, "dtype": dtype, "megabytes": round(mb, 1),
         "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeats": len(times)}
    print(f"{engine:<22} {path:<26} {dtype:<9} {mb:8.1f} MB  median {r['median_s']:.4f} s  "
          f"[{min(times):.4f}, {max(times):.4f}]", flush=True)
    return r
