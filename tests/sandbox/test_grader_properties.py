"""Property tests of the host-side grader: for any bytes on the result channel, any returned value, any stdout or
stderr, the judging functions return a GradeResult in bounded time and never raise. No sandbox runs here (these
are the functions grade_* call on what a run sent back), so they are fast and need no root."""

import json
import time

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from posttrain.sandbox.channel import (  # noqa: E402
    ChannelError,
    base_id,
    parse_records,
    read_function_channel,
    read_pytest_channel,
    values_equal,
)
from posttrain.sandbox.config import GradeResult, RunResult  # noqa: E402
from posttrain.sandbox.grading import _judge_function, _judge_pytest  # noqa: E402
from posttrain.sandbox.harness_wire import WireError, decode, loads  # noqa: E402

RUN = RunResult(stdout="", stderr="", exit_code=0, timed_out=False, killed=False, duration_s=0.1, isolation="bwrap")
CASES = [{"args": [i], "expected": e} for i, e in enumerate([1, 2.5, "s", [1, {"a": None}], {"k": [1.0, True]}])]
TESTS = {"test_a.py": "def test_x():\n    pass\n\ndef test_y():\n    pass\n",
         "sub/test_b.py": "class TestC:\n    def test_z(self):\n        pass\n"}
IDS = ["test_a.py::test_x", "test_a.py::test_y", "sub/test_b.py::TestC::test_z"]
HASHES = {"test_a.py": __import__("hashlib").sha256(TESTS["test_a.py"].encode()).hexdigest(),
          "sub/test_b.py": __import__("hashlib").sha256(TESTS["sub/test_b.py"].encode()).hexdigest()}
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 4000), max_value=10 ** 4000)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30)


def _line(obj) -> bytes:
    try:
        return json.dumps(obj).encode()
    except (ValueError, TypeError):
        return b"{}"


record = st.one_of(
    st.builds(lambda i, v: {"i": i, "v": v}, st.integers(-3, 8) | st.text(max_size=3), json_values),
    st.builds(lambda i: {"i": i, "err": "ValueError"}, st.integers(-1, 6)),
    st.builds(lambda n: {"done": n}, st.integers(-1, 8) | json_values),
    st.builds(lambda k, n, p: {"kind": k, "nodeid": n, "passed": p},
              st.sampled_from(["item", "collect_error", "error", "tamper", "done", "x"]),
              st.sampled_from(IDS) | st.text(max_size=30) | st.sampled_from([i + "[1]" for i in IDS]),
              st.booleans() | json_values),
    st.builds(lambda c: {"kind": "done", "count": c}, st.integers(-1, 10) | json_values),
    json_values,
)
channels = st.one_of(
    st.binary(max_size=2000),
    st.lists(record, max_size=20).map(lambda rs: b"\n".join(_line(r) for r in rs) + b"\n"),
    st.lists(st.sampled_from([b"[", b"{", b"\"", b"\\", b"]", b"}", b"\n", b"\xff", b"1e999", b"-", b"9" * 50]),
             max_size=400).map(b"".join),
)


def check(result):
    assert isinstance(result, GradeResult)
    assert 0.0 <= result.score <= 1.0 and result.passed <= result.total


@FAST
@given(raw=channels)
def test_function_judge_never_raises(raw):
    check(_judge_function(raw, CASES, RUN))


@FAST
@given(raw=channels, hashes=st.just(HASHES) | st.dictionaries(st.text(max_size=10), st.text(max_size=10)))
def test_pytest_judge_never_raises(raw, hashes):
    for mode in ("out-of-process", "in-process"):
        check(_judge_pytest(raw, hashes, TESTS, RUN, mode))


@FAST
@given(expected=json_values, got=json_values)
def test_values_equal_never_raises_and_answers_a_bool(expected, got):
    assert type(values_equal(expected, got)) is bool  # not a truthy 1 or 0: a grade is pass or fail


def _has_nan(v) -> bool:
    if isinstance(v, float):
        return v != v
    if isinstance(v, list):
        return any(map(_has_nan, v))
    if isinstance(v, dict):
        return any(map(_has_nan, v.values()))
    return False


@FAST
@given(value=json_values)
def test_values_equal_accepts_the_value_itself_and_refuses_another_type(value):
    import copy

    if not _has_nan(value):  # NaN equals nothing, itself included
        assert values_equal(value, copy.deepcopy(value)) is True
    assert values_equal(value, [value]) is False  # the same value one level deeper is another answer
    assert values_equal([value], value) is False
    if isinstance(value, bool):  # JSON true is not the number 1
        assert values_equal(value, int(value)) is False and values_equal(int(value), value) is False


@FAST
@given(raw=channels)
def test_wire_decode_rejects_or_returns(raw):
    for line in raw.split(b"\n"):
        try:
            decode(loads(line), lambda x: object())
        except WireError:
            pass


@FAST
@given(nodeid=st.text(max_size=200))
def test_base_id_is_a_prefix(nodeid):
    assert nodeid.startswith(base_id(nodeid))


def test_only_a_perfect_channel_scores():
    ok = b"".join(_line({"kind": "item", "nodeid": i, "passed": True}) + b"\n" for i in IDS)
    good = _judge_pytest(ok + b'{"kind": "done", "count": 3}\n', HASHES, TESTS, RUN, "out-of-process")
    assert good.score == 1.0 and good.error is None
    for bad in (ok, ok + b'{"kind": "done", "count": 4}\n', ok + ok + b'{"kind": "done", "count": 6}\n',
                ok + b'{"kind": "item", "nodeid": "test_a.py::test_q", "passed": true}\n'
                + b'{"kind": "done", "count": 4}\n'):
        assert _judge_pytest(bad, HASHES, TESTS, RUN, "out-of-process").score == 0


# Worst cases at the channel's size cap (cfg.max_result_bytes, 4 MiB by default): each judged in well under the
# sandbox's own timeouts. The old regex over ids took hours at this size.
BIG = 4 << 20
WORST = {
    "brackets": b'{"kind": "item", "nodeid": "test_a.py::test_x' + b"[" * (BIG - 100) + b'", "passed": true}\n',
    "nesting": b"[" * (BIG // 2) + b"]" * (BIG // 2) + b"\n",
    "many-lines": b"{}\n" * (BIG // 3),
    "one-long-string": b'{"i": 0, "v": "' + b"a" * (BIG - 30) + b'"}\n{"done": 1}\n',
    "digits": b'{"i": 0, "v": ' + b"9" * (BIG - 30) + b"}\n",
    "escapes": b'{"i": 0, "v": "' + b"\\u0000" * ((BIG - 30) // 6) + b'"}\n',
    "garbage": bytes(range(256)) * (BIG // 256),
}


@pytest.mark.parametrize("name", sorted(WORST))
def test_worst_case_channels_are_judged_fast(name):
    raw = WORST[name]
    t = time.monotonic()
    check(_judge_function(raw, CASES, RUN))
    check(_judge_pytest(raw, HASHES, TESTS, RUN, "in-process"))
    assert time.monotonic() - t < 3.0


def test_parse_records_rejects_over_long_channels():
    with pytest.raises(ChannelError):
        parse_records(b"{}\n" * 100, max_lines=10)
    with pytest.raises(ChannelError):
        read_function_channel(b'{"i": 0, "v": 1}\n', 1)  # no closing record
    with pytest.raises(ChannelError):
        read_pytest_channel(b'{"kind": "done", "count": 1}\n', set(IDS), 10)


plain_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.frozensets(st.integers(), max_size=4)
    | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4),
    max_leaves=20)


@FAST
@given(value=plain_values)
def test_wire_round_trips_plain_values_exactly(value):
    from posttrain.sandbox.harness_wire import dumps, encode

    def no_refs(x):
        raise AssertionError(f"plain value sent as a reference: {x!r}")

    back = decode(loads(dumps({"v": encode(value, no_refs)})[:-1])["v"], no_refs)
    assert back == value and type(back) is type(value)


def test_wire_sends_subclasses_as_references():
    from posttrain.sandbox.harness_wire import encode

    class S(str):
        pass

    refs = []
    encode([S("x"), 1, True], lambda x: refs.append(x) or {"ref": len(refs)})
    assert [type(r) for r in refs] == [S]
