"""ES end to end on tiny-random: the seed history rebuilds the trained weights bit for bit, and resumes."""

import json

import torch
from safetensors.torch import load_file

from posttrain.algos.es import ESHistory, replay_
from posttrain.config import load_config
from posttrain.loop import train
from posttrain.models import load_model

FAST = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
        "loop.eval_prompts=8", "algorithm.name=es", "algorithm.es.sigma=0.02", "algorithm.es.lr=0.2",
        "algorithm.es.temperature=0.7", "loop.prompts_per_step=4"]


def test_replaying_a_20_iteration_seed_history_reproduces_the_weights_exactly(tmp_path):
    res = train(load_config(None, FAST + [f"run.output_dir={tmp_path}", "loop.steps=20", "loop.save_every=0"]))
    hist = ESHistory.from_dict(json.loads((res.run_dir / "es_history.json").read_text()))
    assert len(hist.iterations) == 20
    print(f"ES seed history: {hist.bytes_per_iteration():.0f} bytes per iteration")
    assert hist.bytes_per_iteration() <= 200
    assert any(w != 0 for it in hist.iterations for w in it.weights)  # it did move

    trained, _ = load_model(str(res.run_dir / "final"))
    fresh, _ = load_model("tiny-random", seed=0)
    params = [p for p in fresh.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    replay_(params, hist)
    assert any(not torch.equal(a, b) for a, b in zip(before, params))
    for (name, a), b in zip(trained.named_parameters(), fresh.parameters()):
        assert torch.equal(a, b), name


def test_es_resume_replays_history_to_the_same_run(tmp_path):
    common = FAST + ["loop.steps=6", "loop.save_every=3", "run.seed=2"]
    straight = train(load_config(None, common + [f"run.output_dir={tmp_path / 'a'}"]))
    cfg = load_config(None, common + [f"run.output_dir={tmp_path / 'b'}", "run.name=r", "loop.steps=3"])
    first = train(cfg)
    cfg2 = load_config(None, common + [f"run.output_dir={tmp_path / 'b'}", "run.name=r"])
    resumed = train(cfg2, run_dir=first.run_dir, resume=True)
    a = json.loads((straight.run_dir / "es_history.json").read_text())
    b = json.loads((resumed.run_dir / "es_history.json").read_text())
    assert a == b
    assert resumed.after["eval/reward/mean"] == straight.after["eval/reward/mean"]


def test_es_on_lora_adapters_replays_too(tmp_path):
    from posttrain.loop.components import build

    over = FAST + [f"run.output_dir={tmp_path}", "loop.steps=3", "loop.save_every=0", "lora.enabled=true",
                   "lora.r=4"]
    res = train(load_config(None, over))
    hist = ESHistory.from_dict(json.loads((res.run_dir / "es_history.json").read_text()))
    c = build(load_config(None, over), log=lambda s: None)  # same seed: the same base weights and adapter init
    params = [p for p in c.model.parameters() if p.requires_grad]
    assert params and all("lora" in n for n, p in c.model.named_parameters() if p.requires_grad)
    replay_(params, hist)
    trained = load_file(str(res.run_dir / "final" / "adapter_model.safetensors"))
    mine = {n: p for n, p in c.model.named_parameters() if p.requires_grad}
    assert len(trained) == len(mine)
    for n, t in trained.items():
        key = next(k for k in mine if k.replace(".default", "").endswith(n.split("base_model.model.")[-1]))
        assert torch.equal(mine[key].detach(), t), n
