"""OpenEnvTextEnv against a hostile OpenEnv server: whatever the server does to the connection or writes in its
replies, `env.rollout` (called directly, as the warm start, RISED profiles, insights and scripted play call it)
returns a failed trajectory that says why, within its time bound, and never raises.

The server is a raw WebSocket peer on 127.0.0.1 (asyncio streams, the handshake and frames written by hand), so
it can do what a real library would never do: cut a frame, reset the connection, half-close it, announce a frame
larger than any cap. Every handler ends by itself (a deadline on each connection), and the server is closed at the
end of each test.
"""

import asyncio
import base64
import hashlib
import json
import re
import socket
import struct
import time

import pytest

from posttrain.bounded import truncate_text
from posttrain.envs.openenv_client import OpenEnvClient, OpenEnvTextEnv
from posttrain.models.tiny import tiny_tokenizer
from posttrain.sampling.openai_sampler import OpenAISamplerError
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams

TIMEOUT_S = 1.0  # the env's per-call timeout in these tests
BOUND_S = 4 * TIMEOUT_S  # connect + one call past its timeout + close: what one hostile episode may take at most
HANDLER_S = 10.0  # a server connection ends by itself after this, whatever the client does
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
GOOD = {"type": "observation", "data": {"observation": {"prompt": "Say a word."}, "reward": 0.0, "done": False}}


# ------------------------------------------------------------------------------------------------ a raw WS peer

def frame(payload: bytes, opcode: int = 1, claimed: int | None = None) -> bytes:
    """One unmasked server frame; `claimed` announces another payload length than the bytes that follow."""
    n = len(payload) if claimed is None else claimed
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + n.to_bytes(2, "big")
    else:
        head += bytes([127]) + n.to_bytes(8, "big")
    return head + payload


def text(obj) -> bytes:
    return frame(json.dumps(obj).encode())


async def handshake(reader, writer) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    key = re.search(rb"(?i)sec-websocket-key:\s*(\S+)", head).group(1)
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    await writer.drain()


async def read_message(reader) -> dict | None:
    """The client's next text message (control frames skipped); None on a close frame."""
    while True:
        b0, b1 = await reader.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(await reader.readexactly(2), "big")
        elif n == 127:
            n = int.from_bytes(await reader.readexactly(8), "big")
        mask = await reader.readexactly(4) if b1 & 0x80 else b""
        data = await reader.readexactly(n)
        if mask:
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(data))
        if b0 & 0x0F == 8:
            return None
        if b0 & 0x0F == 1:
            return json.loads(data)


async def linger(reader) -> None:
    """Stay connected, answering nothing, until the client goes (or the handler's deadline)."""
    while await reader.read(65536):
        pass


def rst(writer) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends RST, not FIN
    writer.transport.abort()


async def cut(reader, writer):
    writer.write(frame(b'{"type": "obs', claimed=200))  # the header promises 200 bytes; 13 come
    await writer.drain()
    writer.close()


async def reset(reader, writer):
    rst(writer)


async def half_close(reader, writer):
    writer.write_eof()  # FIN on our side: the client reads end of stream, no close frame
    await linger(reader)


async def oversized(reader, writer):
    writer.write(frame(b"x" * 1024, claimed=64 << 20))  # announces 64 MiB, then stalls: refuse it at the header
    await writer.drain()
    await linger(reader)


async def stall(reader, writer):
    await linger(reader)


async def stall_mid_frame(reader, writer):
    writer.write(frame(b'{"type": "obs', claimed=100))
    await writer.drain()
    await linger(reader)


def send(payload: bytes):
    async def act(reader, writer):
        writer.write(payload)
        await writer.drain()
        await linger(reader)
    return act


ACTIONS = {
    "cut_frame": (cut, "connection"),
    "reset": (reset, "connection"),
    "half_close": (half_close, "connection"),
    "oversized_frame": (oversized, "1048576"),
    "stall": (stall, "no answer within"),
    "stall_mid_frame": (stall_mid_frame, "no answer within"),
    "invalid_json": (send(frame(b"{not json")), "unreadable reply"),
    "invalid_utf8": (send(frame(b'{"a": "\xff\xfe"}')), "UTF-8"),
    "binary_frame": (send(frame(b"\x00\xff", opcode=2)), "UTF-8"),
    "not_an_object": (send(text([1, 2, 3])), "not a JSON object"),
    "data_not_an_object": (send(text({"type": "observation", "data": [1, 2]})), "data"),
    "reward_not_a_number": (send(text({"type": "observation", "data": {"observation": "hi", "reward": "lots",
                                                                       "done": False}})), "reward"),
    "reward_too_large": (send(frame(b'{"type": "observation", "data": {"reward": 1e999, "done": false}}')),
                         "unreadable reply"),
    "done_not_a_bool": (send(text({"type": "observation", "data": {"observation": "hi", "done": "no"}})), "done"),
    "reply_to_another_request": (send(text({"type": "state", "data": {"step_count": 0}})), "'state'"),
    "error_reply": (send(text({"type": "error", "data": {"message": "boom", "code": "E1"}})), "boom"),
    "bad_chat_messages": (send(text({"type": "observation", "data": {
        "observation": {"task_prompt": [{"role": "user", "content": 5}]}, "done": False}})), "task_prompt"),
}


class HostilePeer:
    """Answers the first `at` requests well, then does `action` (to the request after them)."""

    def __init__(self, action, at: int):
        self.action, self.at = action, at
        self.server = None

    async def _session(self, reader, writer):
        await handshake(reader, writer)
        for _ in range(self.at):
            if await read_message(reader) is None:
                return
            writer.write(text(GOOD))
            await writer.drain()
        if await read_message(reader) is not None:
            await self.action(reader, writer)

    async def _handle(self, reader, writer):
        try:
            await asyncio.wait_for(self._session(reader, writer), HANDLER_S)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.transport.abort()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def env_for(url, tok, **kw):
    return OpenEnvTextEnv(url, tok, SampleParams(max_tokens=8), max_turns=3, timeout_s=TIMEOUT_S, **kw)


async def timed_rollout(env, tok):
    t0 = time.monotonic()
    traj = await env.rollout({"prompt": ""}, ScriptedSampler(tok, ["apple"]))  # directly, no safe_rollout
    return traj, time.monotonic() - t0


# ------------------------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("at", [0, 1], ids=["on_reset", "on_step"])
@pytest.mark.parametrize("case", list(ACTIONS))
def test_hostile_reply_fails_the_episode_with_a_reason(tok, case, at):
    action, reason = ACTIONS[case]

    async def go():
        async with HostilePeer(action, at) as url:
            return await timed_rollout(env_for(url, tok), tok)

    traj, took = run(go())
    assert traj.failed and not traj.passed and traj.reward == 0.0
    assert reason in traj.error, traj.error
    assert took < BOUND_S, f"{case}: {took:.1f}s"
    assert len(traj.turns) == at or (at == 0 and traj.turns[0].completion_ids == [])


def test_oversized_frame_is_refused_at_its_header(tok):
    """The frame announces 64 MiB and sends 1 KiB: the websocket library refuses it at the header (max_size is the
    JSON cap), instead of waiting to buffer it; the reason names the cap, not a timeout."""
    async def go():
        async with HostilePeer(oversized, 0) as url:
            return await timed_rollout(env_for(url, tok), tok)

    traj, took = run(go())
    assert traj.failed and "larger than 1048576 bytes, refused unread" in traj.error, traj.error
    assert "67108864" in traj.error and took < BOUND_S


def test_no_server_and_a_non_websocket_server_fail_the_episode(tok):
    async def refuse_upgrade(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def go():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()  # nothing listens on this port now
        no_server = await timed_rollout(env_for(f"http://127.0.0.1:{port}", tok), tok)
        server = await asyncio.start_server(refuse_upgrade, "127.0.0.1", 0)
        async with server:
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            not_ws = await timed_rollout(env_for(url, tok), tok)
        return no_server, not_ws

    for traj, took in run(go()):
        assert traj.failed and "cannot connect" in traj.error, traj.error
        assert took < BOUND_S


def test_long_observations_are_cut_with_a_visible_marker(tok):
    long_obs = {"type": "observation", "data": {"observation": {"prompt": "y" * 50_000}, "reward": 1.0,
                                                "done": False}}

    async def go():
        async with HostilePeer(send(text(long_obs)), 0) as url:
            sampler = ScriptedSampler(tok, ["apple"])
            await env_for(url, tok, max_observation_chars=100).rollout({"prompt": ""}, sampler)
            return sampler

    sampler = run(go())
    shown = tok.decode(sampler.prompts[0])
    cut, n = truncate_text("y" * 50_000, 100)  # the rule ToolEnv and GymTextEnv cut with
    assert n > 49_900 and cut in shown and "y" * 100 not in shown
    assert OpenEnvTextEnv("http://x", tok, SampleParams()).max_observation_chars == 8000


def test_the_sampler_stopping_still_stops_the_run(tok):
    """Only the env's transport is the episode's failure: an infrastructure error of the sampler propagates."""

    class DeadSampler:
        policy_version = 0
        context = None

        async def sample(self, prompts, params, n=1):
            raise OpenAISamplerError("the sampler server stopped answering")

    async def go():
        async with HostilePeer(stall, 5) as url:
            await env_for(url, tok).rollout({"prompt": ""}, DeadSampler())

    with pytest.raises(OpenAISamplerError):
        run(go())


def test_http_get_is_bounded(tok):
    """GET /health and friends: a reply over the cap, or one that is not JSON, is an OpenEnvError."""
    from posttrain.envs.openenv_client import OpenEnvError

    async def serve_http(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        body = b"[" * 10 if b"/bad" in head else b'"' + b"x" * (2 << 20) + b'"'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    async def go():
        server = await asyncio.start_server(serve_http, "127.0.0.1", 0)
        async with server:
            client = OpenEnvClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", timeout_s=TIMEOUT_S)
            errors = []
            for path in ("/big", "/bad"):
                with pytest.raises(OpenEnvError) as e:
                    await client.get(path)
                errors.append(str(e.value))
            return errors

    big, bad = run(go())
    assert "larger than" in big and "unreadable" in bad


def test_an_episode_that_outgrows_the_context_ends_with_a_context_stop(tok):
    """Issue #52: a well-behaved server whose conversation grows past the sampler's context: the episode ends
    with stop_reason "context", its last turn truncated, kept (not failed) with its rewards so far."""
    from posttrain.sampling.context import ContextBudget

    async def go():
        async with HostilePeer(send(text(GOOD)), 40) as url:
            env = OpenEnvTextEnv(url, tok, SampleParams(max_tokens=8), max_turns=30, timeout_s=TIMEOUT_S)
            sampler = ScriptedSampler(tok, ["apple"], context=ContextBudget(200))
            return await env.rollout({"prompt": ""}, sampler)

    traj = run(go())
    assert not traj.failed, traj.error
    assert traj.stop_reason == "context" and traj.turns[-1].finish_reason == "length"
    assert 2 <= len(traj.turns) < 30 and traj.metrics["context_stop"] == 1.0
    assert all(len(t.prompt_ids) + 8 <= 200 for t in traj.turns)
