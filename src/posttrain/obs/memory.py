"""Process memory, logged with every train step: `perf/peak_rss_mb` (this process's peak resident set),
`perf/rss_mb` (now) and `perf/mem_available_mb` (what the machine, or the cgroup the run is in, can still give).

Why: when a run outgrows memory the kernel's OOM killer ends it with SIGKILL, and nothing is printed: the log
just stops. The `memory_pressure` diagnostic (obs/diagnostic_checks.py) reads these keys and warns while there is time.
All reads are cheap (getrusage and two small /proc or /sys files); on a platform without them a key is left out.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

MB = 1024 * 1024
# cgroup files that cap a container's memory: v2, then v1 (limit, usage, stat, the stat key of reclaimable page
# cache). "max" or a huge number means no cap. Usage counts page cache the kernel can drop before it kills
# anything, so the inactive file pages are taken off it, as container runtimes do for a "working set".
_CGROUPS = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat", "inactive_file"),
    (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        "/sys/fs/cgroup/memory/memory.stat",
        "total_inactive_file",
    ),
)


_LIBC: list = []  # [the glibc handle, or None where there is no malloc_trim]


def release_free_heap() -> bool:
    """Hand the pages that glibc's heap holds free back to the OS (malloc_trim(0)); True if it could.

    Why: tensors freed by one phase (the sampler's KV caches, the optimizer's work) stay resident inside glibc's
    heap, in pieces the next phase's differently sized tensors cannot reuse, so the process's resident set (what
    the OOM killer counts) ends up well above what is live. Trimming between phases costs milliseconds; making every
    large tensor its own mmap (MALLOC_MMAP_THRESHOLD_) did the same for memory but slowed a GRPO step by ~40%."""
    if os.environ.get("POSTTRAIN_NO_HEAP_TRIM"):  # an escape hatch, and the A/B of bench measurements
        return False
    if not _LIBC:
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            _LIBC.append(libc if hasattr(libc, "malloc_trim") else None)
        except OSError:  # not glibc (macOS, musl)
            _LIBC.append(None)
    if _LIBC[0] is None:
        return False
    _LIBC[0].malloc_trim(0)
    return True


def peak_rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / MB if sys.platform == "darwin" else r / 1024  # bytes on macOS, KiB on Linux


def rss_mb() -> float | None:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / MB


def mem_available_mb() -> float | None:
    """MemAvailable from /proc/meminfo, or less when a cgroup caps this process lower."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) / 1024
                break
    except (OSError, ValueError, IndexError):
        return None
    for limit_path, usage_path, stat_path, reclaimable in _CGROUPS:
        try:
            limit, usage = Path(limit_path).read_text().strip(), int(Path(usage_path).read_text())
        except (OSError, ValueError):
            continue
        if limit != "max" and int(limit) < 1 << 60:  # v1 writes ~2^63 for "no limit"
            left = (int(limit) - usage + _stat(stat_path, reclaimable)) / MB
            avail = left if avail is None else min(avail, left)
        break
    return avail


def _stat(path: str, key: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def memory_metrics() -> dict[str, float]:
    now, avail = rss_mb(), mem_available_mb()
    m = {"perf/peak_rss_mb": max(peak_rss_mb(), now or 0.0)}  # the two count pages slightly differently
    if now is not None:
        m["perf/rss_mb"] = now
    if avail is not None:
        m["perf/mem_available_mb"] = avail
    return m
