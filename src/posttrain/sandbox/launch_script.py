"""The root-side shell script that starts a run's process(es) inside the sandbox, after the namespaces exist.

It is staged as a root-only file (`/in/.launch.sh`, mode 0700), not passed on a command line: a command line
is readable by every process in the sandbox, and this script holds the environment values and, for two-process
grading, the plumbing between the processes.

One process: prepare the work dir, drop to the run's uid, exec the command.
Two processes (out-of-process grading): the solution process runs under a second uid in the work dir, with the
result fd closed; the main (test) process runs under the run's uid in a private home; two FIFOs in a root-only
dir, opened by root before either process drops privileges, are the only link between them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from posttrain.sandbox.config import SandboxConfig
from posttrain.sandbox.limits import prlimit_args
from posttrain.sandbox.tools import tool

RPC_CANDIDATES = (7, 8, 9, 6, 5, 4, 3)  # single digits: dash redirects no others


def rpc_fds(taken: list[int]) -> tuple[int, int]:
    """fd numbers for the request and reply pipes in both processes: single digits that no fd passed into the
    sandbox uses (a result fd of 7 would otherwise be overwritten by the request pipe)."""
    free = [n for n in RPC_CANDIDATES if n not in taken]
    return free[0], free[1]


@dataclass
class Proc:
    """One process to start: what it runs, its environment, its uid (None: keep ours), its cwd."""

    argv: list[str]
    env: dict[str, str]
    uid: int | None
    cwd: str
    pre: list[str] | None = None  # run as root between prlimit and setpriv (the seccomp loader, for unshare)


def chain(cfg: SandboxConfig, proc: Proc) -> list[str]:
    """prlimit (as root, so hard limits can be set) -> setpriv (drop to the run's uid) -> env -i (clean env)."""
    out = [tool("prlimit"), *prlimit_args(cfg), "--", *(proc.pre or [])]
    if proc.uid is not None:
        out += [
            tool("setpriv"),
            f"--reuid={proc.uid}",
            f"--regid={proc.uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    return out + [tool("env"), "-i", "-C", proc.cwd, *[f"{k}={v}" for k, v in proc.env.items()], *proc.argv]


def inner_script(
    cfg: SandboxConfig,
    box: str,
    work: str,
    tmp: str,
    inputs: str,
    main: Proc,
    companion: Proc | None = None,
    close_fds: tuple[int, ...] = (),
    result_fd: int | None = None,
    runner: str = "",
    rpc_dir: str = "",
    rpc: tuple[int, int] = (7, 8),
) -> str:
    """The script's text. `close_fds` (the launch's own fds: bwrap args, seccomp program) are closed before
    anything untrusted starts; `result_fd` is closed for the companion only."""
    q = shlex.quote
    # dash redirects single-digit fds only; bwrap closes its own fds, and the solution harness closes every fd
    # but its pipes before any solution code runs, so the larger ones are covered there.
    lines = [f"exec {n}<&-" for n in close_fds if n <= 9]
    lines += [
        f"mkdir -p {q(work)} {q(tmp)}",
        f"if [ -d {q(inputs)}/files ]; then cp -R {q(inputs)}/files/. {q(work)}/; fi",
    ]
    owner = companion.uid if companion is not None else main.uid
    if owner is not None:
        # The box itself stays root's, world-writable and sticky (like /tmp): the run may create files there, but
        # cannot rename or replace what root made in it (the test process's home and the FIFO dir below).
        lines.append(f"chown -R {owner}:{owner} {q(work)} {q(tmp)}")
        lines.append(f"chown 0:0 {q(box)} && chmod 1777 {q(box)}")
    if companion is None:
        return "\n".join(lines + ["exec " + shlex.join(chain(cfg, main))]) + "\n"
    a, b = rpc
    lines += [f"mkdir -m 700 {q(runner)} {q(rpc_dir)}", f"mkfifo -m 600 {q(rpc_dir)}/q {q(rpc_dir)}/r"]
    if main.uid is not None:
        lines.append(f"chown {main.uid}:{main.uid} {q(runner)}")
    close_result = f" {result_fd}>&-" if result_fd is not None and result_fd <= 9 else ""
    # Both open q first, then r, so neither blocks the other; the companion's opens happen in its own subshell.
    lines.append(
        f"{shlex.join(chain(cfg, companion))} {a}<{q(rpc_dir)}/q {b}>{q(rpc_dir)}/r{close_result} </dev/null &"
    )
    lines.append(f"exec {shlex.join(chain(cfg, main))} {a}>{q(rpc_dir)}/q {b}<{q(rpc_dir)}/r")
    return "\n".join(lines) + "\n"
