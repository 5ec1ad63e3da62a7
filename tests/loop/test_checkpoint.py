"""Checkpoints: a write that fails (a full disk) is a clear error, leaves no partial folder and keeps the last
whole checkpoint."""

import pytest
import torch

from posttrain.loop.checkpoint import CheckpointError, latest_checkpoint, save_checkpoint


def test_a_failed_write_keeps_the_last_checkpoint_and_says_why(tmp_path, monkeypatch):
    gen = torch.Generator()
    first = save_checkpoint(tmp_path, 10, {"stepper.pt": {"w": torch.ones(3)}}, gen, {"a": 1})
    real_save = torch.save

    def full_disk(obj, path, *a, **kw):
        if "stepper" in str(path):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 138127040 vs 138126928")
        return real_save(obj, path, *a, **kw)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointError, match=r"step 20 .*GiB free.*last complete checkpoint is kept"):
        save_checkpoint(tmp_path, 20, {"stepper.pt": {"w": torch.zeros(3)}}, gen, {"a": 2})
    assert latest_checkpoint(tmp_path) == first
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000010"], "no partial folder left"


def test_keep_checkpoints_zero_writes_none_but_still_exports_final(tmp_path):
    """A search or a bench that never resumes need not write 1.5 GB per run: keep_checkpoints=0 skips them all."""
    from posttrain.config import load_config
    from posttrain.loop import train

    cfg = load_config(None, ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false",
                             "logging.console=false", "loop.eval_prompts=4", "loop.steps=2", "loop.save_every=1",
                             "loop.keep_checkpoints=0", f"run.output_dir={tmp_path}"])
    res = train(cfg)
    assert res.steps == 2
    assert latest_checkpoint(res.run_dir) is None
    assert not (res.run_dir / "checkpoints").exists()
    assert (res.run_dir / "final" / "config.json").exists()
