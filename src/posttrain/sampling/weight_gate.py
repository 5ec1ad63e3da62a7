"""Who may touch a sampler's weights when: decode steps and weight writes take turns.

A sampler that holds its own copy of the policy (the async loop) receives weight syncs from the trainer's thread
while it decodes in another. A forward pass must never read weights half-written, so the two exclude each other.
How coarse the exclusion is decides how long a sync waits:

- whole calls (`interruptible=False`): a sync waits for the generation in flight to finish, up to max_tokens
  decode steps (seconds on a CPU), and every completion comes from one policy version;
- single steps (`interruptible=True`, AReaL's interruptible generation): a sync lands between two decode steps of
  a generation in flight, so it waits one forward pass at most; the generation goes on under the new weights and
  each token records the version it was sampled under (`Completion.token_versions`).

The gate prefers writers: once a write is waiting, no new step starts until it is done. Python's locks are not
fair, and a decode loop that releases and re-takes a plain lock every step would keep a waiting sync out for many
steps (it holds the GIL between the two).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class WeightGate:
    def __init__(self, timeout_s: float = 900.0) -> None:
        """`timeout_s`: how long a write waits for the decode in flight (a whole call when not interruptible) and a
        step for a write, before TimeoutError: a hung decode or write must not hang the run."""
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._readers = 0  # decode steps (or whole calls) using the weights now
        self._writers = 0  # writes waiting or running
        self._writing = False

    @contextmanager
    def read(self) -> Iterator[None]:
        """Around one forward pass (or one whole decode call): the weights stay as they are meanwhile."""
        with self._cond:
            self._wait(lambda: self._writers == 0, "a decode step waited for a weight write")
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        """Around a weight write: waits for the forward pass in flight, and keeps the next one out until done."""
        with self._cond:
            self._writers += 1
            try:
                self._wait(lambda: self._readers == 0 and not self._writing, "a weight write waited for decoding")
            except TimeoutError:
                self._writers -= 1
                self._cond.notify_all()
                raise
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._writers -= 1
                self._cond.notify_all()

    def _wait(self, ready, what: str) -> None:
        """Under the condition's lock: wait until `ready()`, at most timeout_s."""
        if not self._cond.wait_for(ready, timeout=self.timeout_s):
            raise TimeoutError(f"{what} for more than {self.timeout_s:g}s (a decode or a sync is hanging)")

    @property
    def writers_waiting(self) -> int:
        """Writes waiting or running (tests use it to line a write up with a decode step)."""
        with self._cond:
            return self._writers
