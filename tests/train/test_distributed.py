"""Data-parallel trainer ranks over gloo: the 2-rank update equals the 1-rank update; a 2-rank run's train
metrics match the 1-rank run's; the pure pieces (sharding, metric combination)."""

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
from posttrain.training.distributed import combine_metrics, split_by_groups
from posttrain.training.protocol import StepSettings
from posttrain.training.trainer import Trainer


def test_split_keeps_groups_whole_and_the_whole_batch_normalizers():
    batch = random_batch(100, n_groups=5, g=3)
    shards = split_by_groups(batch, 2)
    assert sorted(len(s.sequences) for s in shards) == [6, 9]
    for s in shards:
        assert s.total_loss_tokens == batch.num_loss_tokens and s.total_seqs == len(batch.sequences)
        assert len({q.group_id for q in s.sequences}) * 3 == len(s.sequences)  # whole groups
    assert sorted(id(q) for s in shards for q in s.sequences) == sorted(id(q) for q in batch.sequences)
    assert [len(s.sequences) for s in split_by_groups(random_batch(100, n_groups=1), 3)].count(0) == 2


def test_combine_metrics_weights_means_by_tokens_and_sums_counts():
    m = combine_metrics([{"train/loss": 1.0, "train/loss_tokens": 30.0, "train/entropy": 2.0, "time/forward_backward": 1.0},
                         {"train/loss": 0.5, "train/loss_tokens": 10.0, "train/entropy": 4.0, "time/forward_backward": 3.0}])
    assert m == {"train/loss": 1.5, "train/loss_tokens": 40.0, "train/entropy": 2.5, "time/forward_backward": 3.0}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(port):
    from posttrain.models import load_model
    from posttrain.training.distributed import init_group, worker_loop

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    model, tok = load_model("tiny-random", seed=5)  # different weights: rank 0 broadcasts its own first
    trainer = Trainer(model, pad_id=tok.pad_token_id, lr=1e-2, micro_batch_tokens=64)
    init_group(1, 2, 120)
    worker_loop(trainer, with_terms(LOSSES["ppo_clip"]), LossParams(), None, 1, 2)


def test_two_rank_update_equals_one_rank_update(tiny):
    from posttrain.training.distributed import DataParallelTrainer, init_group

    model, tok = tiny
    batch = random_batch(len(tok), n_groups=4, g=3, seed=1)
    batch.sequences = [replace(s, sample_id=i) for i, s in enumerate(batch.sequences)]
    keep = {0, 5, 11}  # the report's rows: their pre-update log-probs come back from whichever rank trained them
    one = Trainer(copy.deepcopy(model), pad_id=tok.pad_token_id, lr=1e-2, micro_batch_tokens=64)
    # A remedy's settings (PolicyGradientStepper.apply_overrides) must reach every rank.
    st = StepSettings(temperature=0.8, lr_scale=0.5, entropy_coef=0.05)
    loss = with_terms(LOSSES["ppo_clip"])  # with the entropy-bonus term, so entropy_coef changes the gradient
    u1 = one.forward_backward(batch, loss, LossParams(), settings=st, keep=keep)
    m1 = u1.metrics
    m1.update(one.optim_step(st.lr_scale))
    # A second step: a rank that stepped with another learning-rate scale would now hold other weights.
    m1b = one.forward_backward(batch, loss, LossParams(), settings=st).metrics

    port = _free_port()
    proc = mp.get_context("spawn").Process(target=_worker, args=(port,))
    proc.start()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    init_group(0, 2, 120)
    two = DataParallelTrainer(Trainer(copy.deepcopy(model), pad_id=tok.pad_token_id, lr=1e-2,
                                      micro_batch_tokens=64), 2)
    try:
        u2 = two.forward_backward(batch, loss, LossParams(), settings=st, keep=keep)
        m2 = u2.metrics
        m2.update(two.optim_step(st.lr_scale))
        m2b = two.forward_backward(batch, loss, LossParams(), settings=st).metrics
    finally:
        two.close()
        proc.join(timeout=300)  # generous: a loaded 2-core machine starts and stops processes slowly
    assert proc.exitcode == 0
    diff = max(float((a - b).detach().abs().max()) for a, b in zip(one.model.parameters(), two.model.parameters()))
    assert diff <= 1e-5, diff  # summation order differs across ranks: float noise only
    assert m2["train/loss_tokens"] == m1["train/loss_tokens"]
    assert m2["train/loss"] == pytest.approx(m1["train/loss"], abs=1e-6)
    assert m2["train/grad_norm"] == pytest.approx(m1["train/grad_norm"], rel=1e-5)
    assert m2b["train/loss"] == pytest.approx(m1b["train/loss"], abs=1e-5)
    assert m2["train/entropy_bonus"] == m1["train/entropy_bonus"] == 0.05  # the bonus reached every rank's loss
    assert set(u2.logprobs) == set(u1.logprobs) == keep
    for i in keep:
        assert u2.logprobs[i] == pytest.approx(u1.logprobs[i], abs=1e-5)


def test_two_rank_run_matches_the_one_rank_run(tmp_path):
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.obs import read_metrics

    common = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
              "loop.eval_prompts=4", "loop.steps=5", "loop.save_every=0", "trainer.lr=1e-3", "run.seed=3",
              "model.threads=1", "trainer.micro_batch_tokens=128"]
    runs = {}
    for world in (1, 2):
        res = train(load_config(None, common + [f"run.output_dir={tmp_path / str(world)}",
                                                f"trainer.world_size={world}"]))
        runs[world] = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert len(runs[1]) == len(runs[2]) == 5
    assert all(r["train/world_size"] == 2.0 for r in runs[2]) and "train/world_size" not in runs[1][0]
    for a, b in zip(runs[1], runs[2]):
        for k, v in a.items():
            if k.startswith(("time/", "perf/")) or k == "kind":
                continue
            assert b[k] == pytest.approx(v, abs=1e-6, rel=1e-5), (a["step"], k, v, b[k])


def test_a_killed_rank_stops_the_run_clearly_and_it_resumes_on_one_rank(tmp_path, monkeypatch):
    from posttrain.config import load_config
    from posttrain.loop import Run
    from posttrain.loop.pg_stepper import PolicyGradientStepper
    from posttrain.obs import read_metrics
    from posttrain.training.distributed import TrainerRankError

    common = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
              "loop.eval_prompts=4", "loop.steps=4", "loop.save_every=2", "model.threads=1",
              "trainer.dist_timeout_s=60", f"run.output_dir={tmp_path}", "run.name=r"]
    orig = PolicyGradientStepper.step

    async def kill_at_3(self, step):
        if step == 2:
            self.trainer.workers[0].kill()  # SIGKILL the rank-1 process mid-run
            self.trainer.workers[0].wait(timeout=30)
        return await orig(self, step)

    monkeypatch.setattr(PolicyGradientStepper, "step", kill_at_3)
    run = Run(load_config(None, common + ["trainer.world_size=2"]))
    with pytest.raises(TrainerRankError, match="trainer rank failed.*--resume"):
        run.run()
    monkeypatch.setattr(PolicyGradientStepper, "step", orig)
    resumed = Run(load_config(None, common + ["trainer.world_size=1"]), run_dir=run.run_dir, resume=True).run()
    steps = [r["step"] for r in read_metrics(str(resumed.run_dir)) if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4]  # the 2-rank checkpoint at step 2 resumed on one rank
