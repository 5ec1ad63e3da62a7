"""Rows from the data files users bring, read within caps: a dataset's files (tasks/dataset.py), preference pairs,
triplets and judge examples (`read_rows`), a subset file (`json_value`).

    jsonl_rows(path, error, limit)      one JSON object a line, read a line at a time (bounded_files.text_lines)
    json_rows(path, error, limit)       a .json file holding a list of rows, parsed whole (so capped lower)
    csv_rows(path, error, limit)        a header, then one row a record
    parquet_rows / arrow_rows           row group by row group (record batch by batch), counting the bytes decoded
    read_rows(path, error, what)        .json (a list) or JSON lines: the pairs / triplets / examples files

The caps (`LIMITS`, a `Limits`): what one file may put in memory, one line, a .json file, the nesting of one row.
`limit` (a row count, e.g. task.max_rows) stops reading once that many rows are read, so a large file can still
be sampled. Every failure is the caller's error type (`error(message)`), one line naming the file and the line or
row (`PATH:LINE: reason`): a symlink loop, a FIFO, a line too long, JSON nested too deep, a csv field over csv's
limit, all the same way.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from posttrain.bounded import BoundedError, json_depth_ok
from posttrain.bounded_files import ErrorType, open_regular, read_capped, text_lines

Rows = list[Any]


@dataclass(frozen=True)
class Limits:
    # What one file may put in memory: the bytes read from a text file, or the Arrow bytes a parquet / arrow file
    # decodes to. Rows as Python objects take a few times this.
    data_bytes: int = 1 << 30
    # One JSONL line or CSV record: far above any real row, far below what takes a machine down.
    line_bytes: int = 16 << 20
    # A .json file is parsed whole (one string, then its objects at once): one row a line (.jsonl) scales further.
    json_bytes: int = 256 << 20
    # The nesting of one row's JSON: chat messages are 3 deep; json's C parser recurses once a level.
    depth: int = 64


LIMITS = Limits()


def _json(text: str, where: str, error: ErrorType, hint: str = "", whole: bool = False) -> Any:
    """`text` parsed; `whole`: a whole file, whose errors name their line."""
    try:
        if text.count("[") + text.count("{") > LIMITS.depth:  # fewer brackets cannot nest deeper: skip the scan
            json_depth_ok(text, 0, LIMITS.depth)  # linear, before json recurses
        return json.loads(text)
    except BoundedError as e:
        raise error(f"{where}: {e.reason}") from None
    except json.JSONDecodeError as e:
        raise error(f"{where}{f':{e.lineno}' if whole else ''}: not valid JSON ({e.msg}){hint}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # an int past 4300 digits; the rest: defence in depth
        raise error(f"{where}: not valid JSON ({type(e).__name__}: {str(e)[:120]})") from None


def _done(rows: Rows, limit: int | None) -> bool:
    return limit is not None and len(rows) >= limit


def jsonl_rows(path: Path, error: ErrorType, limit: int | None = None) -> Rows:
    rows: Rows = []
    with open_regular(path, error) as f:
        for n, text in text_lines(f, path, error, LIMITS.line_bytes, LIMITS.data_bytes):
            if text.strip():
                rows.append(_json(text, f"{path}:{n}", error, "; each line must be one JSON object"))
                if _done(rows, limit):
                    break
    return rows


def json_value(path: Path, error: ErrorType, hint: str = "") -> Any:
    """The one JSON value of a .json file, within LIMITS.json_bytes and LIMITS.depth; `hint` follows a parse
    error."""
    with open_regular(path, error) as f:
        data = read_capped(f, path, error, LIMITS.json_bytes, "; a .json file is parsed whole: write one row a line")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start + 1})") from None
    return _json(text, str(path), error, hint, whole=True)


def json_rows(path: Path, error: ErrorType, limit: int | None = None, kind: str = ".json file") -> Rows:
    rows = json_value(path, error, "; a .json file holds a list of rows (one object a line: name it .jsonl)")
    if not isinstance(rows, list):
        what = "row objects" if kind == ".json file" else "rows"
        raise error(f"{path}: a {kind} must hold a list of {what}, got {type(rows).__name__}")
    return rows[:limit]


def csv_rows(path: Path, error: ErrorType, limit: int | None = None) -> Rows:
    """Rows of a csv file with a header. A field is at most csv's own limit (csv.field_size_limit, 131072
    characters by default): a longer text belongs in a .jsonl or .parquet file."""
    rows: Rows = []
    with open_regular(path, error) as f:
        lines = (t for _, t in text_lines(f, path, error, LIMITS.line_bytes, LIMITS.data_bytes, keep_ends=True))
        reader = csv.reader(lines)
        try:
            header = next(reader, None)
            for record in reader:
                if header is not None and len(record) > len(header):
                    raise error(
                        f"{path}:{reader.line_num}: {len(record)} fields, the header has {len(header)} "
                        f"({', '.join(header)})"
                    )
                if record:
                    rows.append(dict(zip(header or [], record + [None] * (len(header or []) - len(record)))))
                if _done(rows, limit):
                    break
        except csv.Error as e:
            hint = "; a longer text belongs in a .jsonl or .parquet file" if "field limit" in str(e) else ""
            raise error(f"{path}:{reader.line_num}: {e}{hint}") from None
    return rows


def _decoded(total: int, path: Path, error: ErrorType, where: str) -> None:
    if total > LIMITS.data_bytes:
        raise error(
            f"{path}: {where}: more than {LIMITS.data_bytes:,} bytes decoded; read fewer rows or split the file"
        )


def parquet_rows(path: Path, error: ErrorType, limit: int | None = None) -> Rows:
    """Row group by row group, refused once the groups decoded take more than LIMITS.data_bytes (checked against
    the file's own sizes before reading, and against the bytes decoded after each group)."""
    import pyarrow.parquet as pq

    def groups(f: BinaryIO) -> Iterator[tuple[str, Any]]:
        pf = pq.ParquetFile(f)
        meta = pf.metadata
        read = 0
        for i in range(meta.num_row_groups):
            _decoded(read + meta.row_group(i).total_byte_size, path, error, f"row group {i}")
            table = pf.read_row_group(i)
            read += table.nbytes
            yield f"row group {i}", table

    return _columnar_rows(path, error, limit, ".parquet", groups)


def arrow_rows(path: Path, error: ErrorType, limit: int | None = None) -> Rows:
    """An Arrow IPC file: the stream format `datasets` writes (data-00000-of-00001.arrow), or the file format;
    batch by batch, refused past LIMITS.data_bytes decoded."""
    import pyarrow as pa

    def batches(f: BinaryIO) -> Iterator[tuple[str, Any]]:
        try:
            found = iter(pa.ipc.open_stream(f))
        except pa.ArrowInvalid:
            f.seek(0)
            reader = pa.ipc.open_file(f)
            found = (reader.get_batch(i) for i in range(reader.num_record_batches))
        for i, batch in enumerate(found):
            yield f"record batch {i}", batch

    return _columnar_rows(path, error, limit, ".arrow", batches)


def _columnar_rows(
    path: Path, error: ErrorType, limit: int | None, kind: str, parts: Callable[[BinaryIO], Iterator[tuple[str, Any]]]
) -> Rows:
    """The rows of a parquet or Arrow file, part by part (`parts`: (where, table or batch), read lazily), until
    `limit` rows; refused once the parts decoded take more than LIMITS.data_bytes; pyarrow's errors one line."""
    import pyarrow as pa

    rows: Rows = []
    with open_regular(path, error) as f:
        try:
            total = 0
            for where, part in parts(f):
                total += part.nbytes
                _decoded(total, path, error, where)
                rows.extend(part.to_pylist())
                if _done(rows, limit):
                    break
        except (pa.ArrowException, OSError) as e:
            raise error(f"{path}: cannot read it as {kind} ({type(e).__name__}: {_first_line(e)})") from None
    return rows[:limit]


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


def read_rows(path: Path, error: ErrorType, what: str) -> Rows:
    """Rows of a .json file (a list) or of a JSON-lines file (any other name), within LIMITS."""
    if path.suffix == ".json":
        return json_rows(path, error, kind=f".json {what} file")
    return jsonl_rows(path, error)
