"""The data files users bring besides a dataset (rewards/rows_file.py read_rows: preference pairs, triplets, judge
examples): read within caps, line by line, every problem one line in the caller's error type naming the file and
the line, and the real reason a path is not a readable file."""

from __future__ import annotations

import json
import os

import pytest

from posttrain.rewards import rows_file
from posttrain.rewards.rows_file import read_rows
from posttrain.training.preference_data import PreferenceDataError, load_pairs

PAIR = {"prompt": "p", "chosen": "good", "rejected": "bad"}


class Bad(ValueError):
    pass


def _caps(monkeypatch, **caps: int) -> None:
    limits = getattr(rows_file, "Limits", None)
    monkeypatch.setattr(rows_file, "LIMITS", limits(**caps) if limits else None, raising=False)


def _raises(path, what="pairs") -> str:
    with pytest.raises(Bad) as e:
        read_rows(path, Bad, what)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_rows_of_a_jsonl_and_a_json_file(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(PAIR) + "\n\n" + json.dumps(PAIR) + "\n")
    (tmp_path / "a.json").write_text(json.dumps([PAIR]))
    assert read_rows(tmp_path / "a.jsonl", Bad, "pairs") == [PAIR, PAIR]
    assert read_rows(tmp_path / "a.json", Bad, "pairs") == [PAIR]


def test_a_long_line_and_a_file_with_no_newline(tmp_path, monkeypatch):
    _caps(monkeypatch, line_bytes=4096)
    p = tmp_path / "long.jsonl"
    p.write_text(json.dumps(PAIR) + "\n" + json.dumps({**PAIR, "chosen": "x" * 10_000}) + "\n")
    assert _raises(p).startswith(f"{p}:2: a line longer than 4,096 bytes")
    p.write_bytes(b"[" * 100_000)
    assert _raises(p).startswith(f"{p}:1: a line longer than 4,096 bytes")


def test_a_json_file_over_its_cap(tmp_path, monkeypatch):
    _caps(monkeypatch, json_bytes=1000)
    p = tmp_path / "big.json"
    p.write_text(json.dumps([PAIR] * 100))
    assert _raises(p).startswith(f"{p}: more than 1,000 bytes; a .json file is parsed whole")


def test_deep_nesting_and_invalid_json(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    assert _raises(p) == f"{p}: JSON nested deeper than 64 levels"
    p.write_text("{not json")
    assert _raises(p).startswith(f"{p}:1: not valid JSON (")
    p.write_text('{"a": 1}')
    assert _raises(p) == f"{p}: a .json pairs file must hold a list of rows, got dict"


@pytest.mark.timeout(30)
def test_a_fifo_a_loop_a_folder_and_a_missing_file(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    assert _raises(fifo) == f"{fifo}: a FIFO (named pipe), not a regular file"
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    assert _raises(loop) == f"{loop}: a symlink loop (too many levels of symbolic links)"
    (tmp_path / "dir.jsonl").mkdir()
    assert _raises(tmp_path / "dir.jsonl") == f"{tmp_path / 'dir.jsonl'}: a folder, not a regular file"
    assert _raises(tmp_path / "none.jsonl") == f"{tmp_path / 'none.jsonl'}: no such file"


@pytest.mark.timeout(30)
def test_preference_data_from_a_fifo_or_a_symlink_loop(tmp_path):
    fifo = tmp_path / "pairs.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(PreferenceDataError, match="a FIFO"):
        load_pairs(str(fifo))
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    with pytest.raises(PreferenceDataError, match="a symlink loop"):
        load_pairs(str(loop))


def _arrow_file(path, kind: str, rows: list[dict], per_batch: int):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    if kind == "parquet":
        pq.write_table(table, path, row_group_size=per_batch)
    else:
        opener = pa.ipc.new_stream if kind == "stream" else pa.ipc.new_file
        with pa.OSFile(str(path), "wb") as sink, opener(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=per_batch):
                writer.write_batch(batch)
    return path


@pytest.mark.parametrize("kind", ["parquet", "stream", "file"])
def test_parquet_and_arrow_files_read_batch_by_batch_within_the_same_caps(tmp_path, monkeypatch, kind):
    """The two columnar readers share one loop: rows up to `limit`, batch by batch; the bytes decoded capped; a file
    that does not parse is one line."""
    read = rows_file.parquet_rows if kind == "parquet" else rows_file.arrow_rows
    suffix = ".parquet" if kind == "parquet" else ".arrow"
    rows = [{"prompt": f"q{i} " + "x" * 200, "answer": str(i)} for i in range(100)]
    p = _arrow_file(tmp_path / f"d{suffix}", kind, rows, per_batch=10)
    assert read(p, Bad) == rows
    assert read(p, Bad, limit=15) == rows[:15]
    _caps(monkeypatch, data_bytes=8 << 10)
    msg = _raises_with(read, p)
    where = "row group" if kind == "parquet" else "record batch"
    assert msg.startswith(f"{p}: {where} ") and "more than 8,192 bytes decoded" in msg, msg
    assert len(read(p, Bad, limit=5)) == 5  # one batch fits: the rest is never decoded
    junk = tmp_path / f"junk{suffix}"
    junk.write_bytes(b"not columnar data at all" * 10)
    assert _raises_with(read, junk).startswith(f"{junk}: cannot read it as {suffix} (")


def _raises_with(read, path) -> str:
    with pytest.raises(Bad) as e:
        read(path, Bad)
    assert "\n" not in str(e.value)
    return str(e.value)
