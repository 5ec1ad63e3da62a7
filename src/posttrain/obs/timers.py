"""Stage timers: `with timer("sample"): ...` accumulates seconds under `time/sample` (and, while a run traces,
writes the stage as a span on the timer's worker lane: obs/trace.py)."""

from __future__ import annotations

import time
from contextlib import contextmanager

from posttrain.obs import trace


class StageTimer:
    def __init__(self, worker: str = "trainer") -> None:
        self.seconds: dict[str, float] = {}
        self.worker = worker  # the trace lane its stages go on

    @contextmanager
    def __call__(self, stage: str, **trace_args):
        t0 = time.perf_counter()
        try:
            with trace.span(stage, worker=self.worker, **trace_args):
                yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.seconds.items()}

    def reset(self) -> None:
        self.seconds.clear()


class BusyMeter:
    """Wall time during which at least one of possibly many concurrent operations was in progress (the union
    of their intervals), e.g. "the sampler was generating". Enter/exit pairs may overlap."""

    def __init__(self) -> None:
        self.active = 0
        self._busy = 0.0
        self._since = 0.0

    def enter(self) -> None:
        if self.active == 0:
            self._since = time.perf_counter()
        self.active += 1

    def exit(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._busy += time.perf_counter() - self._since

    def read(self) -> float:
        """Busy seconds so far (including the interval in progress)."""
        return self._busy + (time.perf_counter() - self._since if self.active else 0.0)

    @contextmanager
    def __call__(self):
        self.enter()
        try:
            yield
        finally:
            self.exit()
