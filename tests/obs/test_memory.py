"""The memory metrics a run logs each step (obs/memory.py) are real numbers for this process."""

import sys

import pytest

from posttrain.obs.memory import memory_metrics


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_memory_metrics_see_an_allocation():
    before = memory_metrics()
    assert set(before) == {"perf/peak_rss_mb", "perf/rss_mb", "perf/mem_available_mb"}
    assert all(v > 0 for v in before.values())
    block = bytearray(200 * 1024 * 1024)  # touched pages: 200 MB resident
    block[:: 4096] = b"x" * len(block[:: 4096])
    after = memory_metrics()
    assert after["perf/rss_mb"] - before["perf/rss_mb"] > 150
    assert after["perf/peak_rss_mb"] >= after["perf/rss_mb"] - 1
    del block
