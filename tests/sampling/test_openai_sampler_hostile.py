"""OpenAISampler against a hostile OpenAI-compatible server: every way the server can fail a request ends in an
error that names what was wrong, within the time bound, and of the right kind:

* the server stopped answering (refused, reset, half-closed, cut body, stalled, trickling, 5xx): retried, then
  OpenAISamplerError, which `is_infrastructure` and stops the run (envs/isolate.py);
* one malformed reply (too large, not JSON, the wrong shape, logprobs that do not match or are not finite, token
  ids of the wrong type or outside the vocabulary): not retried, an error that is not infrastructure, so
  `safe_rollout` fails that sample alone.

The server is raw asyncio streams on 127.0.0.1, one request per connection; every connection ends by itself (a
deadline), and the server is closed at the end of each test.
"""

import asyncio
import json
import re
import socket
import struct
import time

import pytest

from posttrain.envs.isolate import is_infrastructure, safe_rollout
from posttrain.sampling.openai_sampler import OpenAISampler, OpenAISamplerError
from posttrain.types import SampleParams

TIMEOUT_S = 0.5
BOUND_S = 4.0  # two attempts past their timeout and a backoff, with room: what one hostile request may take
HANDLER_S = 10.0  # a server connection ends by itself after this
VOCAB = 100


class FakeTokenizer:
    """The sampler needs only the vocabulary's size (len) to check token ids."""

    def __len__(self):
        return VOCAB


# ------------------------------------------------------------------------------------------------ a raw peer

def good_body(req: dict) -> dict:
    k, n = len(req["prompt"]), req["n"]
    return {"choices": [{"index": i, "text": "hi", "finish_reason": "stop", "token_ids": [5, 6],
                         "logprobs": {"token_logprobs": [-0.5, -0.25]}} for i in range(k * n)]}


def http(body: bytes, status: str = "200 OK", length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


async def linger(reader):
    while await reader.read(65536):
        pass


def answer(make):
    """Answer with `make(request)`: bytes as the whole HTTP body, or a dict made from the good body."""
    async def act(reader, writer, req):
        body = make(req)
        writer.write(http(body if isinstance(body, bytes) else json.dumps(body).encode()))
        await writer.drain()
    return act


def changed(fn):
    def make(req):
        body = good_body(req)
        fn(body)
        return body
    return make


def choice(**kw):
    return changed(lambda b: b["choices"][0].update(kw))


def logprobs(values):
    return choice(logprobs={"token_logprobs": values})


async def reset(reader, writer, req):
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def half_close(reader, writer, req):
    writer.write_eof()
    await linger(reader)


async def cut_body(reader, writer, req):
    writer.write(http(b'{"choices": [', length=1000))
    await writer.drain()
    writer.close()


async def stall(reader, writer, req):
    await linger(reader)


async def trickle(reader, writer, req):
    """Headers, then one byte at a time, each well inside a read timeout: only a deadline on the whole request
    stops this."""
    writer.write(http(b"", length=100_000))
    for _ in range(int(HANDLER_S / 0.05)):
        writer.write(b" ")
        await writer.drain()
        await asyncio.sleep(0.05)


async def busy(reader, writer, req):
    writer.write(http(b'{"error": "busy"}', status="503 Service Unavailable"))
    await writer.drain()


async def not_found(reader, writer, req):
    writer.write(http(b'{"error": "no such route"}', status="404 Not Found"))
    await writer.drain()


async def huge_declared(reader, writer, req):
    writer.write(http(b"{", length=10 << 30))  # announces 10 GiB: refuse it at the header
    await writer.drain()
    await linger(reader)


async def huge_streamed(reader, writer, req):
    """No length announced (chunked): 16 MiB of a JSON string, as fast as the client reads."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    writer.write(b'1\r\n"\r\n')
    for _ in range(256):
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
    writer.write(b'1\r\n"\r\n0\r\n\r\n')
    await writer.drain()


INFRASTRUCTURE = {
    "reset": (reset, "after 2 attempts"),
    "half_close": (half_close, "after 2 attempts"),
    "cut_body": (cut_body, "after 2 attempts"),
    "stall": (stall, "timeout"),
    "trickle": (trickle, "timeout"),
    "503": (busy, "HTTP 503"),
    "no_token_ids": (answer(choice(token_ids=None)), "return_token_ids"),
    "no_logprobs": (answer(choice(logprobs=None)), "logprobs: 0"),
    "404": (not_found, "no such route"),
}

MALFORMED = {
    "huge_declared": (huge_declared, "larger than"),
    "huge_streamed": (huge_streamed, "larger than"),
    "invalid_json": (answer(lambda r: b"{not json"), "not JSON"),
    "not_utf8": (answer(lambda r: b'{"choices": "\xff"}'), "not JSON"),
    "too_deep": (answer(lambda r: b"[" * 100_000), "not JSON"),
    "nan_logprob": (answer(lambda r: json.dumps(good_body(r)).replace("-0.25", "NaN").encode()), "NaN"),
    "not_an_object": (answer(lambda r: [1, 2]), "not a JSON object"),
    "choices_not_a_list": (answer(lambda r: {"choices": "abc"}), "choices"),
    "choice_not_an_object": (answer(lambda r: {"choices": [5]}), "choice"),
    "too_many_choices": (answer(changed(lambda b: b["choices"].append(dict(b["choices"][0], index=1)))),
                         "expected 1 choices"),
    "index_out_of_range": (answer(choice(index=7)), "indices"),
    "logprob_count": (answer(logprobs([-0.5])), "1 logprobs for 2 tokens"),
    "logprob_not_a_number": (answer(logprobs(["-0.5", -0.25])), "logprob"),
    "logprobs_not_a_list": (answer(logprobs("lots")), "logprob"),
    "token_id_out_of_vocab": (answer(choice(token_ids=[5, VOCAB])), "vocabulary"),
    "token_id_negative": (answer(choice(token_ids=[-1, 6])), "vocabulary"),
    "token_id_a_string": (answer(choice(token_ids=[5, "6"])), "token id"),
    "token_id_a_float": (answer(choice(token_ids=[5, 6.0])), "token id"),
    "token_id_a_bool": (answer(choice(token_ids=[5, True])), "token id"),
    "too_many_tokens": (answer(choice(token_ids=[5] * 9, logprobs={"token_logprobs": [-0.5] * 9})), "max_tokens"),
    "text_not_a_string": (answer(choice(text=5)), "text"),
    "bad_policy_version": (answer(changed(lambda b: b.update(policy_version="new"))), "policy_version"),
}


class Peer:
    def __init__(self, act):
        self.act, self.requests, self.server = act, 0, None

    async def _serve(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        m = re.search(rb"(?i)content-length:\s*(\d+)", head)
        body = await reader.readexactly(int(m.group(1))) if m else b""
        self.requests += 1
        await self.act(reader, writer, json.loads(body) if body else {})

    async def _handle(self, reader, writer):
        try:
            await asyncio.wait_for(self._serve(reader, writer), HANDLER_S)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.transport.abort()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def sampler(url, **kw):
    return OpenAISampler(url, **{"model": "m", "tokenizer": FakeTokenizer(), "timeout_s": TIMEOUT_S,
                                 "max_retries": 1, "backoff_s": 0.01, **kw})


async def failing_sample(act, **kw):
    """-> (the exception sample() raised, seconds it took, requests the server saw)."""
    async with Peer(act) as peer:
        s = sampler(peer.url, **kw)
        t0 = time.monotonic()
        try:
            await s.sample([[1, 2]], SampleParams(max_tokens=4), n=1)
        except Exception as e:  # noqa: BLE001 - what it raised is what the test checks
            return e, time.monotonic() - t0, peer.requests
        finally:
            await s.close()
    raise AssertionError("sample() returned for a hostile reply")


# ------------------------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("case", list(INFRASTRUCTURE))
def test_a_server_that_stopped_answering_is_infrastructure(case):
    act, reason = INFRASTRUCTURE[case]
    e, took, _ = run(failing_sample(act))
    assert isinstance(e, OpenAISamplerError) and is_infrastructure(e), repr(e)
    assert reason in str(e), str(e)
    assert took < BOUND_S, f"{case}: {took:.1f}s"


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_reply_fails_that_sample_alone(case):
    act, reason = MALFORMED[case]
    e, took, requests = run(failing_sample(act))
    assert isinstance(e, ValueError) and not is_infrastructure(e), repr(e)
    assert reason in str(e), str(e)
    assert requests == 1  # not retried: the reply was read, and it was wrong
    assert took < BOUND_S, f"{case}: {took:.1f}s"


def test_an_oversized_body_is_refused_before_it_is_read_whole():
    e, took, _ = run(failing_sample(huge_declared))
    assert "10737418240" in str(e) and took < TIMEOUT_S  # at the header: no wait for the body


def test_connection_refused_is_infrastructure():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()

    async def go():
        s = sampler(f"http://127.0.0.1:{port}")
        with pytest.raises(OpenAISamplerError, match="after 2 attempts") as e:
            await s.sample([[1, 2]], SampleParams(max_tokens=4))
        await s.close()
        return e.value

    assert is_infrastructure(run(go()))


def test_a_models_list_of_the_wrong_shape_is_a_clear_error():
    async def go():
        async with Peer(answer(lambda r: {"data": [{"name": "m"}]})) as peer:
            s = sampler(peer.url, model=None)
            with pytest.raises(OpenAISamplerError, match="/models") as e:
                await s.sample([[1, 2]], SampleParams(max_tokens=4))
            await s.close()
            return e.value

    assert is_infrastructure(run(go()))


def test_a_well_formed_reply_still_samples():
    async def go():
        async with Peer(answer(lambda r: dict(good_body(r), policy_version=3))) as peer:
            s = sampler(peer.url)
            out = await s.sample([[1, 2]], SampleParams(max_tokens=4), n=1)
            await s.close()
            return out

    (c,), = run(go())
    assert c.token_ids == [5, 6] and c.logprobs == [-0.5, -0.25] and c.text == "hi" and c.policy_version == 3


class OneSampleEnv:
    """The shape of SingleTurnEnv's rollout, without a model: one sample call, its tokens the trajectory."""

    async def rollout(self, row, sampler, params=None):
        from posttrain.types import Trajectory, Turn

        (c,), = await sampler.sample([[1, 2]], SampleParams(max_tokens=4), n=1)
        return Trajectory(turns=[Turn([1, 2], c.token_ids, c.logprobs, c.policy_version)], row=row)


def test_safe_rollout_fails_the_sample_on_a_malformed_reply_and_stops_on_a_dead_server():
    async def go(act):
        async with Peer(act) as peer:
            s = sampler(peer.url)
            try:
                return await safe_rollout(OneSampleEnv(), {"prompt": "p"}, s)
            finally:
                await s.close()

    traj = run(go(answer(choice(token_ids=[5, VOCAB]))))
    assert traj.failed and traj.failed_in == "rollout" and "vocabulary" in traj.error
    with pytest.raises(OpenAISamplerError):
        run(go(reset))
