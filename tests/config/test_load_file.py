"""The config file `posttrain train CONFIG` reads (config/load.py): a FIFO, a symlink loop, a folder or an oversized
file is refused with the real reason in one ConfigError line, never read until it blocks or fills memory."""

from __future__ import annotations

import os

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.config import load as config_load


def _message(path) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.timeout(30)
def test_a_config_that_is_a_fifo_a_loop_or_a_folder(tmp_path):
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    assert _message(fifo) == f"config file {fifo}: a FIFO (named pipe), not a regular file"
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    assert _message(loop) == f"config file {loop}: a symlink loop (too many levels of symbolic links)"
    (tmp_path / "d.yaml").mkdir()
    assert _message(tmp_path / "d.yaml") == f"config file {tmp_path / 'd.yaml'}: a folder, not a regular file"
    assert _message(tmp_path / "none.yaml") == f"config file not found: {tmp_path / 'none.yaml'}"


def test_a_config_over_its_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(config_load, "MAX_CONFIG_BYTES", 1000, raising=False)
    p = tmp_path / "big.yaml"
    p.write_text("loop:\n  steps: 3\n" + "# padding\n" * 200)
    assert _message(p) == f"config file {p}: more than 1,000 bytes; a config is a few kilobytes"
