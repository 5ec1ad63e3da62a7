"""algos/registry.py: a `Registry[F]` returns the object registered under a name, typed as F; every registry in
the package says its F (a bare `Registry` would make every lookup an untyped callable)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import assert_type

import pytest

import posttrain
from posttrain.algos.registry import Registry, UnknownName

SRC = posttrain.__file__.rsplit("/", 1)[0]


def test_a_lookup_returns_the_registered_object():
    reg: Registry[Callable[[int], int]] = Registry("doubler")

    @reg.register("twice")
    def twice(x: int) -> int:
        return 2 * x

    got = reg["twice"]
    assert_type(got, Callable[[int], int])  # basedpyright checks the type; at run time the object itself
    assert got is twice and got(3) == 6 and "twice" in reg and reg.names() == ["twice"]
    with pytest.raises(UnknownName, match="did you mean 'twice'"):
        reg["twicee"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("twice")(twice)


def test_every_registry_in_the_package_names_its_type():
    from pathlib import Path

    bare = []
    for path in sorted(Path(SRC).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call) \
                    and getattr(node.value.func, "id", None) == "Registry":
                ann = node.annotation if isinstance(node, ast.AnnAssign) else None
                if not isinstance(ann, ast.Subscript):
                    bare.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not bare, f"registries without a type parameter: {bare}"
