"""The memory metrics a run logs each step (obs/memory.py) are real numbers for this process."""

import mmap
import sys

import pytest

from posttrain.obs.memory import memory_metrics


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_memory_metrics_see_an_allocation():
    before = memory_metrics()
    assert set(before) == {"perf/peak_rss_mb", "perf/rss_mb", "perf/mem_available_mb"}
    assert all(v > 0 for v in before.values())
    # A fresh anonymous mapping with every page written: 200 MB that must become resident. (A bytearray can be
    # served from heap pages the process freed earlier and still holds, which would not move RSS.)
    block = mmap.mmap(-1, 200 * 1024 * 1024)
    for off in range(0, len(block), mmap.PAGESIZE):
        block[off] = 1
    after = memory_metrics()
    assert after["perf/rss_mb"] - before["perf/rss_mb"] > 150
    assert after["perf/peak_rss_mb"] >= after["perf/rss_mb"] - 1
    block.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_cgroup_limit_caps_available_memory_and_page_cache_counts_as_free(tmp_path, monkeypatch):
    from posttrain.obs import memory

    mb = 1024 * 1024
    (tmp_path / "max").write_text(f"{4096 * mb}\n")
    (tmp_path / "current").write_text(f"{3584 * mb}\n")
    (tmp_path / "stat").write_text(f"anon {3072 * mb}\ninactive_file {256 * mb}\n")
    files = (str(tmp_path / "max"), str(tmp_path / "current"), str(tmp_path / "stat"), "inactive_file")
    monkeypatch.setattr(memory, "_CGROUPS", (files,))
    assert memory.mem_available_mb() == 4096 - 3584 + 256  # the cap, less usage, plus droppable page cache
    (tmp_path / "max").write_text("max\n")  # no cap: the machine's MemAvailable
    assert memory.mem_available_mb() != 768


_FRAGMENT = """
import json, sys
from posttrain.obs.memory import release_free_heap, rss_mb
big, pins = [], []
for _ in range(2000):  # 100 KB blocks (under glibc's mmap threshold: heap) with a small block pinned after each
    big.append(bytearray(100 * 1024))
    pins.append(bytearray(1024))
del big  # 200 MB free inside the heap, held in place by the pins: glibc cannot shrink the heap's top
freed = rss_mb()
ok = release_free_heap()
print(json.dumps({"ok": ok, "freed": freed, "trimmed": rss_mb()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc")
def test_release_free_heap_gives_fragmented_free_memory_back():
    """In a fresh process (the test runner's own heap is in no known state): memory freed between pinned blocks
    stays resident until release_free_heap(); the escape hatch turns it off."""
    import json
    import os
    import subprocess

    out = json.loads(subprocess.run([sys.executable, "-c", _FRAGMENT], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    assert out["ok"] and out["freed"] - out["trimmed"] > 120, out
    env = {**os.environ, "POSTTRAIN_NO_HEAP_TRIM": "1"}
    off = json.loads(subprocess.run([sys.executable, "-c", _FRAGMENT], capture_output=True, text=True, check=True,
                                    timeout=120, env=env).stdout)
    assert not off["ok"] and off["freed"] - off["trimmed"] < 20, off
