"""The one base of every error a user can cause (a bad config, a missing file, a dataset that does not parse, a
model that does not load, a judge that cannot answer). The CLI catches `PosttrainError` once and prints its
message and its fix, never a traceback; anything else that escapes is a bug in posttrain and keeps its traceback.

A subclass may set `fix`, the one line that tells the user what to do; `hint()` joins it to the message. A class
that callers catch as a builtin keeps that base too (`class ConfigError(PosttrainError, ValueError)`)."""

from __future__ import annotations

MAX_LINES = 40  # a config error lists every bad key on its own line; a message past this is cut, not dumped
MAX_CHARS = 4000


class PosttrainError(Exception):
    """An error the user can cause and fix. `fix` (class or instance attribute) is the remedy, said after it."""

    fix: str = ""

    def hint(self) -> str:
        """The message (bounded), then `  fix: ...` when there is one. The whole message, not its first line: a
        config error's first line is "invalid config:" and its keys follow."""
        lines = str(self)[:MAX_CHARS].splitlines()[:MAX_LINES]
        text = "\n".join(lines).strip() or type(self).__name__
        return f"{text}\n  fix: {self.fix}" if self.fix else text


class MissingFileError(PosttrainError, FileNotFoundError):
    """A file or folder the user named (or an earlier step had to write) is not there. Still a
    FileNotFoundError, for the callers that catch one."""


class MissingExtraError(PosttrainError, ImportError):
    """An optional dependency is not installed; the message names the extra to install. Still an ImportError,
    for the callers that fall back without it."""
