"""Name registries: algorithms are looked up by the name the config gives, never chosen by if/elif."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Generic, TypeVar

from posttrain.errors import PosttrainError

F = TypeVar("F", bound=Callable)


class UnknownName(PosttrainError, KeyError):
    """A config named an algorithm that is not registered. The message names the nearest known one."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


class Registry(Generic[F]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = fn
            return fn

        return deco

    def __getitem__(self, name: str) -> F:
        if name not in self._items:
            near = difflib.get_close_matches(name, list(self._items), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise UnknownName(f"unknown {self.kind} {name!r}{hint} (known: {', '.join(sorted(self._items))})")
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def names(self) -> list[str]:
        return sorted(self._items)
