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
