"""`make demo` runs configs/demo.yaml: the default run plus a short warm start. These pin what its comments claim."""

from __future__ import annotations

from pathlib import Path

from posttrain.config import load_config
from posttrain.config.schema import Config
from posttrain.tasks import builtin_task_factory

ROOT = Path(__file__).resolve().parents[2]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def test_the_demo_config_is_the_default_run_plus_a_warm_start_and_a_lower_rl_lr():
    demo, default = load_config(ROOT / "configs" / "demo.yaml"), Config()
    base = _flat(default.model_dump())
    changed = {k for k, v in _flat(demo.model_dump()).items() if base[k] != v}
    assert changed == {"warm_start.steps", "warm_start.demos", "warm_start.eval", "trainer.lr", "loop.steps"}
    assert demo.task.name == default.task.name == "json-extract"
    assert demo.trainer.lr < default.trainer.lr


def test_the_demo_warm_start_leaves_training_prompts_unseen_for_rl():
    """A warm start on every training row leaves GRPO nothing to learn (all groups pass whole), so the demo's
    warm start sees each of its demonstrations at most once and leaves most training rows to RL."""
    demo = load_config(ROOT / "configs" / "demo.yaml")
    task = builtin_task_factory(demo.task.name)(**demo.task.options)
    ws = demo.warm_start
    assert task.demonstrate is not None
    assert 0 < ws.demos and ws.steps * ws.batch_size <= ws.demos
    assert ws.demos <= len(task.train_rows) // 4


def test_make_demo_runs_the_demo_config():
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "posttrain train configs/demo.yaml" in recipe


def test_the_demo_config_runs_end_to_end_in_smoke_mode(tmp_path):
    """`make demo`'s config as written (warm start, its eval, RL) on the tiny random model: one step of each."""
    import subprocess
    import sys

    smoke = ["model.name=tiny-random", "warm_start.steps=1", "loop.steps=1", "loop.eval_prompts=2",
             "logging.tensorboard=false", "loop.save_every=0", "model.threads=1", f"run.output_dir={tmp_path}"]
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", "configs/demo.yaml", *smoke], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "base vs warm start vs after RL" in r.stdout
    assert list(tmp_path.glob("*/summary.json"))
