"""One vLLM server of a VLLMServerPool (cluster/vllm_servers.py) from the outside: starting it (its command line,
the in-process engine's settings as vLLM's CLI spells them; its environment; its share of the cores; the wait
until it answers; the process runs under server_processes.py's watchdog, in a process group of its own), and the
wire format of its token-in/token-out endpoint (`generate_body`, `completion_from_choice`).

A server listens on a Unix socket in the pool's private directory (`--uds`, cluster/server_sockets.py), never on a
TCP port: vLLM's --api-key leaves /collective_rpc and the other control routes open, a directory of mode 0700 does
not. The directory is also its TMPDIR and VLLM_RPC_BASE_PATH (vLLM's sockets between its own processes, and its
rendezvous file, go there), and its gloo groups listen on the loopback interface alone (GLOO_SOCKET_IFNAME=lo: the
host name can resolve to an address other hosts reach).
"""

from __future__ import annotations

import getpass
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from posttrain.cluster.group_shm import mapped_by_group
from posttrain.cluster.server_processes import Server, ServerFailed, kill_group, log_tail, spawn_supervised
from posttrain.cluster.server_sockets import SocketDir
from posttrain.sampling.vllm_common import EngineSpec, token_versions
from posttrain.types import Completion, SampleParams

# Environment every server gets. DEV_MODE exposes /collective_rpc, /reset_prefix_cache, /pause, /resume and the
# weight-version endpoints that a push needs.
SERVER_ENV = {
    "VLLM_SERVER_DEV_MODE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "VLLM_CONFIGURE_LOGGING": "1",
}
# Where a server's own gloo groups listen (vLLM's world-size-1 groups, posttrain's weight group): every member is on
# this host. Without it torch binds the address the host name resolves to, which other hosts may reach.
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo"}
# The server (vllm_server_launch's tests put a stand-in in its place).
SERVER_COMMAND = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
# Set by the in-process engine (vllm_common.IN_PROCESS_ENV) when both run in one trainer process; a server must not
# inherit them (its API server talks to an engine-core process).
_IN_PROCESS_ONLY = ("VLLM_ENABLE_V1_MULTIPROCESSING",)


# Boolean settings whose `--no-x` form the server accepts; any other False is left out (a store_true flag such as
# --disable-log-stats has no --no- form, and leaving it out is what False means).
_NEGATABLE = {"enable_prefix_caching", "enforce_eager", "enable_lora", "enable_sleep_mode", "trust_remote_code"}


def server_args(spec: EngineSpec, cpu: bool) -> list[str]:
    """The server's command-line flags: the same settings the in-process engine gets (`EngineSpec.llm_kwargs`),
    written as vLLM's CLI spells them (`--x v`, booleans as `--x` / `--no-x`, dicts as JSON)."""
    args: list[str] = []
    for key, value in spec.llm_kwargs(cpu).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value or key in _NEGATABLE:
                args.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            args += [flag, json.dumps(value)]
        elif value is not None:
            args += [flag, str(value)]
    return args


def vllm_installed() -> bool:
    """Whether a server can start: vLLM importable (looked up, not imported: the trainer's process never imports it)."""
    return importlib.util.find_spec("vllm") is not None


def ties_embeddings(model_dir: str) -> bool:
    """Whether the served model's config ties the output layer to the embedding (HF's default is to tie)."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(cfg.get("tie_word_embeddings", cfg.get("text_config", {}).get("tie_word_embeddings", True)))


def split(n: int, k: int) -> list[tuple[int, int]]:
    """[start, stop) spans cutting n rows into k contiguous, near-equal shares (empty ones dropped)."""
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def server_cores(rank: int, num_servers: int, cpu: bool) -> str | None:
    """CPU build, several servers: server `rank`'s share of this process's cores (vLLM's CPU worker otherwise
    binds every server's threads to the same cores of a NUMA node). None: vLLM's own binding."""
    if not cpu or num_servers == 1:
        return None
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < num_servers:
        return "nobind" if cores else None
    a, b = split(len(cores), num_servers)[rank]
    return ",".join(str(c) for c in cores[a:b])


def spawn_server(
    spec: EngineSpec,
    cpu: bool,
    rank: int,
    incarnation: int,
    num_servers: int,
    logs_dir: Path,
    cwd: Path,
    extra_env: dict[str, str],
    extra_flags: list[str],
    sockets: SocketDir,
) -> Server:
    """A server process (not yet ready) listening on its socket in `sockets`, in its own process group under the
    watchdog (which removes `sockets` if this process disappears), logging to a file."""
    socket = sockets.socket_for(rank, incarnation)
    log_path = logs_dir / f"server{rank}.{incarnation}.log"
    cmd = [*SERVER_COMMAND, "--uds", str(socket), "--enable-scale-out", *server_args(spec, cpu), *extra_flags]
    env = server_env(sockets.path, extra_env)
    cores = server_cores(rank, num_servers, cpu)
    if cores and "VLLM_CPU_OMP_THREADS_BIND" not in env:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    return spawn_supervised(cmd, env, socket, log_path, cwd=cwd, private_dir=sockets.path)


def server_env(private: Path, extra_env: dict[str, str]) -> dict[str, str]:
    """A server's environment: this process's (less the in-process engine's settings), SERVER_ENV, the private
    directory as its temporary and vLLM's socket directory, gloo on loopback; `extra_env` (the caller's) last."""
    env = {k: v for k, v in os.environ.items() if k not in _IN_PROCESS_ONLY}
    env.update(SERVER_ENV)
    # torch's compile cache stays where it was (it lives under the temporary directory by default): a private one
    # would build it again at every start
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", _inductor_cache())
    env.update({"TMPDIR": str(private), "VLLM_RPC_BASE_PATH": str(private), **LOOPBACK_ENV})
    env.update(extra_env)
    return env


def _inductor_cache() -> str:
    """torch's default compile cache of this process (torch/_inductor/runtime/cache_dir_utils.py default_cache_dir)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def wait_ready(server: Server, http: httpx.Client, deadline: float, start_timeout_s: float) -> None:
    """Until /health answers 200; a server that exits, or is not up by `deadline` (time.monotonic), fails with the
    end of its log."""
    while True:
        if not server.alive():
            raise ServerFailed(
                f"vLLM server on {server.socket} exited during start (code "
                f"{server.proc.returncode}); end of {server.log_path}:\n{log_tail(server.log_path)}"
            )
        try:
            if http.get(server.url + "/health", timeout=2.0).status_code == 200:
                # what it maps in /dev/shm once up (its broadcast queues): removed when it is gone, even when its
                # whole group was killed at once and nothing of it is left to ask (server_processes.kill_group)
                server.shm |= mapped_by_group(server.pgid)
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            kill_group(server)
            raise ServerFailed(
                f"vLLM server on {server.socket} did not start in {start_timeout_s:g}s; "
                f"end of {server.log_path}:\n{log_tail(server.log_path)}"
            )
        time.sleep(0.5)


def version_label(v: Any) -> int:
    """A server's weight-version label as our version; vLLM's "default" (the weights it started with) is -1."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1


def generate_body(prompt: list[int], n: int, params: SampleParams, stop_token_ids: list[int]) -> dict[str, Any]:
    """The request of `/inference/v1/generate` (enabled by --enable-scale-out): token ids in, n completions with the
    sampled tokens' processed log-probs and weight-version spans out. Never a per-request seed: it stops the CPU
    engine (vLLM 0.32); the servers are seeded at start."""
    sp: dict[str, Any] = {
        "n": n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k else -1,
        "stop_token_ids": stop_token_ids,
        "logprobs": 0,
        "skip_special_tokens": True,
    }
    if params.stop:
        sp["stop"] = list(params.stop)
    return {"token_ids": [int(t) for t in prompt], "sampling_params": sp, "output_mode": "text"}


def completion_from_choice(choice: dict[str, Any], served_version: int) -> Completion:
    """One choice of the reply as a Completion; ValueError when its log-probs do not match its tokens. A token no
    version span covers gets -2, never a pushed version: an engine that stops stamping is caught, not trusted. A
    completion without tokens has nothing to check and takes `served_version`."""
    ids = [int(t) for t in choice.get("token_ids") or []]
    content = (choice.get("logprobs") or {}).get("content") or []
    logps = [float(c["logprob"]) for c in content]
    if len(logps) != len(ids):
        raise ValueError(f"vLLM returned {len(logps)} log-probs for {len(ids)} tokens")
    versions = token_versions(choice.get("weight_versions"), len(ids), -2)
    return Completion(
        token_ids=ids,
        logprobs=logps,
        finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
        policy_version=versions[0] if versions else served_version,
        token_versions=versions or None,
        text=choice.get("text") or "",
    )
