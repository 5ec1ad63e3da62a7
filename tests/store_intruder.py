"""What a local process that is not a member can do to a weight group's rendezvous (sampling/weight_group.py): reach
the trainer's store by its port, poll its keys (any client may list them), and run its own moves in threads. Shared
by tests/sampling/test_weight_group.py (the group alone) and tests/cluster/test_server_loads.py (a server pool's
push); tests/cluster/server_intruder.py is the same for a running server's sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

REAL_STORE = dist.TCPStore  # before a test's spy replaces it


def bg(fn: Callable[..., Any], *args: Any) -> threading.Thread:
    """`fn(*args)` in a daemon thread, started."""
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def wait_for(what: str, fn: Callable[[], Any], timeout: float) -> Any:
    """`fn()`'s first truthy answer, polled; TimeoutError(what) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.002)
    raise TimeoutError(what)


def store_client(port: int, timeout_s: float) -> Any:
    """A client of the store on 127.0.0.1:`port`, as any local process can make one."""
    return REAL_STORE("127.0.0.1", port, None, False, timedelta(seconds=timeout_s), wait_for_workers=False)


def wait_key(store: Any, suffix: str, timeout: float) -> str:
    """The first key of `store` ending in `suffix` (`/0/0`: rank 0's address, `/0/1`: rank 1's), once one is set."""
    return wait_for(suffix, lambda: next((k for k in store.list_keys() if k.endswith(suffix)), ""), timeout)


def other_address() -> str | None:
    """A non-loopback address of this machine, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def reachable(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0
