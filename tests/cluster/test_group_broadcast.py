"""The broadcast's retry (cluster/group_broadcast.py), once, against a fake pool that implements its protocol
(`member`, `recover`): what both transports (the vLLM servers', the Ray actors') run after a failed round."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.cluster.group_broadcast import Broadcaster, Failure, load_all


@dataclass
class _Slot:
    rank: int
    member: str  # the member it holds: "<rank>.<incarnation>"
    incarnation: int = 0
    retired: bool = False


@dataclass
class _Pool:
    """A pool that replaces a dead member (the replacement loads as it starts: `synced`) until it is out of
    restarts, then retires the slot; every recovery is recorded."""

    max_restarts: int = 3
    recovered: list[tuple[int, str, str]] = field(default_factory=list)
    synced: list[str] = field(default_factory=list)

    def member(self, slot: _Slot) -> str:
        return slot.member

    def recover(self, slot: _Slot, failed: str, why: str) -> _Slot:
        self.recovered.append((slot.rank, failed, why))
        if slot.member is not failed:  # another caller replaced it already
            return slot
        if slot.incarnation >= self.max_restarts:
            slot.retired = True
            return slot
        slot.incarnation += 1
        slot.member = f"{slot.rank}.{slot.incarnation}"
        self.synced.append(slot.member)  # the replacement loads the current weights before it serves
        return slot


class _Script:
    """A round that fails the members its script names: script[round][rank] = why (absent: loads)."""

    def __init__(self, script: list[dict[int, str]]):
        self.script, self.rounds, self.loaded = script, [], []

    def __call__(self, slots: list[_Slot]) -> dict[int, Failure]:
        plan = self.script[len(self.rounds)] if len(self.rounds) < len(self.script) else {}
        self.rounds.append([s.member for s in slots])
        out = {
            i: Failure(plan[s.rank], RuntimeError(f"{s.member} {plan[s.rank]}"))
            for i, s in enumerate(slots)
            if s.rank in plan
        }
        self.loaded += [s.member for i, s in enumerate(slots) if i not in out]
        return out


class _Failed(RuntimeError):
    pass


def _fail(pending: list[_Slot], last: Failure) -> _Failed:
    return _Failed(f"{len(pending)} kept failing (last: {last.error})")


def _run(script: list[dict[int, str]], n: int = 3, rounds: int = 5, max_restarts: int = 3):
    pool, slots, round_ = _Pool(max_restarts), [_Slot(r, f"{r}.0") for r in range(n)], _Script(script)
    load_all(pool, slots, round_, rounds, _fail)
    return pool, slots, round_


def test_every_member_loads_in_one_round_when_none_fails():
    pool, _, round_ = _run([])
    assert round_.rounds == [["0.0", "1.0", "2.0"]] and not pool.recovered


def test_a_member_the_broken_group_failed_loads_again_in_the_next_round_and_is_not_restarted():
    pool, _, round_ = _run([{1: "failed"}])
    assert round_.rounds == [["0.0", "1.0", "2.0"], ["1.0"]]
    assert not pool.recovered and sorted(round_.loaded) == ["0.0", "1.0", "2.0"]


@pytest.mark.parametrize("why", ["dead", "timeout"])
def test_a_dead_or_hung_member_is_recovered_once_and_its_replacement_synced(why):
    pool, slots, round_ = _run([{2: why}])
    assert pool.recovered == [(2, "2.0", why)]  # the member that failed, as it was when the round began
    assert pool.synced == ["2.1"] and slots[2].member == "2.1" and not slots[2].retired
    assert round_.rounds == [["0.0", "1.0", "2.0"]]  # the replacement loaded as it started: no second round


def test_a_member_that_keeps_failing_alive_fails_the_push_after_the_rounds():
    with pytest.raises(_Failed, match="1 kept failing"):
        _run([{0: "failed"}] * 10, rounds=4)


def test_a_member_that_keeps_dying_is_retired_and_the_push_completes_without_it():
    pool, slots, round_ = _run([{0: "dead"}, {}, {}], max_restarts=0)
    assert slots[0].retired and pool.recovered == [(0, "0.0", "dead")] and not pool.synced
    assert len(round_.rounds) == 1


def test_a_member_another_caller_replaced_meanwhile_is_not_replaced_twice():
    pool, slots = _Pool(), [_Slot(0, "0.0")]

    def round_(s: list[_Slot]) -> dict[int, Failure]:
        pool.recover(slots[0], "0.0", "dead")  # a sample call's recovery, in another thread, during the round
        return {0: Failure("dead", RuntimeError("gone"))}

    load_all(pool, slots, round_, 3, _fail)
    assert pool.synced == ["0.1"]  # one replacement: the round's recovery named the old member, already replaced


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.integers(0, 3), st.sampled_from(["dead", "timeout", "failed"]), max_size=4), max_size=8
    ),
    st.integers(1, 6),
    st.integers(0, 3),
)
def test_every_slot_ends_loaded_retired_or_the_push_fails(script, rounds, max_restarts):
    """Whatever fails when: at most `rounds` rounds; only dead or hung members are recovered, each by the member it
    held when its round began; without an error every live slot's member loaded (in a round or as a replacement)."""
    pool, slots, round_ = _Pool(max_restarts), [_Slot(r, f"{r}.0") for r in range(4)], _Script(script)
    try:
        load_all(pool, slots, round_, rounds, _fail)
        failed = False
    except _Failed:
        failed = True
    assert len(round_.rounds) <= rounds
    assert all(why in ("dead", "timeout") for _, _, why in pool.recovered)
    for rank, member, _ in pool.recovered:
        assert any(member in r for r in round_.rounds), (rank, member)
    if not failed:
        for s in slots:
            assert s.retired or s.member in round_.loaded or s.member in pool.synced, s


# ---- the kept group ---------------------------------------------------------------------------------------------
class _Calls:
    def key(self, slot: _Slot) -> object:
        return slot.member


def _broadcaster(fail_broadcasts: int = 0) -> tuple[Broadcaster, list[list[str]], list[list[str]]]:
    """A Broadcaster whose group opening and sending are recorded, not run (gloo is tested in
    tests/sampling/test_weight_group.py and tests/cluster/test_server_loads.py)."""
    bc, opened, sent = Broadcaster(_Calls(), "127.0.0.1", "gloo", 5.0, "test"), [], []
    left = [fail_broadcasts]

    def open_(slots):
        opened.append([s.member for s in slots])
        return object(), {}

    def broadcast(group, slots, flat, buckets):
        sent.append([s.member for s in slots])
        if left[0]:
            left[0] -= 1
            return {0: Failure("failed", RuntimeError("broken"))}
        return {}

    bc.open, bc.broadcast = open_, broadcast  # type: ignore[method-assign]
    return bc, opened, sent


def test_the_group_is_kept_while_its_members_stay_and_rebuilt_when_one_changes():
    bc, opened, sent = _broadcaster()
    slots = [_Slot(0, "0.0"), _Slot(1, "1.0")]
    assert bc.round(slots, None, []) == {}  # type: ignore[arg-type]
    assert bc.round(slots, None, []) == {}  # type: ignore[arg-type]
    assert opened == [["0.0", "1.0"]] and len(sent) == 2
    slots[1].member = "1.1"  # replaced
    bc.round(slots, None, [])  # type: ignore[arg-type]
    assert opened == [["0.0", "1.0"], ["0.0", "1.1"]]


def test_a_failed_broadcast_drops_the_group_and_a_lone_load_drops_it_too():
    bc, opened, _ = _broadcaster(fail_broadcasts=1)
    slots = [_Slot(0, "0.0")]
    assert bc.round(slots, None, [])  # type: ignore[arg-type]
    assert bc.kept is None
    bc.round(slots, None, [])  # type: ignore[arg-type]
    assert len(opened) == 2 and bc.kept is not None
    bc.alone(slots[0], None, [])  # type: ignore[arg-type]
    assert bc.kept is None and len(opened) == 3  # the member left the kept group for its own
