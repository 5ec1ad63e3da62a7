"""The on-disk cache of judge answers (sqlite): a judge call is asked once per (judge model, template, text).

The key is a SHA-256 of the judge's identity (backend name and model), the kind of question (pointwise yes/no,
score, pair, ranking), the prompt template and the exact prompt text sent, so a changed template or judge model
never reads a stale answer. Values are strict JSON: NaN and infinity are never written, and read back as a miss.
One file serves many runs and processes: sqlite handles the file locking, WAL mode lets readers and a writer work
at once, and every statement has a busy timeout.

Default location: `$POSTTRAIN_JUDGE_CACHE`, else `~/.cache/posttrain/judge_cache.sqlite`. `path=None` turns the
cache off (every call goes to the judge).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from posttrain.bounded import BoundedError, loads_json

ENV_VAR = "POSTTRAIN_JUDGE_CACHE"
_MISSING = object()
log = logging.getLogger(__name__)


def default_cache_path() -> Path:
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "posttrain" / "judge_cache.sqlite"


def cache_key(judge_id: str, kind: str, template: str, text: str) -> str:
    h = hashlib.sha256()
    for part in (judge_id, kind, template, text):
        b = part.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))  # length-prefixed, so ("ab", "c") and ("a", "bc") differ
        h.update(b)
    return h.hexdigest()


class JudgeCache:
    """A thread-safe key -> JSON value store. Opens its file lazily (on first use), so building a task that
    holds a judge touches no disk."""

    def __init__(self, path: str | Path | None = "default", timeout_s: float = 30.0):
        self.path: Path | None = default_cache_path() if path == "default" else (Path(path) if path else None)
        self.timeout_s = timeout_s
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=self.timeout_s, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS judge_cache (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL)"
            )
            conn.commit()
            self._conn = conn
        return self._conn

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        """The cached values of those `keys` that have one."""
        if not self.enabled or not keys:
            return {}
        out: dict[str, Any] = {}
        with self._lock:
            db = self._db()
            for i in range(0, len(keys), 500):  # sqlite caps the number of bound parameters
                chunk = keys[i : i + 500]
                q = f"SELECT key, value FROM judge_cache WHERE key IN ({','.join('?' * len(chunk))})"
                for k, v in db.execute(q, chunk):
                    value = _loads(k, v)
                    if value is not _MISSING:
                        out[k] = value
        return out

    def put_many(self, items: dict[str, Any]) -> None:
        """Store each value that is plain JSON; one that is not (NaN, infinity, an object) is left out, not an
        error: it is asked again next time, and no run ever reads it back as an answer."""
        if not self.enabled:
            return
        rows = [(k, text) for k, text in ((k, _dumps(k, v)) for k, v in items.items()) if text is not None]
        if not rows:
            return
        with self._lock:
            db = self._db()
            now = time.time()
            db.executemany(
                "INSERT OR REPLACE INTO judge_cache (key, value, created) VALUES (?, ?, ?)",
                [(k, text, now) for k, text in rows],
            )
            db.commit()

    def __len__(self) -> int:
        if not self.enabled:
            return 0
        with self._lock:
            return int(self._db().execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # A judge (and its cache) may be copied into a worker or pickled with a task: the connection is not
    # portable, so a copy reopens the file on first use.
    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "timeout_s": self.timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self.timeout_s = state["path"], state["timeout_s"]
        self._conn, self._lock = None, threading.Lock()


def _dumps(key: str, value: Any) -> str | None:
    """`value` as strict JSON (no NaN or infinity, at any depth), or None when it is not plain JSON."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        log.warning("judge cache: not storing %s: %s", key[:12], e)
        return None


def _loads(key: str, text: str) -> Any:
    """A stored value, read strictly: an entry an older version wrote with NaN or infinity, or a damaged one, reads
    as missing (asked again), never as an answer."""
    try:
        return loads_json(text)
    except BoundedError as e:
        log.warning("judge cache: ignoring entry %s: %s", key[:12], e)
        return _MISSING
