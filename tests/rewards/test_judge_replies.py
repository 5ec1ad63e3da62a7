"""A judge's reply is hostile input: verdicts parsed strictly, no non-finite value ever scored or cached, one bad
reply fails its one sample, and a hostile HTTP peer (huge, cut, invalid, stalled replies) fails only the prompt
it answered, within the timeout. The hostile server binds 127.0.0.1 and every handler ends by itself."""

from __future__ import annotations

import gzip
import json
import math
import re
import socket
import sqlite3
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from judge_fakes import FakeBackend
from posttrain.rewards.judges import JudgeCache, JudgeRunner, OpenAIBackend, PairwiseJudge, PointwiseJudge
from posttrain.rewards.judges.backends import yes_no_from_text
from posttrain.rewards.judges.cache import cache_key
from posttrain.rewards.judges.errors import JudgeBadOutput, JudgeError, JudgeTimeout, JudgeUnavailable
from posttrain.rewards.judges.pointwise import parse_score
from posttrain.rewards.judges.ranking import parse_ranking
from posttrain.rewards.rubric import PartialRewardFailure, RewardComponent, Rubric

Q = "Reply: {completion}\nIs the reply fine? Answer Yes or No."
RATE = "Rate {completion} from 0 to 10."
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _runner(backend, cache=None, **kw):
    return JudgeRunner(backend, JudgeCache(None) if cache is None else cache, backoff_s=0.0, **kw)


# ------------------------------------------------------------------------------------------ 1. strict verdicts


def test_score_1e309_is_a_failure_not_a_tenth():
    j = PointwiseJudge(_runner(FakeBackend(text=lambda p: "score: 1e309")), RATE, mode="score")
    (out,) = j.score_all(["x"])
    assert isinstance(out, JudgeBadOutput), out
    assert "1e309" in str(out)


@pytest.mark.parametrize("text,value", [
    ("7", 0.7), ("7/10", 0.7), ("Score: 7/10", 0.7), ("score: 7.5", 0.75), ("**8**", 0.8), ("10", 1.0),
    ("0", 0.0), ("Rating = 3.", 0.3), ("9/10\nThe reply is clear.", 0.9), ("  6 / 10  ", 0.6)])
def test_score_verdicts_that_are_accepted(text, value):
    assert parse_score(text, 10) == pytest.approx(value)


@pytest.mark.parametrize("text", [
    "score: 1e309", "1e3", "1E1", "7 or 8", "-1", "11", "10.5", "nan", "inf", "Infinity", "7/100", "excellent! 9",
    "0x7", "\u0663", "7,5", "score: 7/10 (maybe 8)", "", "   ", "1" * 5000, "I would give it a 7", "7 7"],
    ids=lambda t: repr(t[:16]))
def test_score_verdicts_that_are_refused(text):
    with pytest.raises(JudgeBadOutput):
        parse_score(text, 10)


@pytest.mark.parametrize("value", [None, 7, 7.0, b"7", ["7"], {"score": 7}, float("nan"), 10**5000],
                         ids=["none", "int", "float", "bytes", "list", "dict", "nan", "huge_int"])
def test_score_verdict_that_is_not_text_is_refused(value):
    with pytest.raises(JudgeBadOutput):
        parse_score(value, 10)


@PROPS
@given(st.one_of(st.text(), st.text(alphabet="0123456789./: eE+-scoreSCORE*\n"), st.integers(), st.floats(),
                 st.none(), st.binary()))
@example(10**5000)
@example("score: 1e309")
def test_score_parser_is_total_and_accepts_only_finite_in_range(text):
    try:
        v = parse_score(text, 10)
    except JudgeBadOutput:
        return
    assert isinstance(v, float) and math.isfinite(v) and 0.0 <= v <= 1.0


@PROPS
@given(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["{!r}", "score: {!r}", "{:e}", "{:g}"]))
def test_a_score_is_the_number_written_or_refused(x, fmt):
    """Never a number other than the one the judge wrote (the old parser took the leading digit of 1e+20)."""
    try:
        v = parse_score(fmt.format(x), 10)
    except JudgeBadOutput:
        return
    assert math.isfinite(x) and 0 <= x <= 10 and v == pytest.approx(x / 10)


@pytest.mark.parametrize("text", ["Yes, but no", "Yes and no", "no yes", "Yesterday", "Nope", "", "maybe",
                                  "No. Actually yes."])
def test_yes_no_label_from_text_is_strict(text):
    assert yes_no_from_text(text) is None


@pytest.mark.parametrize("text,v", [("Yes", 1.0), (" no", 0.0), ("**Yes**", 1.0), ("'No'.", 0.0), ("YES!", 1.0)])
def test_yes_no_labels_accepted(text, v):
    assert yes_no_from_text(text) == v


@PROPS
@given(st.text(), st.sampled_from(["Yes", "No", "yes", "no"]), st.text(alphabet="abc 123,.!", min_size=1))
def test_yes_no_label_is_the_whole_answer(text, label, tail):
    assert yes_no_from_text(text) in (None, 0.0, 1.0)
    assert yes_no_from_text(f"{label} {tail}") is None or not tail.strip(" ,.!")


@pytest.mark.parametrize("text", ["1 > 2 > 3 > 3", "3 > 1 > 2 and 4", "1 > 2 > 3 > 4", "[1] is best, then 2 and 3",
                                  "1.5 > 2 > 3", "9" * 5000, "1 > 2 > 03"], ids=range(7))
def test_ranking_is_strict(text):
    with pytest.raises(JudgeBadOutput):
        parse_ranking(text, 3)


@PROPS
@given(st.one_of(st.text(), st.text(alphabet="0123[]>, \n:"), st.none(), st.integers()), st.integers(2, 6))
@example("9" * 5000, 3)
def test_ranking_parser_is_total(text, n):
    try:
        order = parse_ranking(text, n)
    except JudgeBadOutput:
        return
    assert sorted(order) == list(range(n))


@PROPS
@given(st.permutations(range(1, 5)), st.integers(1, 9))
def test_ranking_with_anything_after_it_is_refused(perm, extra):
    with pytest.raises(JudgeBadOutput):
        parse_ranking(" > ".join(map(str, perm)) + f" > {extra}", 4)


@PROPS
@given(st.one_of(st.floats(), st.integers(), st.booleans(), st.text(max_size=8), st.none()))
@example(float("nan"))
@example(float("inf"))
@example(1.5)
def test_yes_probability_is_finite_in_range_or_a_failure(answer):
    j = PointwiseJudge(_runner(FakeBackend(answer=lambda p: answer)), Q)
    for yes_means_pass in (True, False):
        j.yes_means_pass = yes_means_pass
        (out,) = j.score_all(["x"])
        assert isinstance(out, JudgeError) or (type(out) is float and 0.0 <= out <= 1.0), out


@pytest.mark.parametrize("answer", [float("nan"), float("inf"), 1.5, -0.1, True, "0.5"])
def test_pairwise_refuses_a_probability_that_is_not_one(answer):
    pj = PairwiseJudge(_runner(FakeBackend(answer=lambda p: answer)), "A: {a}\nB: {b}\nIs A better?")
    with pytest.raises(JudgeError, match="pairwise judge"):
        pj(["x", "y"])


# ------------------------------------------------------------------------------- 2. no NaN or infinity, anywhere


def test_cache_never_stores_a_non_finite_value(tmp_path):
    c = JudgeCache(tmp_path / "c.sqlite")
    c.put_many({"nan": float("nan"), "inf": float("inf"), "nested": [1.0, float("-inf")], "ok": 0.5})
    assert len(c) == 1 and c.get_many(["nan", "inf", "nested", "ok"]) == {"ok": 0.5}


def test_a_nan_left_in_an_old_cache_is_asked_again(tmp_path):
    path = tmp_path / "c.sqlite"
    b = FakeBackend()
    key = cache_key(b.judge_id, "yes_no", Q, Q.format(completion="good"))
    JudgeCache(path).put_many({"other": 1.0})  # creates the table
    with sqlite3.connect(path) as db:  # what an older version wrote
        db.execute("INSERT INTO judge_cache VALUES (?, 'NaN', 0)", (key,))
        db.execute("INSERT INTO judge_cache VALUES ('broken', '{not json', 0)")
    j = PointwiseJudge(_runner(b, JudgeCache(path)), Q)
    assert j(["good"]) == [0.9] and b.calls == 1
    assert JudgeCache(path).get_many(["broken"]) == {}


def _nonfinite(completions, **kw):
    return [{"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(c, 1.0) for c in completions]


def test_rubric_fails_a_sample_whose_reward_is_not_finite():
    s = Rubric.from_funcs([_nonfinite]).score(["ok", "nan", "inf", "-inf", "fine"], [{}] * 5)
    assert [x.failed for x in s] == [False, True, True, True, False]
    assert s[0].reward == 1.0 and s[4].reward == 1.0
    for x in s[1:4]:
        assert x.reward == 0.0 and not x.passed and "not a finite number" in x.error and "_nonfinite" in x.error


def test_rubric_fails_non_finite_values_of_a_partial_failure_and_of_a_gate():
    def partial(completions, **kw):
        raise PartialRewardFailure([math.nan, 1.0, None], {2: "judge down"})

    s = Rubric([RewardComponent("p", partial)]).score(["a", "b", "c"], [{}] * 3)
    assert [x.failed for x in s] == [True, False, True] and "not a finite number" in s[0].error
    g = Rubric([RewardComponent("gate", _nonfinite), RewardComponent("len", lambda cs, **k: [1.0] * len(cs))],
               gates=["gate"]).score(["nan", "ok"], [{}] * 2)
    assert g[0].failed and "gate" in g[0].error and not g[1].failed and g[1].reward == 2.0


def test_rubric_with_a_judge_that_answers_nan_fails_that_sample(tmp_path):
    j = PointwiseJudge(_runner(FakeBackend(answer=lambda p: math.nan if "bad" in p else 0.9),
                               JudgeCache(tmp_path / "c.sqlite")), Q)
    s = Rubric([RewardComponent("judge", j)]).score(["good", "bad"], [{}] * 2)
    assert not s[0].failed and s[0].reward == 0.9
    assert s[1].failed and "judge" in s[1].error and "nan" in s[1].error.lower()
    assert len(j.runner.cache) == 1  # the NaN was not cached


def test_local_judge_with_nan_logits_fails_instead_of_scoring_one_half():
    import torch

    from posttrain.rewards.judges import LocalHFBackend

    class NanModel(torch.nn.Module):  # stands in for a judge whose fp16 forward overflowed
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, **kw):
            return SimpleNamespace(logits=torch.full((input_ids.shape[0], 1, 4), math.nan))

    b = LocalHFBackend("nan-model", device="cpu", model_obj=NanModel(), tokenizer=SimpleNamespace(pad_token_id=0))
    b._yes_no, b._render = ([1], [2]), lambda tok, p: [3, 3]
    (out,) = PointwiseJudge(_runner(b), Q).score_all(["x"])
    assert isinstance(out, JudgeBadOutput) and "finite" in str(out)


# ----------------------------------------------------------------------------------- 3. failures are per prompt


def test_an_unforeseen_exception_in_place_of_one_answer_fails_only_that_prompt(tmp_path):
    bad = RATE.format(completion="bad")
    b = FakeBackend(text=lambda p: "8", fail={bad: ValueError("7")})  # not a JudgeError; its text reads as 7
    j = PointwiseJudge(_runner(b, JudgeCache(tmp_path / "c.sqlite")), RATE, mode="score")
    out = j.score_all(["good", "bad"])
    assert out[0] == pytest.approx(0.8)
    assert isinstance(out[1], JudgeError) and "ValueError" in str(out[1])


def test_a_backend_that_returns_no_list_fails_with_a_reason():
    class NotAList(FakeBackend):
        def yes_prob(self, prompts):
            return None

    (out,) = PointwiseJudge(_runner(NotAList()), Q).score_all(["x"])
    assert isinstance(out, JudgeError) and "NoneType" in str(out)


# ---------------------------------------------------------------------------------- 4. a hostile HTTP peer

GOOD = 0.8


def _chat(content="Yes", p_yes=GOOD, logprob=None) -> dict:
    tops = [{"token": "Yes", "logprob": math.log(p_yes) if logprob is None else logprob},
            {"token": "No", "logprob": math.log(1 - p_yes)}]
    lp = {"content": [{"token": content, "logprob": -0.1, "top_logprobs": tops}]}
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "hostile",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content},
                         "logprobs": lp}]}


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.0: one request per connection, so a body without Content-Length ends at the close."""

    server: "HostileServer"

    def log_message(self, *a):  # quiet
        pass

    def do_GET(self):
        prefix = self.path.split("/v1/")[0].strip("/")
        self.server.behave(self, "models:" + prefix if prefix else "models", None)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        msg = body["messages"][-1]["content"]
        m = re.search(r"case=(\w+)", msg)
        self.server.behave(self, m.group(1) if m else "good", body)


class HostileServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stop = threading.Event()
        self.sent: dict[str, int] = {}
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()  # every sleeping handler wakes and ends
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=5)

    # -- replies
    def behave(self, h: _Handler, case: str, body: dict | None) -> None:
        try:
            getattr(self, "case_" + case.replace(":", "_").replace("-", "_"))(h, body)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the client hung up on us: what a bounded client does

    def _send(self, h, payload: bytes | dict | list, status=200, headers=()) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        for k, v in headers:
            h.send_header(k, v)
        if not any(k.lower() == "content-length" for k, _ in headers):
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def case_models(self, h, body):
        self._send(h, {"object": "list", "data": [{"id": "hostile", "object": "model"}]})

    def case_good(self, h, body):
        msg = body["messages"][-1]["content"]
        if body.get("logprobs"):
            self._send(h, _chat("Yes", GOOD if "good" in msg else 1 - GOOD))
        else:
            self._send(h, _chat("8/10" if "good" in msg else "2/10"))

    def _stream_huge(self, h, total: int, key: str) -> None:
        """A valid reply padded to `total` bytes, without Content-Length: a client that buffers it all accepts it."""
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        head, tail = b'{"pad": "', b'", ' + json.dumps(_chat())[1:].encode()
        h.wfile.write(head)
        chunk, sent = b"x" * 65536, 0
        while sent < total and not self.stop.is_set():
            h.wfile.write(chunk)
            sent += len(chunk)
            self.sent[key] = sent
        h.wfile.write(tail)

    def case_huge(self, h, body):
        self._stream_huge(h, 16 << 20, "huge")

    def case_declared_huge(self, h, body):
        h.send_response(200)
        h.send_header("Content-Length", str(10**10))
        h.end_headers()
        h.wfile.write(b'{"choices": ')
        self.stop.wait(3)

    def case_gzip_bomb(self, h, body):
        doc = json.dumps(_chat()).encode()
        data = gzip.compress(doc[:-1] + b" " * (16 << 20) + b"}", 9)
        self._send(h, data, headers=[("Content-Encoding", "gzip")])

    def case_cut(self, h, body):
        data = json.dumps(_chat()).encode()
        h.send_response(200)
        h.send_header("Content-Length", str(len(data) + 500))
        h.end_headers()
        h.wfile.write(data[:40])
        h.wfile.flush()
        h.close_connection = True

    def case_reset(self, h, body):
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        h.close_connection = True

    def case_bad_json(self, h, body):
        self._send(h, b'{"choices": [{"index": 0, "message": ')

    def case_infinity(self, h, body):
        self._send(h, json.dumps(_chat(logprob=math.inf)).encode())  # json.dumps writes Infinity

    def case_nan(self, h, body):
        self._send(h, json.dumps(_chat(logprob=math.nan)).encode())

    def case_text_logprob(self, h, body):
        self._send(h, _chat(logprob="high"))

    def case_positive_logprob(self, h, body):
        self._send(h, _chat(logprob=50.0))

    def case_error_200(self, h, body):
        self._send(h, {"error": {"message": "model overloaded", "type": "server_error"}})

    def case_list(self, h, body):
        self._send(h, [_chat()])

    def case_choices_not_list(self, h, body):
        self._send(h, {"choices": {"0": _chat()["choices"][0]}})

    def case_missing(self, h, body):
        self._send(h, {"choices": [{"index": 0}]})

    def case_no_choices(self, h, body):
        self._send(h, {"choices": []})

    def case_not_utf8(self, h, body):
        self._send(h, b'{"choices": "\xff\xfe"}')

    def case_deep(self, h, body):
        self._send(h, b"[" * 100_000 + b"]" * 100_000)

    def case_stall(self, h, body):
        self.stop.wait(4)  # past the client's timeout; then a late answer nobody reads
        self._send(h, _chat())

    def case_trickle(self, h, body):
        """Each byte well within the read timeout, the whole reply far past it."""
        data = json.dumps(_chat()).encode()
        data = data[:-1] + b" " * 20 + b"}"
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        step = max(1, len(data) // 25)
        for i in range(0, len(data), step):
            if self.stop.wait(0.15):
                return
            h.wfile.write(data[i : i + step])
            h.wfile.flush()

    def case_score_1e309(self, h, body):
        self._send(h, _chat("score: 1e309"))

    def case_content_number(self, h, body):
        self._send(h, _chat(7))

    # /<prefix>/v1/models: a hostile model listing
    def case_models_m_list(self, h, body):
        self._send(h, [{"id": "x"}])

    def case_models_m_noid(self, h, body):
        self._send(h, {"data": [{"object": "model"}]})

    def case_models_m_idnum(self, h, body):
        self._send(h, {"data": [{"id": 7}]})

    def case_models_m_stall(self, h, body):
        self.stop.wait(4)
        self.case_models(h, body)

    def case_models_m_huge(self, h, body):
        self._stream_huge(h, 16 << 20, "m-huge")


@pytest.fixture(scope="module")
def hostile():
    with HostileServer() as srv:
        yield srv


HTTP_TIMEOUT_S = 0.5
BOUND_S = 3.0  # a hostile reply costs at most about two timeouts (headers, then the body), never the server's pace


def _remote_judge(url, tmp_path, **kw):
    backend = OpenAIBackend(url, timeout_s=HTTP_TIMEOUT_S)
    runner = JudgeRunner(backend, JudgeCache(tmp_path / "c.sqlite"), timeout_s=10.0, max_retries=0, backoff_s=0.0)
    return PointwiseJudge(runner, Q, **kw)


HOSTILE = [  # case, the error kind, a word the reason must hold
    ("huge", JudgeBadOutput, "bytes"),
    ("declared_huge", JudgeBadOutput, "bytes"),
    ("gzip_bomb", JudgeBadOutput, "gzip"),
    ("cut", JudgeUnavailable, "connection"),
    ("reset", JudgeUnavailable, "connection"),
    ("bad_json", JudgeBadOutput, "json"),
    ("infinity", JudgeBadOutput, "infinity"),
    ("nan", JudgeBadOutput, "nan"),
    ("text_logprob", JudgeBadOutput, "logprob"),
    ("positive_logprob", JudgeBadOutput, "logprob"),
    ("error_200", JudgeBadOutput, "model overloaded"),
    ("list", JudgeBadOutput, "list"),
    ("choices_not_list", JudgeBadOutput, "choices"),
    ("missing", JudgeBadOutput, "message"),
    ("no_choices", JudgeBadOutput, "choices"),
    ("not_utf8", JudgeBadOutput, "utf-8"),
    ("deep", JudgeBadOutput, "deeper"),
    ("stall", JudgeTimeout, "within"),
    ("trickle", JudgeTimeout, "within"),
]


@pytest.mark.parametrize("case,kind,word", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_reply_fails_its_sample_only_within_the_timeout(hostile, tmp_path, case, kind, word):
    j = _remote_judge(hostile.url, tmp_path)
    t0 = time.perf_counter()
    out = j.score_all([f"case={case}", "a good one"])
    elapsed = time.perf_counter() - t0
    assert isinstance(out[0], kind), f"{type(out[0]).__name__}: {out[0]}"
    assert word in str(out[0]).lower(), str(out[0])
    assert out[1] == pytest.approx(GOOD), out[1]  # the other prompt of the batch is scored
    assert elapsed < BOUND_S, f"{case} took {elapsed:.1f}s"
    assert len(j.runner.cache) == 1  # only the good answer was cached


def test_a_huge_reply_is_not_buffered(hostile, tmp_path):
    hostile.sent.pop("huge", None)
    (out,) = _remote_judge(hostile.url, tmp_path).score_all(["case=huge"])
    assert isinstance(out, JudgeBadOutput)
    time.sleep(0.3)  # the server notices the closed connection
    assert hostile.sent.get("huge", 0) < 8 << 20, hostile.sent  # of 16 MiB; socket buffers hold a few MiB


@pytest.mark.parametrize("case,word", [("score_1e309", "1e309"), ("content_number", "int")])
def test_hostile_score_reply_fails_its_sample_only(hostile, tmp_path, case, word):
    j = _remote_judge(hostile.url, tmp_path, mode="score")
    out = j.score_all([f"case={case}", "a good one"])
    assert isinstance(out[0], JudgeBadOutput) and word in str(out[0]), out[0]
    assert out[1] == pytest.approx(0.8)


@pytest.mark.parametrize("prefix,kind", [("m-list", JudgeBadOutput), ("m-noid", JudgeBadOutput),
                                         ("m-idnum", JudgeBadOutput), ("m-stall", JudgeTimeout),
                                         ("m-huge", JudgeBadOutput)])
def test_hostile_model_listing_fails_the_call_with_a_reason(hostile, tmp_path, prefix, kind):
    url = hostile.url.replace("/v1", f"/{prefix}/v1")
    j = _remote_judge(url, tmp_path)
    t0 = time.perf_counter()
    assert j.runner.backend.judge_id.endswith(":?")  # never raises; an unknown model is not a cache identity
    out = j.score_all(["good", "bad"])
    assert all(isinstance(o, kind) for o in out), out
    assert "models" in str(out[0])
    assert time.perf_counter() - t0 < 2 * BOUND_S


def test_a_stalled_model_listing_costs_a_few_timeouts_not_one_per_prompt(hostile, tmp_path):
    url = hostile.url.replace("/v1", "/m-stall/v1")
    t0 = time.perf_counter()
    out = _remote_judge(url, tmp_path).score_all([f"prompt {i}" for i in range(8)])
    assert all(isinstance(o, JudgeTimeout) for o in out)
    assert time.perf_counter() - t0 < 4 * HTTP_TIMEOUT_S + 1.0  # the id once, then the call: not 8 + 8 lookups


@pytest.mark.parametrize("lib", ["httpx", "httpx2"])
def test_a_given_http_client_is_bounded_too(tmp_path, lib):
    """A client the caller passes (here on a mock transport) gets the same bounds as the default one."""
    httpx = pytest.importorskip(lib)

    def handler(request):
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "mock"}]})
        msg = json.loads(request.content)["messages"][-1]["content"]
        if "huge" in msg:
            return httpx.Response(200, content=b" " * (2 << 20) + json.dumps(_chat()).encode())
        return httpx.Response(200, json=_chat("Yes", GOOD if "good" in msg else 1 - GOOD))

    client = httpx.Client(transport=httpx.MockTransport(handler))
    backend = OpenAIBackend("http://judge.invalid/v1", timeout_s=HTTP_TIMEOUT_S, http_client=client)
    j = PointwiseJudge(JudgeRunner(backend, JudgeCache(tmp_path / "c.sqlite"), max_retries=0), Q)
    out = j.score_all(["case huge", "a good one"])
    assert isinstance(out[0], JudgeBadOutput) and "cap" in str(out[0]), out[0]
    assert out[1] == pytest.approx(GOOD)
