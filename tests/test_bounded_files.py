"""bounded_files.py: a user's file read one capped line at a time, and opened only when it is a regular file.
Property tests over arbitrary bytes: the lines are exactly the file's lines, or the first line over the cap is
named, and never more than one capped line is read past what was returned."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.bounded_files import open_regular, path_kind, text_lines


class Bad(ValueError):
    pass


lines_st = st.lists(st.one_of(st.binary(max_size=40), st.text(max_size=40).map(str.encode)), max_size=12)


def _expected(contents: list[bytes], cap: int) -> tuple[list[str], str | None]:
    """What text_lines must give for these lines: the texts before the first bad line, and that line's error."""
    texts: list[str] = []
    for n, c in enumerate(contents, 1):
        if len(c) > cap:
            return texts, f"f:{n}: a line longer than {cap:,} bytes"
        try:
            text = c.decode("utf-8")
        except UnicodeDecodeError:
            return texts, f"f:{n}: not UTF-8 text"
        texts.append((text.removeprefix("\ufeff") if n == 1 else text).rstrip("\r\n"))
    return texts, None


@settings(max_examples=300, deadline=None)
@given(parts=lines_st, cap=st.integers(1, 48), newline_at_end=st.booleans())
def test_the_lines_or_the_first_bad_line_named(parts, cap, newline_at_end):
    contents = [p.replace(b"\n", b" ") for p in parts]
    data = b"\n".join(contents) + (b"\n" if newline_at_end and contents else b"")
    if contents and not newline_at_end and contents[-1] == b"":
        contents = contents[:-1]  # a file ending in a newline has no empty line after it
    texts, error = _expected(contents, cap)
    f = io.BytesIO(data)
    got: list[str] = []
    try:
        for n, text in text_lines(f, Path("f"), Bad, line_bytes=cap, total_bytes=1 << 20):
            got.append(text)
            assert n == len(got)
    except Bad as e:
        assert error is not None and str(e).startswith(error), (str(e), error)
        assert got == texts
        done = sum(len(c) + 1 for c in contents[: len(got)])
        assert f.tell() <= done + cap + 1  # at most one capped read past the last line returned
        return
    assert error is None and got == texts


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@settings(max_examples=100, deadline=None)
@given(depth=st.integers(1, 200))
def test_a_row_parses_or_is_refused_for_its_depth(tmp_path_factory, depth):
    from posttrain.rewards.rows_file import jsonl_rows

    p = tmp_path_factory.mktemp("rows") / "r.jsonl"
    p.write_text(json.dumps({"a": 1}) + "\n" + '{"x": ' + _nested(depth) + "}\n")
    if depth + 1 <= 64:
        assert jsonl_rows(p, Bad)[1]["x"] == json.loads(_nested(depth))
    else:
        with pytest.raises(Bad, match=r":2: JSON nested deeper than 64 levels"):
            jsonl_rows(p, Bad)


def test_kinds_of_paths(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("x")
    assert path_kind(f, Bad) == "file" and path_kind(tmp_path, Bad) == "dir"
    assert path_kind(tmp_path / "none", Bad) is None and path_kind(f / "under-a-file", Bad) is None
    os.mkfifo(tmp_path / "p")
    with pytest.raises(Bad, match="a FIFO"):
        path_kind(tmp_path / "p", Bad)
    with pytest.raises(Bad, match="a FIFO"):
        open_regular(tmp_path / "p", Bad)  # non-blocking: returns at once with no writer
    with open_regular(f, Bad) as opened:
        assert opened.read() == b"x"
