"""The weight group: the torch.distributed group (gloo or NCCL) over which the trainer broadcasts the flat copy of
the weights (sampling/weight_transfer.py) to engines, made so that only its members can join it and it cannot
deliver forged weights.

    store = host_store(host, timeout_s)                          trainer: the rendezvous, listening on `host` only
    inv = Invitation(host, store.port, name, new_token(), 0, world, backend, timeout_s)
    group = open_group(inv, store)                               trainer (rank 0); member r: open_group(inv_r)
    nonce = new_nonce(); digests = bucket_digests(group, nonce, data, buckets)     sent with the layout
    send_flat(group, data, buckets)                              rank 0: every bucket, bucketed broadcast
    iter_received(group, specs, buckets, nonce, digests)         ranks 1..K: (name, tensor), each bucket verified

Why: the group's rendezvous is a TCPStore the trainer hosts, and any process that reaches its port can read and
write every key (`list_keys` lists them). A process that wrote the trainer's address, or a member's, could be
rank 1 to the trainer (it is sent the weights) and rank 0 to an engine (it sends forged ones), and a push would
report success. So:

- The store listens on the address the members reach it at, never on every interface (TCPStore alone would):
  127.0.0.1 when every member is on this host (the gloo sockets then bind there too), the node's address under Ray.
- Each group has a secret (`new_token`, 256 random bits) that travels only in the `Invitation`, through the call
  that already tells a member the layout (the HTTP /collective_rpc to a server, the Ray actor call). From it: the
  keys' prefix, a key that seals every value the members write to the store (a MAC over the key name and value:
  a value a non-member wrote fails the reader's join at once, so no member is lured to a non-member's address),
  the tag each rank presents once the group is formed (an allgather every rank checks: a non-member that took a
  member's place fails the join before any weight is sent), and the key of the bucket digests.
- Each broadcast's layout carries a keyed blake2b digest of every bucket over a fresh nonce; a receiver checks
  each bucket before it hands out any of its tensors, so a forged (or replayed, or corrupted) bucket is never
  loaded: the receive fails with `ForgedWeights`, logged here and by the trainer, and the push is retried in a
  fresh group.
- Every join (store connection, rendezvous, connection of the mesh, the tags) is bounded as a whole by the group's
  timeout plus `JOIN_GRACE_S`: gloo's own connect waits ~25-40 s for a peer that took another's place, whatever
  the group's timeout. Every collective waits at most the group's timeout.

Not covered: the weights themselves cross the network unencrypted (for engines on other hosts, the network is to
be trusted as Ray's own traffic is), and NCCL's bootstrap sockets listen where NCCL_SOCKET_IFNAME says.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from posttrain.errors import PosttrainError
from posttrain.sampling.weight_ipc import TensorSpec

log = logging.getLogger(__name__)
JOIN_GRACE_S = 5.0  # a join's bound past the group's timeout: the rendezvous' own waits fail first when they can
_TAG = 32  # bytes of every MAC and digest
_R = TypeVar("_R")


class WeightGroupError(PosttrainError):
    """A weight group could not be formed or used: a process that is not a member reached it, or a member did not
    answer within the group's timeout."""

    fix = (
        "the push is retried in a fresh group; if it keeps failing, look for a process on this host that connects to "
        "the trainer's weight-group port (ss -tnp), or use cluster.weight_transport=shared_memory for engines on "
        "this host"
    )


class ForgedWeights(WeightGroupError):
    """A received bucket does not match the digest the trainer sent for it: it is not loaded."""


def _refused(err: WeightGroupError) -> WeightGroupError:
    log.error("%s", err)
    return err


# ---- the secret -----------------------------------------------------------------------------------------------
def new_token() -> str:
    return secrets.token_hex(32)


def new_nonce() -> str:
    return secrets.token_hex(16)


def _derive(token: str, label: bytes) -> bytes:
    """A key of its own for each use of the group's secret (the prefix reveals nothing of the others)."""
    return hashlib.blake2b(label, key=bytes.fromhex(token), digest_size=_TAG).digest()


@dataclass(frozen=True)
class Invitation:
    """What a member needs to join: where the store is, its rank, the group's secret. Sent to each member only
    through the call that tells it the layout; never written to the store."""

    host: str
    port: int
    name: str  # the group's public name (the layout names the group it is for)
    token: str
    rank: int
    world: int
    backend: str
    timeout_s: float

    def for_rank(self, rank: int) -> Invitation:
        return replace(self, rank=rank)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Invitation:
        names = {f.name for f in fields(cls)}
        try:
            d = json.loads(text)
            if not isinstance(d, dict) or set(d) != names:
                raise ValueError(f"needs exactly {sorted(names)}")
            inv = cls(
                str(d["host"]), int(d["port"]), str(d["name"]), str(d["token"]), int(d["rank"]), int(d["world"]),
                str(d["backend"]), float(d["timeout_s"]),
            )  # fmt: skip
            ok = 0 <= inv.rank < inv.world and len(bytes.fromhex(inv.token)) >= 16 and inv.timeout_s > 0
        except (TypeError, ValueError) as e:
            raise WeightGroupError(f"a malformed weight-group invitation: {e}") from None
        if not ok:
            raise WeightGroupError(f"a malformed weight-group invitation for rank {inv.rank} of {inv.world}")
        return inv

    @property
    def local(self) -> bool:
        """The store is on a loopback address: every member is on this host."""
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


# ---- the store --------------------------------------------------------------------------------------------------
def host_store(host: str, timeout_s: float) -> Any:
    """The trainer's rendezvous store, listening on `host` only (a free port; read it back from `.port`). TCPStore
    listens on every interface whatever host it is given; so the listening socket is made here, bound to `host`,
    and handed over (`master_listen_fd`; the store owns and closes it)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(addr)
        sock.listen(128)
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    fd = sock.detach()
    try:
        return dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]  # public; torch re-exports it without `as`
            host, port, None, True, timedelta(seconds=timeout_s), wait_for_workers=False, master_listen_fd=fd
        )
    except BaseException:
        with contextlib.suppress(OSError):  # the store may have closed it already
            os.close(fd)
        raise


def _client_store(host: str, port: int, timeout_s: float) -> Any:
    return dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]  # as above
        host, port, None, False, timedelta(seconds=timeout_s), wait_for_workers=False
    )


class SealedStore(dist.Store):  # pyright: ignore[reportPrivateImportUsage]  # as above
    """`inner` as the group's members see it: every value they set carries a MAC under the group's key (over the
    key's name and the value), and every value they get is checked. The backends' rendezvous (gloo: each rank's
    address; NCCL: its unique id) sets and gets through it, so a value a non-member wrote fails the reader's join
    at once instead of pointing it at the writer. Counters (`add`) pass unsealed: they carry no address."""

    def __init__(self, inner: Any, key: bytes, group: str):
        super().__init__()
        self._inner, self._key, self._group = inner, key, group

    def _mac(self, key: str, value: bytes) -> bytes:
        name = key.encode()
        return hmac.digest(self._key, len(name).to_bytes(4, "big") + name + value, "blake2b")[:_TAG]

    def set(self, key: str, value: Any) -> None:
        v = value.encode() if isinstance(value, str) else bytes(value)
        self._inner.set(key, self._mac(key, v) + v)

    def get(self, key: str) -> bytes:
        raw = bytes(self._inner.get(key))
        tag, value = raw[:_TAG], raw[_TAG:]
        if len(raw) < _TAG or not hmac.compare_digest(tag, self._mac(key, value)):
            raise _refused(
                WeightGroupError(
                    f"weight group {self._group}: the rendezvous key {key!r} holds a value not sealed with the "
                    "group's secret: a process that is not a member wrote it; the join is refused"
                )
            )
        return value

    def add(self, key: str, amount: int) -> int:
        return self._inner.add(key, amount)

    def check(self, keys: list[str]) -> bool:
        return self._inner.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        return self._inner.wait(keys) if timeout is None else self._inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        return self._inner.delete_key(key)

    def num_keys(self) -> int:
        return self._inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self._inner.set_timeout(timeout)


# ---- the group ------------------------------------------------------------------------------------------------
@dataclass
class WeightGroup:
    """One member's end of a formed group; `store` is kept alive as long as the group."""

    pg: Any
    store: Any
    inv: Invitation
    device: str  # where this member's buckets live (the trainer's: where it sends from)

    @property
    def name(self) -> str:
        return self.inv.name

    @property
    def timeout(self) -> timedelta:
        return timedelta(seconds=self.inv.timeout_s)


def _within(seconds: float, what: str, fn: Callable[[], _R]) -> _R:
    """`fn()` in a thread of its own, given up on after `seconds` (it may still run a while: a native wait cannot be
    interrupted from Python; its result is then dropped)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["ok"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread below
            box["error"] = e

    t = threading.Thread(target=run, name="weight-group-join", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise _refused(WeightGroupError(f"{what} did not finish within {seconds:g}s"))
    if "error" in box:
        raise box["error"]
    return box["ok"]


def open_group(inv: Invitation, store: Any = None, device: str = "cpu") -> WeightGroup:
    """Join `inv`'s group as `inv.rank`: over `store` (the trainer's own) or a connection to `inv.host:port`. Blocks
    until every rank joined and presented the group's tag; raises WeightGroupError when one is not a member or
    the group's timeout (plus JOIN_GRACE_S) passes first. `device`: where this member's buckets live."""
    if inv.backend not in ("gloo", "nccl"):
        raise ValueError(f"weight group backend must be gloo or nccl, got {inv.backend!r}")

    def form() -> WeightGroup:
        inner = store if store is not None else _client_store(inv.host, inv.port, inv.timeout_s)
        sealed = SealedStore(inner, _derive(inv.token, b"store"), inv.name)
        prefixed = dist.PrefixStore(_prefix(inv.token), sealed)  # pyright: ignore[reportPrivateImportUsage]  # as above
        group = WeightGroup(_process_group(inv, prefixed), inner, inv, device)
        _present_tags(group)
        return group

    return _within(inv.timeout_s + JOIN_GRACE_S, f"rank {inv.rank} joining weight group {inv.name}", form)


def _prefix(token: str) -> str:
    return "posttrain-wg-" + _derive(token, b"prefix").hex()[:24]


def _process_group(inv: Invitation, store: Any) -> Any:
    """A process group of its own over `store` (never torch.distributed's default group: an engine's workers and
    FSDP ranks have theirs). On this host alone, gloo's sockets listen on loopback only."""
    td = timedelta(seconds=inv.timeout_s)
    if inv.backend == "gloo" and not inv.local:  # gloo's default device: the host name's address, GLOO_SOCKET_IFNAME
        return dist.ProcessGroupGloo(store, inv.rank, inv.world, td)
    if inv.backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()  # pyright: ignore[reportAttributeAccessIssue]  # in the binding, not the stub
        opts._timeout = td
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=inv.host)]
        return dist.ProcessGroupGloo(store, inv.rank, inv.world, opts)
    nccl = dist.ProcessGroupNCCL.Options()
    nccl._timeout = td
    return dist.ProcessGroupNCCL(store, inv.rank, inv.world, nccl)


def _member_tag(inv: Invitation, rank: int) -> bytes:
    return hmac.digest(_derive(inv.token, b"member"), rank.to_bytes(8, "big"), "blake2b")[:_TAG]


def _present_tags(group: WeightGroup) -> None:
    """Every rank's tag to every rank (one allgather), each checked: a process that took a member's place cannot
    make its tag, so every rank that sees it refuses the group, the trainer before it sends anything."""
    inv = group.inv
    dev = "cpu" if inv.backend == "gloo" else group.device
    mine = torch.frombuffer(bytearray(_member_tag(inv, inv.rank)), dtype=torch.uint8).to(dev)
    out = [[torch.zeros(_TAG, dtype=torch.uint8, device=dev) for _ in range(inv.world)]]
    group.pg.allgather(out, [mine]).wait(group.timeout)
    bad = [r for r, t in enumerate(out[0]) if not hmac.compare_digest(_bytes(t), _member_tag(inv, r))]
    if bad:
        raise _refused(
            WeightGroupError(
                f"weight group {inv.name}: rank(s) {bad} did not present the group's secret: a process that is not "
                f"a member took their place; rank {inv.rank} refuses the group before any weight is sent"
            )
        )


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().numpy().tobytes()


# ---- the broadcast ------------------------------------------------------------------------------------------
def _digest(key: bytes, nonce: str, i: int, chunk: torch.Tensor) -> str:
    h = hashlib.blake2b(key=key, digest_size=_TAG, person=b"posttrain-bucket")
    h.update(bytes.fromhex(nonce) + i.to_bytes(8, "big") + chunk.numel().to_bytes(8, "big"))
    h.update(chunk.detach().cpu().numpy().data)  # large buffers: hashlib lets go of the GIL while it hashes
    return h.hexdigest()


def bucket_digests(group: WeightGroup, nonce: str, data: torch.Tensor, buckets: list[tuple[int, int]]) -> list[str]:
    """The trainer: a digest of each bucket of `data` under the group's key and this broadcast's `nonce` (so a
    bucket of an earlier push does not pass for this one); hashed on a few threads."""
    key = _derive(group.inv.token, b"digest")
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(buckets))), thread_name_prefix="weight-digest") as ex:
        return list(ex.map(lambda i: _digest(key, nonce, i, data[buckets[i][0] : buckets[i][1]]), range(len(buckets))))


def _root0() -> Any:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return opts


def send_flat(group: WeightGroup, data: torch.Tensor, buckets: list[tuple[int, int]]) -> None:
    """Rank 0: broadcast each bucket of `data` (all posted at once, then waited on, so the transport pipelines them).
    On a GPU group each bucket is copied to the group's device first. Raises when a peer fails or the group's
    timeout passes."""
    works = []
    for a, b in buckets:
        chunk = data[a:b] if group.device == "cpu" else data[a:b].to(group.device, non_blocking=True)
        works.append((group.pg.broadcast([chunk], _root0()), chunk))
    for w, _ in works:
        w.wait(group.timeout)


def iter_received(
    group: WeightGroup, specs: list[TensorSpec], buckets: list[tuple[int, int]], nonce: str, digests: list[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Ranks 1..K: every tensor of the layout, bucket by bucket, as (name, tensor) for a loader to consume. Each
    bucket is checked against its digest before any of its tensors is handed out (ForgedWeights otherwise); the
    next bucket's receive is posted first, so receiving, checking and loading overlap."""
    if len(digests) != len(buckets):
        raise _refused(ForgedWeights(f"weight group {group.name}: {len(digests)} digests for {len(buckets)} buckets"))
    if not buckets:
        return
    key = _derive(group.inv.token, b"digest")
    by_bucket: list[list[TensorSpec]] = [[] for _ in buckets]
    k = 0
    for s in specs:
        while s.offset >= buckets[k][1]:
            k += 1
        by_bucket[k].append(s)

    def post(i: int) -> tuple[Any, torch.Tensor]:
        a, b = buckets[i]
        buf = torch.empty(b - a, dtype=torch.uint8, device=group.device)
        return group.pg.broadcast([buf], _root0()), buf

    pending = post(0)
    for i in range(len(buckets)):
        work, buf = pending
        work.wait(group.timeout)
        if i + 1 < len(buckets):
            pending = post(i + 1)
        if not hmac.compare_digest(_digest(key, nonce, i, buf), str(digests[i])):
            raise _refused(
                ForgedWeights(
                    f"weight group {group.name}: bucket {i} of {len(buckets)} does not match the digest the trainer "
                    "sent: forged or corrupted in transit; it is not loaded and this push is refused"
                )
            )
        base = buckets[i][0]
        for s in by_bucket[i]:
            a = s.offset - base
            yield s.name, buf[a : a + s.nbytes].view(getattr(torch, s.dtype)).view(s.shape)
