"""FSDP2 trainer ranks over gloo (trainer.sharding=fsdp2, training/fsdp.py): the 2-rank sharded update equals the
1-rank update; log-probs and state round-trip through the shards; a 2-rank run matches the 1-rank run and its
checkpoint resumes on one rank; the config refuses what fsdp2 cannot do."""

import copy
import multiprocessing as mp
import os
import socket
from dataclasses import replace

import pytest
import torch
from batches import random_batch

from posttrain.algos import LOSSES, LossParams
from posttrain.algos.loss_terms import with_terms
from posttrain.training.protocol import StepSettings
from posttrain.training.trainer import Trainer

TOL = 1e-6  # fp32: the shards' gradients are summed in another order than one process's


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _opts(chunk):
    return dict(lr=1e-2, micro_batch_tokens=64, logits_chunk_tokens=chunk)


def _worker(port, chunk, ckpt=False):
    from posttrain.models import load_model
    from posttrain.training.distributed import init_group, worker_loop
    from posttrain.training.fsdp import ShardedTrainer, shard_model

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    model, tok = load_model("tiny-random", seed=5)  # different weights: rank 0's reach it before sharding
    init_group(1, 2, 120)
    trainer = ShardedTrainer(shard_model(model, 2), pad_id=tok.pad_token_id, gradient_checkpointing=ckpt,
                             **_opts(chunk))
    worker_loop(trainer, with_terms(LOSSES["ppo_clip"]), LossParams(), None, 1, 2)


# A remedy's settings (PolicyGradientStepper.apply_overrides), handed to every call: they must reach every rank.
ST = StepSettings(temperature=0.8, lr_scale=0.5, entropy_coef=0.05)


def _steps(trainer, batches):
    """forward_backward + optim_step per batch; the metrics of each, then the log-probs of the third batch (one-
    and many-token completions) after the last step."""
    out = []
    for b in batches:
        m = trainer.forward_backward(b, with_terms(LOSSES["ppo_clip"]), LossParams(), settings=ST).metrics
        m.update(trainer.optim_step(ST.lr_scale))
        out.append(m)
    return out, trainer.compute_logprobs(batches[min(2, len(batches) - 1)], temperature=ST.temperature)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _batches(vocab):
    """Two groups per rank, several micro-batches each (micro_batch_tokens=64); one group, so rank 1's shard is
    empty; a group of one-token completions (one model call per micro-batch under prefix sharing, not two) on one
    rank only; a non-finite advantage, so the step is skipped everywhere."""
    mixed = random_batch(vocab, n_groups=4, g=3, seed=3)
    mixed.sequences = [
        replace(s, completion_ids=s.completion_ids[:1], loss_mask=[1], sampler_logprobs=[-1.0]) if s.group_id == 0 else s
        for s in mixed.sequences
    ]
    poisoned = random_batch(vocab, n_groups=4, g=3, seed=4)
    poisoned.sequences[4] = replace(poisoned.sequences[4], advantage=float("nan"))
    return [random_batch(vocab, n_groups=4, g=3, seed=1), random_batch(vocab, n_groups=1, g=3, seed=2), mixed,
            poisoned]


# chunk 0: layer by layer; 16: the chunked projection, gathered per call. ckpt: the sharded ranks re-run each
# layer in backward (activation checkpointing), the one-rank reference does not.
@pytest.mark.parametrize("chunk,ckpt", [(0, False), (16, False), (0, True)])
def test_two_rank_fsdp2_update_equals_one_rank_update(tiny, chunk, ckpt):
    from posttrain.training.distributed import DataParallelTrainer, init_group
    from posttrain.training.fsdp import ShardedTrainer, shard_model

    model, tok = tiny
    batches = _batches(len(tok))
    one = Trainer(copy.deepcopy(model), pad_id=tok.pad_token_id, **_opts(chunk))
    m1, lp1 = _steps(one, batches)
    state1 = one.state_dict()

    port = _free_port()
    proc = mp.get_context("spawn").Process(target=_worker, args=(port, chunk, ckpt))
    proc.start()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    init_group(0, 2, 120)
    two = DataParallelTrainer(ShardedTrainer(shard_model(copy.deepcopy(model), 2), pad_id=tok.pad_token_id,
                                             gradient_checkpointing=ckpt, **_opts(chunk)), 2)
    try:
        m2, lp2 = _steps(two, batches)
        state2 = two.state_dict()
        # A plain Trainer's state (one step further) loads into the shards and comes back whole.
        _steps(one, batches[:1])
        two.load_state_dict(one.state_dict())
        back = two.state_dict()
    finally:
        two.close()
        proc.join(timeout=300)  # generous: a loaded 2-core machine starts and stops processes slowly
    assert proc.exitcode == 0
    diff = _max_diff(state1["params"], state2["params"])
    print(f"fsdp2 chunk={chunk}: max parameter difference after {len(batches)} steps {diff:.3g}")
    assert diff <= TOL, diff
    assert [m["train/skipped_step"] for m in m2] == [m["train/skipped_step"] for m in m1] == [0, 0, 0, 1]
    for a, b in zip(m1, m2):
        assert b["train/loss_tokens"] == a["train/loss_tokens"]
        assert b["train/loss"] == pytest.approx(a["train/loss"], abs=TOL)
        assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=1e-5)
        assert b["train/entropy"] == pytest.approx(a["train/entropy"], abs=1e-5)
    assert max(abs(x - y) for r1, r2 in zip(lp1, lp2) for x, y in zip(r1, r2)) <= 1e-5
    # The sharded trainer's checkpoint is the plain Trainer's format, optimizer state included.
    assert state2.keys() == state1.keys() and state2["step"] == state1["step"]
    assert _max_diff(one.trainable_state(), back["params"]) == 0.0
    s1, s2 = one.state_dict()["optimizers"][0], back["optimizers"][0]
    assert [{**g, "betas": tuple(g["betas"])} for g in s2["param_groups"]] == s1["param_groups"]
    assert max(float((s1["state"][i]["exp_avg_sq"] - s2["state"][i]["exp_avg_sq"]).abs().max())
               for i in s1["state"]) == 0.0


COMMON = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
          "loop.eval_prompts=4", "loop.save_every=0", "trainer.lr=1e-3", "run.seed=3", "model.threads=1",
          "trainer.micro_batch_tokens=128", "run.name=r"]


def _train_records(run_dir):
    from posttrain.obs import read_metrics

    return [r for r in read_metrics(str(run_dir)) if r["kind"] == "train"]


def _assert_same_records(ones, twos):
    for a, b in zip(ones, twos):
        for k, v in a.items():
            if k.startswith(("time/", "perf/")) or k == "kind":
                continue
            assert b[k] == pytest.approx(v, abs=TOL, rel=1e-5), (a["step"], k, v, b[k])


@pytest.fixture(scope="module")
def one_rank_run(tmp_path_factory):
    """The plain 1-rank run of 5 steps both run tests compare with."""
    from posttrain.config import load_config
    from posttrain.loop import train

    out = tmp_path_factory.mktemp("one")
    res = train(load_config(None, COMMON + ["loop.steps=5", f"run.output_dir={out}", "trainer.world_size=1"]))
    return _train_records(res.run_dir)


def test_two_rank_fsdp2_run_matches_the_one_rank_run(tmp_path, one_rank_run):
    from posttrain.config import load_config
    from posttrain.loop import train

    res = train(load_config(None, COMMON + ["loop.steps=5", f"run.output_dir={tmp_path}", "trainer.world_size=2",
                                            "trainer.sharding=fsdp2"]))
    twos = _train_records(res.run_dir)
    assert len(one_rank_run) == len(twos) == 5
    assert all(r["train/world_size"] == 2.0 and r["time/weight_gather"] > 0 for r in twos)
    _assert_same_records(one_rank_run, twos)
    # The sampler's whole copy was refreshed by every gather: the exported model is the trained one.
    assert (res.run_dir / "final" / "config.json").exists()


def test_a_two_rank_fsdp2_checkpoint_resumes_on_one_rank(tmp_path, one_rank_run):
    """3 steps on 2 sharded ranks, then the rest on one rank with the same config (fsdp2 with one rank: nothing to
    shard, the plain trainer): steps 4 and 5 match the uninterrupted 1-rank run."""
    from posttrain.config import load_config
    from posttrain.loop import Run, train

    cfg = COMMON + [f"run.output_dir={tmp_path}", "trainer.sharding=fsdp2"]
    first = train(load_config(None, cfg + ["loop.steps=3", "trainer.world_size=2"]))
    assert (first.run_dir / "checkpoints").exists()
    resumed = Run(load_config(None, cfg + ["loop.steps=5", "trainer.world_size=1"]), run_dir=first.run_dir,
                  resume=True).run()
    records = _train_records(resumed.run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert "train/world_size" not in records[-1]
    _assert_same_records(one_rank_run, records)


@pytest.mark.parametrize("override, message", [
    ("lora.enabled=true", "fsdp2 with LoRA is not supported"),
    ("trainer.optimizer=muon", "fsdp2 with trainer.optimizer=muon is not supported"),
])
def test_the_config_refuses_what_fsdp2_cannot_do(override, message):
    from posttrain.config import load_config

    with pytest.raises(ValueError, match=message):
        load_config(None, ["trainer.sharding=fsdp2", "trainer.world_size=2", override])
    load_config(None, ["trainer.sharding=fsdp2", "trainer.world_size=1"])  # one rank: valid, nothing to shard
    with pytest.raises(ValueError, match="sharding"):
        load_config(None, ["trainer.sharding=zero3"])
