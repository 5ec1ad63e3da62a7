"""Every setting of a run, as pydantic models. Importable without torch.

Each model forbids unknown keys, so a typo is an error that names the nearest valid key (see load.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from posttrain.config.algorithm import (  # noqa: F401 - re-exported: the schema is one namespace
    ALGORITHM_PRESETS,
    AlgorithmConfig,
    ESConfig,
    HintDistillConfig,
    InsightsConfig,
    RisedConfig,
    TeacherConfig,
)
from posttrain.config.cluster import ClusterConfig, SamplerResources, weight_transport_problem  # noqa: F401 - re-exported
from posttrain.config.diagnostics import DiagnosticsConfig, RemediesConfig  # noqa: F401 - re-exported
from posttrain.config.eval_suite import EvalSuiteConfig
from posttrain.config.strict import _Strict


class RunConfig(_Strict):
    name: str | None = Field(default=None, description="run name; default: <task>-<timestamp>")
    output_dir: str = Field(default="runs", description="parent folder of run directories")
    seed: int = Field(default=0, description="seeds model init (tiny-random), data order and sampling")


class ModelConfig(_Strict):
    name: str = Field(
        default="default",
        description="'default' (SmolLM2-135M-Instruct), 'tiny-random', a local HF folder, or a hub id",
    )
    device: str = Field(default="auto", description="auto (cuda when present, else cpu), cpu, cuda or cuda:N")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="auto: bfloat16 on a GPU, float32 on the CPU"
    )
    threads: int | None = Field(default=None, ge=1, description="torch threads; default: all cores")
    attn_implementation: str = Field(
        default="sdpa", description="transformers attention backend (sdpa, eager, flash_attention_2)"
    )
    cpu_matmul: Literal["auto", "onednn", "mkl"] = Field(
        default="auto",
        description=(
            "fp32 Linear layers on the CPU: onednn (oneDNN's inner product for every product), mkl (torch's default), "
            "or auto: MKL on Intel CPUs; elsewhere oneDNN for decode (1.3-1.85x MKL on AMD EPYCs) and for training "
            "where torch runs AVX-512 kernels (1.57x; on AVX2 oneDNN trains 0.75x as fast); models/matmul.py"
        ),
    )

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        import re

        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", v):
            raise ValueError(f"model.device must be auto, cpu, cuda or cuda:N, got {v!r}")
        return v


class LoraConfig(_Strict):
    enabled: bool = Field(default=False, description="train LoRA adapters (peft) instead of all weights")
    r: int = Field(default=16, ge=1, description="adapter rank")
    alpha: float = Field(default=32.0, description="LoRA scaling numerator (scale = alpha / r)")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="dropout on the adapter input")
    target_modules: list[str] = Field(
        default=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="module names that get adapters",
    )


# The answer formats of rewards/extract.py EXTRACTORS (a test holds the two lists equal; config imports no rewards).
ANSWER_FORMATS = ("auto", "answer_tag", "boxed", "last_line", "last_number", "none")
# Keys that only mean something for a task built from data (task.dataset).
DATASET_KEYS = (
    "split",
    "prompt_column",
    "prompt_template",
    "system_prompt",
    "chat",
    "eval_split",
    "eval_fraction",
    "max_rows",
)


class TaskConfig(_Strict):
    @field_validator("env_check", mode="before")
    @classmethod
    def _yaml_off(cls, v):
        # YAML reads a bare `off` as false (and `on` as true): accept what the user meant.
        return {False: "off", True: "refuse"}.get(v, v) if isinstance(v, bool) else v

    name: str = Field(
        default="json-extract", description="a built-in task name, 'path/file.py:make_task' or 'pkg.module:make_task'"
    )
    options: dict = Field(default_factory=dict, description="keyword arguments for the task factory")
    rewards: list[dict] = Field(
        default_factory=list,
        description=(
            "rewards added to the task's rubric (a task.dataset task's only rewards), e.g. [{fn: math}] or "
            "[{fn: reward_model, path: DIR, weight: 1.0}]; fn: math, exact, numeric, contains, regex, choice, "
            "json_schema, format, length (docs/datasets.md), reward_model or embedding_margin (docs/reward_models.md); "
            "each entry takes weight, name, pass (true: it decides the pass) and the reward's options"
        ),
    )
    answer_format: Literal["auto", "answer_tag", "boxed", "last_line", "last_number", "none"] = Field(
        default="auto",
        description=(
            "how the named rewards read the answer from a completion (rewards/extract.py): auto (<answer> tags, else "
            "the last \\boxed{}, else the last line), answer_tag, boxed, last_line, last_number or none (the whole "
            "text); an entry's own answer_format wins"
        ),
    )
    dataset: str | None = Field(
        default=None,
        description=(
            "build the task from data instead of task.name: a local .jsonl, .json, .parquet, .csv or .arrow file, a "
            "folder of such files named by split (train.jsonl, test.parquet), a `datasets` save_to_disk folder, or a "
            "dataset name in the local Hugging Face cache (never downloaded); needs task.rewards (docs/datasets.md)"
        ),
    )
    split: str = Field(default="train", description="task.dataset: the split trained on")
    prompt_column: str = Field(
        default="prompt",
        description=("task.dataset: the column holding the prompt, a string or a list of chat messages"),
    )
    prompt_template: str | None = Field(
        default=None,
        description=(
            "task.dataset: build the prompt from the row's columns instead, a Python format string such as "
            "'Solve: {question}' (literal braces doubled: \\boxed{{}})"
        ),
    )
    system_prompt: str | None = Field(
        default=None,
        description=(
            "task.dataset: a system message put before each prompt (a string prompt becomes a chat user message)"
        ),
    )
    chat: bool | None = Field(
        default=None,
        description=(
            "task.dataset: true: a string prompt becomes a chat user message, rendered with the model's chat template; "
            "null: as the data has it (a string is raw text, TRL's convention), unless system_prompt is set"
        ),
    )
    eval_split: str | None = Field(
        default=None,
        description=(
            "task.dataset: the split held out for evaluation (e.g. test); default: eval_fraction of the train split"
        ),
    )
    eval_fraction: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description=(
            "task.dataset: the share of the train split held out (seeded by run.seed); default: 10%, at most 64 rows"
        ),
    )
    max_rows: int | None = Field(
        default=None, ge=1, description="task.dataset: read at most this many rows of each split"
    )
    reward_timeout_s: float = Field(
        default=60.0,
        gt=0.0,
        description="seconds one reward-function call may take; past it the samples count as failed",
    )
    max_observation_chars: int | None = Field(
        default=None,
        ge=1,
        description=(
            "multi-turn tasks: the most characters of one tool result or env observation the model reads back (the "
            "rest cut with a marker); default: the task's own (8000 unless it says); docs/limits.md"
        ),
    )
    subset: str | None = Field(
        default=None,
        description=(
            'a JSON file {"train": [row indices], "eval": [row indices]} keeping only those rows of the task, e.g. '
            "the rows where the model's pass@16 is 0 (bench/feedback.py select writes one)"
        ),
    )
    env_check: Literal["refuse", "warn", "off"] = Field(
        default="refuse",
        description="run the task's smoke checks before training (posttrain env check); on failure refuse or warn",
    )

    @model_validator(mode="after")
    def _dataset_keys(self) -> TaskConfig:
        # Compared with the defaults, not model_fields_set: a run's config.yaml (resume) sets every key.
        changed = [k for k in ("name", *DATASET_KEYS) if getattr(self, k) != type(self).model_fields[k].default]
        if self.dataset is None:
            stray = [k for k in changed if k != "name"]
            if stray:
                raise ValueError(f"task.{stray[0]} is for a task built from data: set task.dataset too")
            return self
        if "name" in changed or self.options:
            raise ValueError(
                "task.dataset builds the task from data; task.name / task.options name a task of code: "
                "set one or the other"
            )
        if self.eval_split is not None and self.eval_fraction is not None:
            raise ValueError(
                "set task.eval_split (a split of the data) or task.eval_fraction (a share of the train split), not both"
            )
        return self

    @property
    def label(self) -> str:
        """What the task is called in run names: the data's file or dataset name, else task.name."""
        if self.dataset is None:
            return self.name
        from pathlib import PurePath

        return PurePath(self.dataset.rstrip("/")).stem or "dataset"


class VLLMConfig(_Strict):
    """sampling.engine=vllm: how the vLLM engines are started (in process, inside Ray sampler actors, or as servers)."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description=(
            "the engine's weights: auto = the trainer's (model.dtype); bfloat16 on a CPU engine measured 0.03 mean / "
            "0.41 max |log-prob| off the fp32 trainer (the truncated-IS correction takes it)"
        ),
    )
    kv_cache_gb: float = Field(
        default=1.0,
        gt=0.0,
        description="KV-cache memory per engine in GiB (CPU build; on a GPU see gpu_memory_utilization)",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        description="longest prompt + completion an engine accepts; default: the model's limit, at most 4096",
    )
    compile: bool = Field(
        default=False,
        description=(
            "torch.compile and CUDA graphs in the engine (vLLM's default); false (enforce_eager) starts in seconds "
            "instead of minutes, which is what tests and CPU runs want"
        ),
    )
    gpu_memory_utilization: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description=(
            "GPU build: the share of GPU memory the engine may take (weights + KV cache); the rest is the trainer's"
        ),
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPU build: GPUs one engine shards the model over")
    sleep_mode: bool = Field(
        default=False,
        description=(
            "GPU build: put the engine to sleep (weights offloaded, KV cache freed) while the trainer steps; the CPU "
            "build refuses it"
        ),
    )
    lora: Literal["adapter", "merged"] = Field(
        default="adapter",
        description=("with lora.enabled: push the adapter alone (vLLM's LoRA) or the merged full weights each step"),
    )
    weight_update: Literal["wait", "in_flight"] = Field(
        default="wait",
        description=(
            "how a push meets the requests an engine is generating: wait (they finish on the old weights first: one "
            "version per completion) or in_flight (generation pauses between tokens and the same requests continue on "
            "the new weights, each token stamped with its version; the loss corrects per token); for loop.mode=async"
        ),
    )
    extra: dict = Field(
        default_factory=dict, description="more vllm.LLM / server keyword arguments, passed through as given"
    )


class SamplingConfig(_Strict):
    engine: Literal["own", "vllm"] = Field(
        default="own",
        description=(
            "what samples rollouts: own (posttrain's decode loop, no extra dependency) or vllm (pip install "
            "'posttrain[vllm]'; in process with cluster.backend=local, inside the sampler actors with ray, as "
            "supervised servers with server; docs/engines.md). Eval, the env check and the judge audit keep "
            "the own loop"
        ),
    )
    vllm: VLLMConfig = VLLMConfig()
    max_tokens: int | None = Field(default=None, ge=1, description="new tokens per completion; default: the task's")
    max_context: int | None = Field(
        default=None,
        ge=16,
        description=(
            "the most tokens a prompt and its completion may take together; default: the model's positions (and an "
            "engine's max_model_len). A sampling call past it fails that sample alone, a multi-turn episode that grows "
            "past it ends with a context stop and is trained on as truncated (sampling/context.py)"
        ),
    )
    context_overflow: Literal["fail", "truncate"] = Field(
        default="fail",
        description=(
            "a prompt whose max_tokens do not fit the context: fail that sample with the reason, or cut its max_tokens "
            "to what fits (at least 16 tokens)"
        ),
    )
    temperature: float = Field(
        default=0.7, ge=0.0, description="training rollouts; the trainer scores tokens at the same temperature"
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling (1 = off)")
    top_k: int = Field(default=0, ge=0, description="top-k sampling (0 = off)")
    stop: list[str] | None = Field(
        default=None,
        description="stop strings (the text is cut before the stop; the tokens keep it); null: the task's, []: none",
    )
    cuda_graphs: bool = Field(
        default=False,
        description=(
            "GPU decode fast path: a static KV cache and the decode step replayed as a CUDA graph (torch.compile "
            "reduce-overhead, compiled once per batch/length bucket; sampling/graph_decode.py); LoRA samplers decode "
            "eagerly; on a CPU the same loop runs uncompiled"
        ),
    )
    eval_temperature: float = Field(default=0.0, ge=0.0, description="0 = greedy held-out eval")
    prefix_cache_tokens: int = Field(
        default=32768,
        ge=0,
        description=(
            "multi-turn episodes: keep each turn's KV cache (at most this many tokens, least recently used dropped) so "
            "the next turn prefills only its new tokens; dropped at every weight change; 0 = off "
            "(sampling/prefix_cache.py; about 46 KB per token for the default model in fp32)"
        ),
    )
    precision: Literal["fp32", "bf16", "int8"] = Field(
        default="fp32",
        description=(
            "rollout sampler's weights: fp32 (shares the trainer's), or a bf16 / int8 copy refreshed at each sync; "
            "not fp32 makes algorithm.behavior_logprobs default to sampler and is_correction to truncate"
        ),
    )
    packed_weights: Literal["auto", "on", "off"] = Field(
        default="auto",
        description=(
            "CPU decode with the sampler's Linear weights packed once by oneDNN at each sync instead of re-packed by "
            "every matmul (sampling/packed_linear.py). auto: pack whenever the sampler holds a copy of its own (a "
            "bf16 copy, or the async loop's fp32 copy unless it has LoRA adapters) and the CPU can pack that dtype; "
            "on: also give the sync loop's "
            "fp32 sampler a packed copy of its own (one more copy of the weights in memory); off: never. int8 and GPU "
            "samplers are not packed"
        ),
    )

    @field_validator("packed_weights", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):
        """YAML (and so the command line) reads on/off as booleans."""
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class TrainerConfig(_Strict):
    lr: float = Field(default=2e-5, gt=0.0, description="AdamW learning rate")
    weight_decay: float = Field(default=0.0, ge=0.0, description="AdamW weight decay")
    betas: tuple[float, float] = Field(default=(0.9, 0.99), description="AdamW betas")
    max_grad_norm: float = Field(default=1.0, gt=0.0, description="gradient clipping; a non-finite norm skips the step")
    warmup_steps: int = Field(default=0, ge=0, description="linear learning-rate warmup")
    optimizer: Literal["adamw", "muon"] = Field(
        default="adamw", description="adamw, or muon (Muon on 2-D hidden weight matrices, AdamW on the rest)"
    )
    muon_momentum: float = Field(default=0.95, ge=0.0, lt=1.0, description="Muon momentum")
    micro_batch_tokens: int = Field(
        default=4096, ge=64, description="tokens per forward/backward micro-batch (gradient accumulation above it)"
    )
    prefix_sharing: bool = Field(default=True, description="compute each group's shared prompt once")
    logits_chunk_tokens: int = Field(
        default=0,
        ge=0,
        description=(
            "> 0: compute log-probs and entropy through the output projection in chunks of this many tokens, "
            "recomputed in backward, so a micro-batch's full B x T x vocab logits are never held (0: off)"
        ),
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description=(
            "activation checkpointing: keep only each decoder layer's input for backward and re-run the layer there "
            "(less memory for long or many sequences, about a third more train compute)"
        ),
    )
    precision: Literal["fp32", "bf16"] = Field(
        default="fp32",
        description=(
            "the log-prob passes' arithmetic: fp32, or bf16 (mixed precision: forward and backward under bf16 "
            "autocast, weights, gradients and optimizer state stay fp32, log-softmax in fp32). On a CPU with AVX-512 "
            "BF16 a forward and backward ran 1.7x faster alone, the RL update about 1.2x, and json-extract learned "
            "less over 3 seeds (docs/results/speed.md); slower where the CPU has no bf16 arithmetic. It makes "
            "algorithm.behavior_logprobs default to sampler and is_correction to truncate"
        ),
    )
    world_size: int = Field(
        default=1,
        ge=1,
        description="trainer processes (data parallel, gloo on CPU / NCCL on GPU); under torchrun its WORLD_SIZE wins",
    )
    dist_timeout_s: float = Field(
        default=600.0, gt=0.0, description="seconds a collective between trainer ranks may wait before the run fails"
    )
    sharding: Literal["none", "fsdp2"] = Field(
        default="none",
        description=(
            "with world_size > 1: none (every rank a full copy, gradients all-reduced) or fsdp2 (torch fully_shard per "
            "decoder layer: weights, gradients and optimizer state sharded over the ranks, a layer gathered while it "
            "computes; rank 0's sampler keeps its own full copy, refreshed by a gather at each sync; not with LoRA or "
            "Muon); "
            "with one rank there is nothing to shard"
        ),
    )


class WarmStartConfig(_Strict):
    steps: int = Field(
        default=0,
        ge=0,
        description="supervised steps on the task's demonstrations before RL (0: off; needs a task with `demonstrate`)",
    )
    lr: float = Field(
        default=5e-5, gt=0.0, description="learning rate of the warm start (its own AdamW, dropped after)"
    )
    batch_size: int = Field(default=8, ge=1, description="demonstrations per warm-start step")
    demos: int = Field(
        default=0,
        ge=0,
        description=(
            "training rows turned into demonstrations, the first N (0: all); leave RL rows it has not seen: after a "
            "warm start on every row most groups can pass whole, and RL has little left "
            "to learn (docs/results/learning.md)"
        ),
    )
    eval: bool | None = Field(
        default=None,
        description=(
            "evaluate the warm-started model before RL (the run's 'before' eval, the base of its RL gain); null: as "
            "loop.eval_before, which otherwise governs only the base model's eval. loop.eval_before=false "
            "warm_start.eval=true skips the base model's eval alone"
        ),
    )


class SelectionConfig(_Strict):
    replay_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "adaptive: share of each step's prompts replayed from the learnable ones (seen, not all passed, not "
            "hopeless), least recently seen first; the rest are fresh prompts in the run's seeded order"
        ),
    )
    retire_after: int = Field(
        default=1,
        ge=1,
        le=8,
        description=("adaptive: a prompt whose last N groups all passed is retired (drawn again only as a revisit)"),
    )
    backoff_after: int = Field(
        default=2,
        ge=1,
        le=8,
        description=(
            "adaptive: a prompt whose last N groups had no pass and no reward spread is backed off until a remedy "
            "changes how rollouts are sampled (or a revisit)"
        ),
    )
    revisit_every: int = Field(
        default=20,
        ge=1,
        description=(
            "adaptive: a retired or backed-off prompt is drawn again at most once per this many steps, so forgetting "
            "or a late first pass shows"
        ),
    )
    revisit_slots: int = Field(default=1, ge=0, description="adaptive: prompts per step given to revisits at most")


class LoopConfig(_Strict):
    steps: int = Field(default=60, ge=0, description="optimizer steps (each on a fresh batch of rollouts)")
    prompts_per_step: int = Field(default=4, ge=1, description="prompts per step; completions per step = this x G")
    num_iterations: int = Field(default=1, ge=1, description="optimizer passes over each batch")
    eval_every: int = Field(default=0, ge=0, description="held-out eval every N steps (0: only before and after)")
    eval_prompts: int = Field(default=48, ge=1, description="held-out prompts per evaluation")
    eval_before: bool = Field(
        default=True, description="evaluate before training (skip it when comparing many runs of one model)"
    )
    eval_samples: int = Field(
        default=1,
        ge=1,
        description=(
            "completions per held-out prompt; > 1 needs sampling.eval_temperature > 0 "
            "(pass_rate is then sampled pass@1)"
        ),
    )
    time_budget_s: float | None = Field(
        default=None, gt=0.0, description="stop after the step that uses up this much training time"
    )
    save_every: int = Field(default=10, ge=0, description="checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = Field(
        default=2,
        ge=0,
        description=(
            "checkpoints kept on disk (oldest removed); 0: never write one (no resume; final/ is still exported)"
        ),
    )
    samples_per_step: int = Field(default=2, ge=0, description="rollouts per step written to samples.jsonl")
    final_model: Literal["best", "last"] = Field(
        default="best",
        description=(
            "what final/ holds: the model of the held-out eval with the best loop.best_metric (ties go to the later "
            "step; RUN_DIR/best/ keeps it as the run goes), or the last step's; the run says which step final/ is"
        ),
    )
    best_metric: str = Field(
        default="eval/pass_rate",
        description=(
            "the held-out metric (higher is better) that picks the best model, e.g. eval/pass_rate, eval/reward/mean, "
            "eval/pass/<component>"
        ),
    )
    mode: Literal["sync", "async"] = Field(
        default="sync", description="async: rollout workers fill a queue while the trainer trains"
    )
    max_staleness: int = Field(
        default=1, ge=0, description="async: policy versions a trained token may lag behind (admission control)"
    )
    interruptible: bool = Field(
        default=True,
        description=(
            "async: a weight sync lands between two decode steps of a generation in flight instead of waiting for it "
            "to end; each token records the policy version it was sampled under (AReaL's interruptible generation)"
        ),
    )
    rollout_workers: int | None = Field(
        default=None,
        ge=1,
        description="async: groups in flight at most; default prompts_per_step x (max_staleness + 1)",
    )
    batch_timeout_s: float = Field(
        default=3600.0,
        gt=0.0,
        description="async: seconds the trainer waits for a step's groups before failing the run",
    )
    prompt_selection: str = Field(
        default="uniform",
        description=(
            "how each step's prompts are drawn (algos/prompt_selection.py): uniform (epochs over a seeded shuffle) or "
            "adaptive (replay prompts the policy sometimes fails, retire mastered ones, back off ones nothing passes; "
            "loop.selection.*). With algorithm.rised.selection on, RISED picks instead (the run's start line says so)"
        ),
    )
    selection: SelectionConfig = Field(default_factory=SelectionConfig)

    @field_validator("prompt_selection")
    @classmethod
    def _known_selection(cls, v: str) -> str:
        from posttrain.algos.prompt_selection import SELECTIONS

        if v not in SELECTIONS:  # the registry's message names the nearest known one
            try:
                SELECTIONS[v]
            except KeyError as e:
                raise ValueError(str(e)) from None
        return v


class JudgeConfig(_Strict):
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


class LoggingConfig(_Strict):
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


class DebugConfig(_Strict):
    rollout_fault_rate: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description=(
            "test only: share of training rollouts made to raise InjectedFault (seeded by run.seed and the sample "
            "index), to check that a failing sample fails only itself (envs/faults.py)"
        ),
    )


class Config(_Strict):
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
        if self.sampling.engine == "vllm":
            self._check_vllm()
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
        if self.algorithm.epsilon_high is not None and self.algorithm.epsilon_high < self.algorithm.epsilon:
            raise ValueError(
                f"algorithm.epsilon_high ({self.algorithm.epsilon_high}) must be >= algorithm.epsilon "
                f"({self.algorithm.epsilon})"
            )
        return self

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
