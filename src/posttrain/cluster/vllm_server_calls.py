"""The HTTP calls a VLLMServerPool (cluster/vllm_servers.py) makes to one of its servers: a share of rows sampled
on the token-in/token-out endpoint (identical rows as one request with n completions) and the control calls of a
push (pause, load, reset the prefix cache, set and check the version label, resume), a failure raised as
`ServerFailed` and a request the server refuses as `RequestRejected`. Separate from the pool, which decides which
server gets which rows and what to do when one fails; the wire format itself is vllm_server_launch.py's."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, cast

import httpx

from posttrain.cluster.server_processes import Server, ServerFailed, Slot
from posttrain.cluster.vllm_server_launch import completion_from_choice, generate_body, version_label
from posttrain.sampling.constrained import vllm_structured
from posttrain.sampling.weight_gate import WeightGate
from posttrain.types import Completion, SampleParams


class RequestRejected(RuntimeError):
    """The server refused the request itself (HTTP 4xx): the caller's request is wrong, retrying cannot help."""


# ---- sampling ----------------------------------------------------------------------------------------------------
async def sample_on(
    client: httpx.AsyncClient,
    slot: Slot,
    rows: list[list[int]],
    params: SampleParams,
    stop_token_ids: list[int],
    timeout_s: float,
    served_version: Callable[[], int],
) -> tuple[Server, Any]:
    """(the server called, its completions or the failure): the server says which incarnation failed.
    Identical rows go as one request with n completions, so a prompt repeated G times is prefilled once."""
    server = slot.server
    if not server.alive():
        return server, ServerFailed(f"server {slot.rank} ({server.socket.name}) is dead")
    uniq: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rows):
        uniq.setdefault(tuple(r), []).append(i)
    parts = await asyncio.gather(
        *(
            generate(client, server, list(p), len(idx), params, stop_token_ids, timeout_s, served_version)
            for p, idx in uniq.items()
        ),
        return_exceptions=True,
    )
    for e in parts:  # a bad request first: it is the caller's to fix, whatever else failed
        if isinstance(e, RequestRejected):
            return server, e
    for e in parts:
        if isinstance(e, BaseException):
            return server, e if isinstance(e, ServerFailed) else ServerFailed(f"{type(e).__name__}: {e}")
    out: list[Completion | None] = [None] * len(rows)
    for idx, comps in zip(uniq.values(), cast("list[list[Completion]]", parts)):  # no error, checked above
        for i, c in zip(idx, comps):
            out[i] = c
    return server, out


async def generate(
    client: httpx.AsyncClient,
    server: Server,
    prompt: list[int],
    n: int,
    params: SampleParams,
    stop_token_ids: list[int],
    timeout_s: float,
    served_version: Callable[[], int],
) -> list[Completion]:
    """`n` completions of `prompt` from `server`; `served_version()`, read when the answer arrives, is the version
    of a completion without tokens (vllm_server_launch.completion_from_choice)."""
    body = generate_body(prompt, n, params, stop_token_ids)
    if params.constraint is not None:  # vLLM's structured outputs; its log-probs are then of the masked distribution
        body["sampling_params"]["structured_outputs"] = vllm_structured(params.constraint)
    try:
        r = await client.post(f"{server.url}/inference/v1/generate", json=body)
    except httpx.TimeoutException:
        raise ServerFailed(f"no answer from {server.url} in {timeout_s:g}s (hung)") from None
    except httpx.TransportError as e:
        raise ServerFailed(f"{server.url}: {type(e).__name__}: {e}") from None
    if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
        raise RequestRejected(f"vLLM server refused the request: HTTP {r.status_code}: {r.text[:500]}")
    if r.status_code != 200:
        raise ServerFailed(f"{server.url}: HTTP {r.status_code}: {r.text[:300]}")
    choices = sorted(r.json().get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != n:
        raise ServerFailed(f"{server.url} returned {len(choices)} completions, asked for {n}")
    try:
        return [completion_from_choice(c, served_version()) for c in choices]
    except ValueError as e:  # a malformed reply is the server's failure
        raise ServerFailed(f"{server.url}: {e}") from None


# ---- control -----------------------------------------------------------------------------------------------------
def sync_server(
    http: httpx.Client,
    server: Server,
    load: Any,
    in_flight: bool,
    files: WeightGate,
    label: Callable[[], int],
) -> None:
    """One server: pause, `load(server)` (None: keep its weights, only relabel), reset the prefix cache, set
    and check the version label (`label()`, read with the weights under `files`' read lock), resume. A waiting
    pause lets in-flight requests finish on the old weights (new ones wait); in flight, generation stops between
    tokens and the requests in flight are kept: they continue on the new weights (their KV recomputed, since the
    reset preempts them), every token stamped with the version that sampled it. Raises ServerFailed."""
    request(http, "POST", server, "/pause", params={"mode": "keep" if in_flight else "wait"})
    try:
        with files.read():  # the weights and the label read together: no push may write between
            if load is not None:
                load(server)
            current = label()
        reset = {"reset_running_requests": "true"} if in_flight else None
        for _ in range(5):  # fails while blocks are still held (a request being aborted): retry briefly
            if request(http, "POST", server, "/reset_prefix_cache", params=reset).get("success", True):
                break
            time.sleep(0.2)
        else:
            raise ServerFailed(f"{server.url}: the prefix cache could not be reset")
        request(http, "POST", server, "/update_weight_version", {"new_version": str(current)})
        served = request(http, "GET", server, "/weight_info").get("weight_version")
        if version_label(served) != current:
            raise ServerFailed(f"{server.url} reports weight version {served!r} after a push of {current}")
    finally:
        with contextlib.suppress(ServerFailed):
            request(http, "POST", server, "/resume")


def is_healthy(http: httpx.Client, server: Server) -> bool:
    try:
        return server.alive() and http.get(server.url + "/health", timeout=5.0).status_code == 200
    except httpx.HTTPError:
        return False


def request(
    http: httpx.Client,
    method: str,
    server: Server,
    path: str,
    body: Any = None,
    params: Any = None,
) -> dict[str, Any]:
    """One control call's JSON answer ({} when it has none); a dead server, a transport error or a status other than
    200 raises ServerFailed."""
    if not server.alive():
        raise ServerFailed(f"server {server.url} is dead")
    try:
        r = http.request(method, server.url + path, json=body, params=params)
    except httpx.HTTPError as e:
        raise ServerFailed(f"{method} {server.url}{path}: {type(e).__name__}: {e}") from None
    if r.status_code != 200:
        raise ServerFailed(f"{method} {server.url}{path} -> HTTP {r.status_code}: {r.text[:300]}")
    try:
        return r.json() if r.content else {}
    except ValueError:
        return {}
