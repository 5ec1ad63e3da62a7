"""One weight push by broadcast, and its retry: the state machine both group transports run, the vLLM servers'
(cluster/server_loads.py GroupLoad) and the Ray actors' (cluster/ray_weights.py MemoryWeights).

    bc = Broadcaster(calls, host, backend, timeout_s, prefix)  the trainer's end (rank 0); `calls` asks the members
    bc.round(slots, flat, buckets)        `slots` load the flat copy by one broadcast, in the kept group when it holds
                                          exactly them (else a new one); failures by index; the group dropped after one
    bc.alone(slot, flat, buckets)         one member in a group of its own, dropped after (a replacement's load)
    bc.release()                          the kept group dropped (a member left it; the transport closes)
    load_all(pool, slots, round_, rounds, fail)   rounds until every live slot loaded: after a failed round a member
                                          the broken group failed (`failed`: alive) loads again in a rebuilt group; a
                                          dead or hung one goes to `pool.recover` (replaced, loading alone, or
                                          retired); `fail` raises when members keep failing for `rounds` rounds

A pool is reached through `RecoveringPool` only, members through `MemberCalls`: posting a call returns at once,
and its `Outcomes` waits for the answers (bounded by the group's timeout) so that the members' joins and receives
are in flight while this thread opens the group or sends.

Why one module: the group's protocol (who joins, the invitation's secret, a digest per bucket: sampling/weight_group.py)
and the rule that a broken group is rebuilt, never reused, are the same whatever a member is (a vLLM server behind
/collective_rpc, a Ray actor); only how a member is asked differs.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar

from posttrain.sampling import weight_group as wg
from posttrain.sampling import weight_transfer as wt


class Failure(NamedTuple):
    """One member's failed call: `dead` (gone), `timeout` (no answer in time: hung or stuck) or `failed` (alive, its
    call raised: e.g. the group broke under it; it loads again in a rebuilt group)."""

    why: str
    error: BaseException


Outcomes = Callable[[], dict[int, Failure]]  # waits for the posted calls; the failed ones by index


class Retirable(Protocol):
    """A pool's slot as the retry sees it: retired slots are not tried again."""

    retired: bool


S = TypeVar("S", bound=Retirable)
S_contra = TypeVar("S_contra", contravariant=True)
H = TypeVar("H")  # what a slot holds at a call (a server, an actor handle): a recovery names the one that failed


class RecoveringPool(Protocol[S_contra, H]):
    """What the retry needs of a pool (cluster/vllm_servers.py VLLMServerPool, cluster/ray_sampler.py
    RaySamplerPool)."""

    def member(self, slot: S_contra) -> H:
        """The member `slot` holds now."""
        ...

    def recover(self, slot: S_contra, failed: H, why: str) -> object:
        """`failed` (slot's member when the round began) died or hung: it is replaced (and loads the current
        weights before it serves) or its slot retired; a no-op when another caller replaced it already."""
        ...


class MemberCalls(Protocol[S_contra]):
    """How a transport asks its members to join a group and to receive a broadcast."""

    def key(self, slot: S_contra) -> object:
        """Who the slot's member is, compared by `==` (the member object itself, not its id: an id is reused once
        its object is gone): a replaced member is a new key, which the kept group does not hold."""
        ...

    def join(self, slots: Sequence[S_contra], invitations: list[str]) -> Outcomes:
        """Each member joins with its invitation (rank i + 1); posted, not waited for."""
        ...

    def receive(self, slots: Sequence[S_contra], layout: str) -> Outcomes:
        """Each member receives the broadcast `layout` describes; posted, not waited for."""
        ...


_IDS = itertools.count()


class Broadcaster(Generic[S]):
    """The trainer's end of the weight groups of one transport (module docstring)."""

    def __init__(self, calls: MemberCalls[S], host: str, backend: str, timeout_s: float, prefix: str):
        self.calls, self.host, self.backend, self.timeout_s, self.prefix = calls, host, backend, timeout_s, prefix
        self.kept: tuple[tuple[object, ...], wg.WeightGroup] | None = None  # (members, group), kept while they stay
        self.rebuilds = 0  # groups opened

    def round(self, slots: list[S], flat: wt.FlatWeights, buckets: list[tuple[int, int]]) -> dict[int, Failure]:
        if not slots:
            return {}
        keys = tuple(self.calls.key(s) for s in slots)
        kept = self.kept  # read once: a replacement's load (another thread) may drop it meanwhile
        if kept is None or kept[0] != keys:
            self.kept = None  # its sockets close; its members leave it as they join the next
            group, failures = self.open(slots)
            if group is None:
                return failures
            kept = self.kept = (keys, group)
        failures = self.broadcast(kept[1], slots, flat, buckets)
        if failures:
            self.kept = None  # a broadcast failed midway: no member can be trusted to be in step
        return failures

    def release(self) -> None:
        """Drop the kept group (its sockets close): a member left it, or the transport closes."""
        self.kept = None

    def alone(self, slot: S, flat: wt.FlatWeights, buckets: list[tuple[int, int]]) -> dict[int, Failure]:
        """`slot` loads through a group of its own, dropped after. The kept group is dropped too: the member left it
        for this one (a member is in one group at a time), so it is rebuilt at the next round."""
        self.kept = None
        group, failures = self.open([slot])
        return failures if group is None else self.broadcast(group, [slot], flat, buckets)

    def open(self, slots: list[S]) -> tuple[wg.WeightGroup | None, dict[int, Failure]]:
        """A group of this process (rank 0) and `slots`' members (ranks 1..K in order): their joins are in flight
        while this thread opens its end; the store listens on `host` only."""
        store = wg.host_store(self.host, self.timeout_s)
        name = f"{self.prefix}-{os.getpid()}-{next(_IDS)}"
        k = len(slots)
        inv = wg.Invitation(self.host, store.port, name, wg.new_token(), 0, k + 1, self.backend, self.timeout_s)
        joined = self.calls.join(slots, [inv.for_rank(i + 1).to_json() for i in range(k)])
        try:  # raises when a member never comes or is not a member
            group = wg.open_group(inv, store, device="cuda" if self.backend == "nccl" else "cpu")
        except Exception as e:  # noqa: BLE001 - who is at fault is read from the joins
            return None, joined() or dict.fromkeys(range(k), Failure("failed", e))
        failures = joined()
        if failures:
            return None, failures
        self.rebuilds += 1
        return group, {}

    def broadcast(
        self, group: wg.WeightGroup, slots: list[S], flat: wt.FlatWeights, buckets: list[tuple[int, int]]
    ) -> dict[int, Failure]:
        """The flat copy to every member of `group`, each bucket under a digest of this broadcast's nonce: their
        receives are in flight while this thread sends. A send that failed with no member's failure to show for it
        fails them all (the group is broken for everyone)."""
        nonce = wg.new_nonce()
        digests = wg.bucket_digests(group, nonce, flat.data, buckets)
        layout = wt.layout_json(flat.specs, buckets, name=group.name, nonce=nonce, digests=digests)
        received = self.calls.receive(slots, layout)
        try:
            wg.send_flat(group, flat.data, buckets)
        except Exception as e:  # noqa: BLE001 - a peer died or the group timed out: the members' answers say which
            send_error: BaseException | None = e
        else:
            send_error = None
        failures = received()
        if send_error is not None and not failures:
            failures = dict.fromkeys(range(len(slots)), Failure("failed", send_error))
        return failures


def load_all(
    pool: RecoveringPool[S, H],
    slots: list[S],
    round_: Callable[[list[S]], dict[int, Failure]],
    rounds: int,
    fail: Callable[[list[S], Failure], BaseException],
) -> None:
    """Every slot of `slots` loads by `round_` (failures by index), for at most `rounds` rounds (module docstring).
    A retired slot drops out; `fail(pending, last failure)` is raised when some are still failing at the end."""
    pending = list(slots)
    for _ in range(rounds):
        members = [pool.member(s) for s in pending]  # before the round: a recovery names the member that failed
        failures = round_(pending)
        if not failures:
            return
        retry = []
        for i, f in failures.items():
            if f.why == "failed":
                retry.append(pending[i])  # alive: the broken group failed it, not its own fault
            else:
                pool.recover(pending[i], members[i], f.why)  # replaced (loading alone) or retired
            last = f
        pending = [s for s in retry if not s.retired]
        if not pending:
            return
    raise fail(pending, last)
