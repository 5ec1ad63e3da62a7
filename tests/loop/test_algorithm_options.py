"""Every algorithm preset and option runs through the real loop on tiny-random and logs its metrics."""

import functools
import math

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.loop import train
from posttrain.obs import read_metrics
from posttrain.training.protocol import Update

FAST = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
        "loop.eval_prompts=4", "loop.steps=2", "loop.save_every=0", "loop.prompts_per_step=2"]


def _run(tmp_path, *extra):
    res = train(load_config(None, FAST + [f"run.output_dir={tmp_path}"] + list(extra)))
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert len(recs) == 2
    for r in recs:
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float)), r
    return recs


def _spy(monkeypatch, registry, kind: str, called: dict[str, set[str]]) -> None:
    """Every function of `registry` records its name under `kind` when the loop calls it."""
    for name in registry.names():
        fn = registry[name]

        @functools.wraps(fn)
        def spy(*args, _fn=fn, _name=name, **kwargs):
            called[kind].add(_name)
            return _fn(*args, **kwargs)

        monkeypatch.setitem(registry._items, name, spy)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "cispo", "gspo", "dapo"])
def test_every_preset_runs_with_its_own_estimator_loss_and_aggregation(tmp_path, monkeypatch, name):
    """The loop calls the preset's advantage estimator, policy loss and aggregation, and no other: a stepper that
    ignored `algorithm.loss` (or the others) fails here."""
    from posttrain.algos.advantages import ADVANTAGES
    from posttrain.algos.aggregation import AGGREGATIONS
    from posttrain.algos.losses import LOSSES
    from posttrain.config.algorithm import ALGORITHM_PRESETS

    a = load_config(None, FAST + [f"algorithm.name={name}"]).algorithm
    for key in ("loss", "advantage", "aggregation"):  # the preset is what the config resolves to
        if key in ALGORITHM_PRESETS[name]:
            assert getattr(a, key) == ALGORITHM_PRESETS[name][key]
    called: dict[str, set[str]] = {"advantage": set(), "loss": set(), "aggregation": set()}
    _spy(monkeypatch, ADVANTAGES, "advantage", called)
    _spy(monkeypatch, LOSSES, "loss", called)
    _spy(monkeypatch, AGGREGATIONS, "aggregation", called)
    _run(tmp_path, f"algorithm.name={name}", "sampling.temperature=1.0")
    # GSPO's loss is per sequence and aggregates per sequence whatever the setting (algos/losses.py gspo)
    aggregation = "seq-mean-token-mean" if a.loss == "gspo" else a.aggregation
    assert called == {"advantage": {a.advantage}, "loss": {a.loss}, "aggregation": {aggregation}}, called


@pytest.mark.parametrize("mode", ["loss", "reward"])
def test_kl_as_loss_or_reward(tmp_path, mode):
    recs = _run(tmp_path, "algorithm.beta=0.1", f"algorithm.kl_mode={mode}", "trainer.lr=1e-2")
    key = "train/kl_ref" if mode == "loss" else "kl/reward_penalty_mean"
    assert key in recs[-1], sorted(recs[-1])
    if mode == "reward":
        assert "train/kl_ref" not in recs[-1]  # no KL term in the loss
        assert recs[-1][key] != 0.0  # step 2 runs on updated weights: the policy has left the reference


@pytest.mark.parametrize("mode,level", [("truncate", "token"), ("truncate", "sequence"), ("mask", "token")])
def test_importance_sampling_correction_logs_ratio_stats(tmp_path, mode, level):
    recs = _run(tmp_path, f"algorithm.is_correction={mode}", f"algorithm.is_level={level}")
    r = recs[-1]
    for k in ("train/is/is_ratio_mean", "train/is/is_ratio_max", "train/is/sampler_kl_k3"):
        assert k in r, sorted(r)
    assert ("train/is/is_capped_frac" if mode == "truncate" else "train/is/is_masked_frac") in r
    # in-process sampler and trainer share the weights: the ratio is ~1
    assert abs(r["train/is/is_ratio_mean"] - 1.0) < 1e-2


def test_high_entropy_token_weighting(tmp_path):
    recs = _run(tmp_path, "algorithm.token_weighting=high_entropy", "algorithm.token_weighting_frac=0.25")
    assert 0.2 <= recs[-1]["train/credit/weighted_token_frac"] <= 0.5


def test_overlong_filter_and_soft_penalty(tmp_path):
    recs = _run(tmp_path, "algorithm.overlong_filter=true", "algorithm.overlong_buffer_frac=0.5", "sampling.max_tokens=12")
    # tiny-random rarely ends a reply within 12 tokens: some samples must be filtered and penalised
    assert sum(r["dapo/overlong_filtered"] for r in recs) > 0
    assert min(r["dapo/overlong_penalty_mean"] for r in recs) < 0
    assert all(r["dapo/overlong_penalty_mean"] <= 0 for r in recs)


def test_muon_optimizer_in_the_loop(tmp_path, monkeypatch):
    """The run's trainer steps with Muon (its matrices) and AdamW (the rest), and Muon's update changes them: a
    loop that ignored `trainer.optimizer` fails here."""
    import posttrain.training.trainer as trainer_module
    from posttrain.training.optimizers import build_optimizers

    built = []

    def recording(*args, **kwargs):
        built.append(build_optimizers(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(trainer_module, "build_optimizers", recording)
    _run(tmp_path, "trainer.optimizer=muon")
    kinds = {type(o).__name__ for opts in built for o in opts}
    assert any("Muon" in k for k in kinds), kinds


def test_bad_algorithm_settings_are_clear_errors():
    with pytest.raises(ConfigError, match="did you mean 'dapo'"):
        load_config(None, ["algorithm.name=dapoo"])
    with pytest.raises(ConfigError, match="is_correction"):
        load_config(None, ["algorithm.is_correction=clip"])
    with pytest.raises(ConfigError, match="optimizer"):
        load_config(None, ["trainer.optimizer=sgd"])
    with pytest.raises(ConfigError, match="dual_clip"):
        load_config(None, ["algorithm.dual_clip=0.5"])


def test_unknown_token_weighting_fails_before_loading(tmp_path):
    from posttrain.algos.registry import UnknownName
    with pytest.raises(UnknownName, match="high_entropy"):
        train(load_config(None, FAST + [f"run.output_dir={tmp_path}", "algorithm.token_weighting=high_entrpy"]))


def test_presets_fill_only_unset_fields():
    c = load_config(None, ["algorithm.name=dapo", "algorithm.epsilon_high=0.3"]).algorithm
    assert c.epsilon_high == 0.3 and c.dynamic_sampling and c.overlong_buffer_frac == 0.2
    c = load_config(None, ["algorithm.name=gspo"]).algorithm
    assert c.loss == "gspo" and c.epsilon == 3e-4


def test_training_refuses_a_task_whose_env_check_fails(tmp_path):
    from posttrain.envs.smoke_checks import EnvCheckError

    task = tmp_path / "broken.py"
    task.write_text(
        "from posttrain.envs.smoke_checks import SmokeCheck\n"
        "from posttrain.tasks.load import to_task\n"
        "def reward(completions, **kw):\n"
        "    return [1.0 for _ in completions]  # passes everything: the known-bad answer will pass too\n"
        "def make_task():\n"
        "    rows = [{'prompt': [{'role': 'user', 'content': f'q{i}'}]} for i in range(10)]\n"
        "    t = to_task({'train': rows, 'rewards': [reward], 'max_tokens': 4}, 'broken')\n"
        "    t.smoke_checks = [SmokeCheck('wrong answer', row=rows[0], completion='nope', expect='fail')]\n"
        "    return t\n")
    cfg = load_config(None, FAST + [f"run.output_dir={tmp_path}", f"task.name={task}:make_task"])
    with pytest.raises(EnvCheckError, match="wrong answer"):
        train(cfg)
    warn = load_config(None, FAST + [f"run.output_dir={tmp_path}", f"task.name={task}:make_task",
                                     "task.env_check=warn"])
    assert train(warn).steps == 2



class _RecordingTrainer:
    """Records which old log-probs each forward_backward saw."""

    def __init__(self):
        self.seen = []

    def compute_logprobs(self, batch, model=None, temperature=None):
        return [[-9.0] * len(s.completion_ids) for s in batch.sequences]

    def forward_backward(self, batch, loss_fn, params, token_weight_fn=None, *, settings=None, keep=()):
        self.seen.append([s.old_logprobs for s in batch.sequences])
        return Update({})

    def optim_step(self, lr_scale=1.0):
        return {}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("behavior,n_iter,want", [("policy", 1, None), ("policy", 2, -9.0), ("sampler", 1, -0.25),
                                                  ("sampler", 2, -0.25),
                                                  ("trainer", 2, -9.0)])  # policy's old name: the same
def test_behaviour_logprobs_are_an_explicit_choice_the_same_in_both_modes(mode, behavior, n_iter, want):
    from posttrain.loop.pg_stepper import PolicyGradientStepper
    from posttrain.loop.step_plan import StepPlan
    from posttrain.types import Batch, Sequence

    cfg = load_config(None, [f"loop.mode={mode}", f"algorithm.behavior_logprobs={behavior}",
                             f"loop.num_iterations={n_iter}"])
    tr = _RecordingTrainer()
    stepper = PolicyGradientStepper(StepPlan.from_config(cfg, max_tokens=8), tr, collector=None, sync=None,
                                    pass_thresholds={})
    batch = Batch([Sequence([1], [2, 3], [1, 1], [-0.25, -0.25], advantage=1.0)])
    stepper._optimize(batch, keep=set())
    assert len(tr.seen) == n_iter
    for old in tr.seen:
        assert old == [None if want is None else [want, want]]


def test_behaviour_logprobs_default_is_documented_and_validated():
    assert load_config(None, []).algorithm.behavior_logprobs == "policy"
    with pytest.raises(ConfigError, match="behavior_logprobs"):
        load_config(None, ["algorithm.behavior_logprobs=old"])


def test_a_derived_setting_is_shown_in_dry_run_and_config_yaml_and_a_set_one_wins(tmp_path):
    """No silent rewrite: a setting posttrain derives from another is listed, with why, on top of the resolved
    config (`--dry-run`, the run's config.yaml); what the user set is kept and not listed."""
    import subprocess
    import sys

    import yaml

    from posttrain.config import to_yaml

    cfg = load_config(None, ["sampling.precision=bf16"])
    assert [d.split(":")[0] for d in cfg.derived] == ["algorithm.behavior_logprobs=sampler",
                                                      "algorithm.is_correction=truncate"]
    text = to_yaml(cfg)
    assert text.startswith("# derived (you did not set it): algorithm.behavior_logprobs=sampler: "
                           "sampling.precision=bf16")
    again = type(cfg).model_validate(yaml.safe_load(text))  # config.yaml read back (--resume): explicit now
    assert again.algorithm.behavior_logprobs == "sampler" and again.derived == []
    mine = load_config(None, ["sampling.precision=bf16", "algorithm.is_correction=mask"])
    assert mine.algorithm.is_correction == "mask" and [d.split("=")[0] for d in mine.derived] == \
        ["algorithm.behavior_logprobs"]
    assert load_config(None, []).derived == []  # fp32 everywhere: nothing derived
    out = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", "sampling.precision=bf16", "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "# derived (you did not set it): algorithm.is_correction=truncate" in out.stdout
