"""Every setting of a run, as pydantic models. Importable without torch.

Here: the top-level `Config` with the checks across its sections, and the `run:`, `judge:`, `logging:` and `debug:`
sections; the other sections live in their own modules of this package and are imported here, because the schema is
one namespace: the public API of the config's models. Each model forbids unknown keys, so a typo is an error that names
the nearest valid key (see load.py).
"""

from __future__ import annotations

from pydantic import Field, PrivateAttr, model_validator

from posttrain.config.algorithm import (  # noqa: F401 - public API: the schema is one namespace
    ALGORITHM_PRESETS,
    AlgorithmConfig,
    ESConfig,
    HintDistillConfig,
    InsightsConfig,
    RisedConfig,
    TeacherConfig,
)
from posttrain.config.cluster import (  # noqa: F401 - public API (one namespace)
    ClusterConfig,
    SamplerResources,
    weight_transport_problem,
)
from posttrain.config.diagnostics import DiagnosticsConfig, RemediesConfig  # noqa: F401 - public API (one namespace)
from posttrain.config.eval_suite import EvalSuiteConfig
from posttrain.config.loop import LoopConfig, SelectionConfig  # noqa: F401 - public API (one namespace)
from posttrain.config.model import LoraConfig, ModelConfig
from posttrain.config.sampling import SamplingConfig, VLLMConfig  # noqa: F401 - public API (one namespace)
from posttrain.config.strict import Strict
from posttrain.config.task import TaskConfig
from posttrain.config.trainer import TrainerConfig, WarmStartConfig


class RunConfig(Strict):
    name: str | None = Field(default=None, description="run name; default: <task>-<timestamp>")
    output_dir: str = Field(default="runs", description="parent folder of run directories")
    seed: int = Field(default=0, description="seeds model init (tiny-random), data order and sampling")


class JudgeConfig(Strict):
    min_agreement: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description=(
            "before training, audit the task's LLM judge against its programmatic verifier (posttrain judge audit) "
            "and refuse to train below this agreement (null: no audit)"
        ),
    )
    min_kappa: float | None = Field(
        default=None,
        ge=-1.0,
        le=1.0,
        description=(
            "like min_agreement, on Cohen's kappa (chance-corrected: the better gate when the verifier "
            "mostly passes or fails)"
        ),
    )
    cache: str | None = Field(
        default="default",
        description=(
            "judge answer cache (sqlite file) for every judge of the task, when set; default: each judge's own "
            "($POSTTRAIN_JUDGE_CACHE or ~/.cache/posttrain/judge_cache.sqlite); null: off"
        ),
    )
    audit_prompts: int = Field(default=16, ge=1, description="audit: held-out prompts sampled")
    audit_samples: int = Field(default=4, ge=1, description="audit: policy completions per prompt")
    audit_temperature: float | None = Field(
        default=None,
        ge=0.0,
        allow_inf_nan=False,
        description="audit: sampling temperature; null: sampling.temperature (what the judge sees in training)",
    )
    audit_swap_rows: bool = Field(
        default=True,
        description=(
            "audit: also judge each completion against another prompt's row "
            "(mostly verifier fails: balances the classes)"
        ),
    )
    audit_injections: int = Field(
        default=16, ge=0, description="audit: failing samples re-judged with each injection probe appended (0: none)"
    )


class LoggingConfig(Strict):
    tensorboard: bool = Field(default=True, description="write TensorBoard events to RUN_DIR/tb when installed")
    console: bool = Field(default=True, description="print progress lines and tables")
    trackio: bool = Field(
        default=False,
        description="also log metrics to trackio (pip install 'posttrain[trackio]'); a missing package only warns",
    )
    wandb: bool = Field(
        default=False,
        description=(
            "also log metrics to Weights & Biases (pip install 'posttrain[wandb]'; WANDB_MODE=offline works); "
            "a missing package only warns"
        ),
    )
    project: str = Field(
        default="posttrain", description="the trackio / W&B project; the run is named after its run directory"
    )


class DebugConfig(Strict):
    rollout_fault_rate: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description=(
            "test only: share of training rollouts made to raise InjectedFault (seeded by run.seed and the sample "
            "index), to check that a failing sample fails only itself (envs/faults.py)"
        ),
    )


class Config(Strict):
    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    lora: LoraConfig = LoraConfig()
    task: TaskConfig = TaskConfig()
    sampling: SamplingConfig = SamplingConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    trainer: TrainerConfig = TrainerConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    loop: LoopConfig = LoopConfig()
    logging: LoggingConfig = LoggingConfig()
    judge: JudgeConfig = JudgeConfig()
    diagnostics: DiagnosticsConfig = DiagnosticsConfig()
    eval_suite: EvalSuiteConfig = EvalSuiteConfig()
    cluster: ClusterConfig = ClusterConfig()
    debug: DebugConfig = DebugConfig()

    # Settings posttrain derived from others because the user left them unset, as "key=value: why". Shown, never
    # silent: `--dry-run` and the run's config.yaml list them as a comment, and the run prints them at its start.
    _derived: list[str] = PrivateAttr(default_factory=list)

    @property
    def derived(self) -> list[str]:
        return list(self._derived)

    @model_validator(mode="after")
    def _check(self) -> Config:
        self._derive_sampler_ratio()
        self._check_loop()
        if self.sampling.engine == "vllm":
            self._check_vllm()
        self._check_cluster()
        self._check_sharding()
        if self.algorithm.epsilon_high is not None and self.algorithm.epsilon_high < self.algorithm.epsilon:
            raise ValueError(
                f"algorithm.epsilon_high ({self.algorithm.epsilon_high}) must be >= algorithm.epsilon "
                f"({self.algorithm.epsilon})"
            )
        return self

    def _derive_sampler_ratio(self) -> None:
        """Where the sampler's arithmetic is not the trainer's: the ratio against the sampler's log-probs."""
        a = self.algorithm
        if self.sampling.precision != "fp32" or self.trainer.precision != "fp32" or self.sampling.engine == "vllm":
            # A sampler whose arithmetic differs from the trainer's is a different policy (a bf16 copy and bf16
            # autocast round differently too): the ratio must be taken against what it sampled, and TIS bounds the
            # correction. Values the user set win.
            why = ", ".join(
                w
                for w, on in (
                    (f"sampling.precision={self.sampling.precision}", self.sampling.precision != "fp32"),
                    (f"trainer.precision={self.trainer.precision}", self.trainer.precision != "fp32"),
                    ("sampling.engine=vllm", self.sampling.engine == "vllm"),
                )
                if on
            )
            for key, value in (("behavior_logprobs", "sampler"), ("is_correction", "truncate")):
                if key not in a.model_fields_set:
                    setattr(a, key, value)  # validated (validate_assignment), and from now on set explicitly
                    self._derived.append(
                        f"algorithm.{key}={value}: {why} samples with other arithmetic than "
                        "the trainer's, so the ratio is taken against the sampler's log-probs"
                    )

    def _check_loop(self) -> None:
        """The loop's mode, warm start and evaluation against the algorithm and the sampling."""
        if self.loop.mode == "async" and self.algorithm.dynamic_sampling:
            raise ValueError("loop.mode=async does not support algorithm.dynamic_sampling yet; use loop.mode=sync")
        if self.loop.mode == "async" and self.algorithm.stepper == "es":
            raise ValueError("algorithm.name=es has no async loop; use loop.mode=sync")
        if self.warm_start.steps and self.algorithm.stepper == "es":
            raise ValueError(
                "warm_start with algorithm.name=es is not supported: the ES seed history replays from the "
                "loaded weights; warm-start in a separate run (loop.steps=0) and load its final/ folder"
            )
        if self.algorithm.rised.enabled and self.algorithm.rised.selection and self.loop.mode == "async":
            raise ValueError(
                "algorithm.rised.selection picks each step's prompts from their profiles, which the async "
                "loop samples ahead of time; use loop.mode=sync or rised.selection=false"
            )
        if self.loop.eval_samples > 1 and self.sampling.eval_temperature == 0:
            raise ValueError(
                f"loop.eval_samples={self.loop.eval_samples} with greedy eval (sampling.eval_temperature=0) "
                "repeats one completion; set sampling.eval_temperature > 0 (e.g. 0.7) or eval_samples=1"
            )

    def _check_cluster(self) -> None:
        """The cluster backend against the engine, LoRA, the algorithm and the sampler's precision."""
        if why := weight_transport_problem(self.cluster.backend, self.sampling.engine, self.cluster.weight_transport):
            raise ValueError(why)
        if (
            self.cluster.backend == "server"
            and self.sampling.engine != "vllm"
            and not (self.cluster.server_url and self.cluster.weights_dir)
        ):
            raise ValueError(
                "cluster.backend=server needs cluster.server_url (the inference server) and "
                "cluster.weights_dir (a folder the trainer writes and the server reads: start it with "
                "posttrain serve --weights-dir DIR)"
            )
        if self.cluster.backend == "server" and self.lora.enabled and self.sampling.engine != "vllm":
            raise ValueError(
                "cluster.backend=server with LoRA is not supported: the server reloads full weights by "
                "name, and a LoRA run's trainable tensors are the adapter's (use cluster.backend=local or "
                "ray, or full fine-tuning)"
            )
        if self.cluster.backend == "server" and self.algorithm.stepper != "policy_gradient":
            raise ValueError(
                "cluster.backend=server samples policy-gradient rollouts; algorithm.name=es scores its "
                "perturbations in process (use cluster.backend=local)"
            )
        if self.cluster.backend == "ray" and self.algorithm.stepper != "policy_gradient":
            raise ValueError(
                "cluster.backend=ray samples policy-gradient rollouts; algorithm.name=es scores its "
                "perturbations in process (use cluster.backend=local)"
            )
        if self.cluster.backend == "ray" and self.sampling.precision != "fp32":
            raise ValueError(
                "cluster.backend=ray sampler actors hold full-precision copies; sampling.precision="
                f"{self.sampling.precision} is for the local backend"
            )

    def _check_sharding(self) -> None:
        """trainer.sharding=fsdp2 against LoRA and Muon."""
        if self.trainer.sharding == "fsdp2" and self.lora.enabled:
            raise ValueError(
                "trainer.sharding=fsdp2 with LoRA is not supported: the KL reference is the policy with its "
                "adapters switched off on rank 0's module, which fsdp2 gives to the sampler, not the "
                "trainer; and the adapters are small enough for every rank to hold. Use "
                "trainer.sharding=none (data parallel)"
            )
        if self.trainer.sharding == "fsdp2" and self.trainer.optimizer == "muon":
            raise ValueError(
                "trainer.sharding=fsdp2 with trainer.optimizer=muon is not supported: Muon orthogonalizes "
                "each whole matrix, and under fsdp2 each rank holds a slice of it. Use "
                "trainer.optimizer=adamw or trainer.sharding=none"
            )

    def _check_vllm(self) -> None:
        if self.algorithm.stepper != "policy_gradient":
            raise ValueError(
                "sampling.engine=vllm samples policy-gradient rollouts; algorithm.name=es perturbs the "
                "weights of the in-process model (use sampling.engine=own)"
            )
        if self.sampling.precision != "fp32":
            raise ValueError(
                "sampling.precision is the own engine's sampler copy; with sampling.engine=vllm set "
                "sampling.vllm.dtype instead"
            )
        if self.cluster.backend == "server" and self.cluster.server_url:
            raise ValueError(
                "cluster.server_url names a server you started; with sampling.engine=vllm posttrain starts "
                "and supervises cluster.num_servers vLLM servers itself: drop one of the two"
            )
        if self.trainer.world_size > 1 and self.cluster.backend == "local":
            raise ValueError(
                "sampling.engine=vllm in process runs beside one trainer rank; with trainer.world_size > 1 "
                "use cluster.backend=server or ray"
            )
