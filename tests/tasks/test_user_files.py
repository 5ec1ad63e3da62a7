"""tasks/user_files.py: `import_callable`, the one reader of "module:fn" (task.name, verifiers:module:fn); each
mistake is one CallableImportError line with its fix."""

from __future__ import annotations

import pytest

from posttrain.errors import PosttrainError
from posttrain.tasks.load import load_task
from posttrain.tasks.user_files import CallableImportError, import_callable


def _refused(spec: str) -> str:
    with pytest.raises(CallableImportError) as e:
        import_callable(spec, "task")
    assert isinstance(e.value, PosttrainError) and e.value.fix and "\n" not in str(e.value)
    return str(e.value)


def test_no_colon_is_refused():
    assert "must be 'package.module:function'" in _refused("json")
    assert "must be 'package.module:function'" in _refused("json:")


def test_a_missing_module_is_refused():
    assert "cannot import module 'no_such_module_xyz'" in _refused("no_such_module_xyz:fn")


def test_a_missing_attribute_is_refused():
    assert "json has no function 'no_such_fn'" in _refused("json:no_such_fn")


def test_an_attribute_that_is_not_callable_is_refused():
    assert "json:__name__ is a str, not a function" in _refused("json:__name__")


def test_a_module_that_raises_on_import_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    (tmp_path / "raises_on_import_xyz.py").write_text("raise RuntimeError('no')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "RuntimeError: no" in _refused("raises_on_import_xyz:make_task")
    with pytest.raises(CallableImportError):  # through load_task too
        load_task("raises_on_import_xyz:make_task")


def test_a_function_is_returned():
    import json

    assert import_callable("json:dumps", "task") is json.dumps
    assert import_callable("posttrain.tasks.count_a:make_task", "task").__name__ == "make_task"
