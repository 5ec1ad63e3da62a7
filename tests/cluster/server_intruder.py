"""What another local process can find and reach of a server posttrain started: the sockets its process group
listens on (as `ss -ltnxp` lists them, read from /proc), an HTTP request to each TCP one, and a connection to each
Unix one as another user (a process of another uid: only possible when the tests run as root)."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

import httpx

NOBODY = 65534


def group_pids(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(pid))
    return out


def _socket_inodes(pids: list[int]) -> set[int]:
    found = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        found.add(int(link[8:-1]))
    return found


def _ip(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def tcp_listeners(pgid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the group listens on."""
    pids = group_pids(pgid)
    inodes = _socket_inodes(pids)
    out = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pids[0]}/net/{table}").read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A" and int(f[9]) in inodes:  # 0A: LISTEN
                    addr, port = f[1].rsplit(":", 1)
                    out.append((_ip(addr), int(port, 16)))
    return out


def unix_listeners(pgid: int) -> list[str]:
    """The paths of every Unix stream socket the group listens on."""
    pids = group_pids(pgid)
    inodes = _socket_inodes(pids)
    out = []
    for line in Path(f"/proc/{pids[0]}/net/unix").read_text().splitlines()[1:]:
        f = line.split()
        # Num RefCount Protocol Flags Type St Inode Path; flags 00010000: accepting connections
        if len(f) >= 8 and int(f[3], 16) & 0x10000 and int(f[6]) in inodes and not f[7].startswith("@"):
            out.append(f[7])
    return out


def reaches_over_tcp(listeners: list[tuple[str, int]], path: str, body: dict) -> list[str]:
    """The listeners where a plain TCP client's POST of `body` to `path` got an HTTP answer (any status: the route
    was reached)."""
    hit = []
    for addr, port in listeners:
        host = f"[{addr}]" if ":" in addr else addr
        try:
            r = httpx.post(f"http://{host}:{port}{path}", json=body, timeout=5.0)
        except httpx.HTTPError:
            continue
        hit.append(f"{addr}:{port} -> HTTP {r.status_code} {r.text[:120]}")
    return hit


def other_user_connects(path: str, uid: int = NOBODY) -> bool | None:
    """Whether a process of user `uid` can connect to the Unix socket `path`; None where this process cannot
    become another user (not root)."""
    if os.geteuid() != 0:
        return None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become `uid` and try; its answer is one byte
        code = b"?"
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                try:
                    s.connect(path)
                    code = b"y"
                except OSError:
                    code = b"n"
        finally:
            os.write(w, code)
            os._exit(0)
    os.close(w)
    try:
        answer = os.read(r, 1)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    if answer not in (b"y", b"n"):
        raise RuntimeError(f"the probe as uid {uid} failed ({answer!r})")
    return answer == b"y"
