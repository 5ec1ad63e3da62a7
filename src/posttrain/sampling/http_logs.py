"""No query string in what uvicorn logs (every server sampling/http_serve.py starts calls `no_query_strings_in_logs`).

uvicorn's access log line, its WebSocket handshake lines and its trace-level scopes carry a request's path as sent,
query and all, so a key a client put there (`?api_key=...`: refused with 401, the key goes in the Authorization
header) was written to the log in plain text. A filter on uvicorn's loggers takes the query out of those records
(the path stays; a trace-level scope's query_string reads "<...>"), whatever log config uvicorn is given: it is not a
log format. Header values never reach a log: uvicorn logs no headers but at trace level, and there as "<...>"."""

from __future__ import annotations

import logging
from typing import Any

UVICORN_LOGGERS = ("uvicorn.access", "uvicorn.error", "uvicorn.asgi")


class _NoQueryStrings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_without_query(a) for a in record.args)
        return True


def _without_query(arg: Any) -> Any:
    """A path without its query (a str with a "?" and no space: the client address, method and HTTP version have
    no "?", messages have spaces); a scope without its query_string; anything else as it is."""
    if isinstance(arg, str) and "?" in arg and not any(c.isspace() for c in arg):
        return arg.split("?", 1)[0]
    if isinstance(arg, dict) and arg.get("query_string"):
        return {**arg, "query_string": b"<...>"}
    return arg


_FILTER = _NoQueryStrings()


def no_query_strings_in_logs() -> None:
    """Put the filter on uvicorn's loggers (once each: `addFilter` skips a filter the logger holds)."""
    for name in UVICORN_LOGGERS:
        logging.getLogger(name).addFilter(_FILTER)
