"""The `cluster:` section: where rollouts are sampled, code is graded and episodes run (local, Ray, servers)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from posttrain.config.strict import Strict


class SamplerResources(Strict):
    num_cpus: float = Field(
        default=1.0,
        gt=0.0,
        description="CPUs Ray reserves for each sampler actor (its torch threads are model.threads)",
    )
    num_gpus: float = Field(
        default=0.0, ge=0.0, description="GPUs per sampler actor (fractions share one GPU; 0: the actor samples on CPU)"
    )


class ClusterConfig(Strict):
    backend: Literal["local", "ray", "server"] = Field(
        default="local",
        description=(
            "where rollouts are sampled: local (in this process, no Ray) or ray (sampler actors, each with its own "
            "copy of the policy; pip install 'posttrain[ray]'; docs/scaling.md) or server (an OpenAI-compatible "
            "inference server at cluster.server_url, weights pushed through cluster.weights_dir)"
        ),
    )
    address: str = Field(
        default="auto",
        description=(
            "ray: the cluster to use: auto (the one this process or RAY_ADDRESS points at), local (start a private "
            "Ray on this machine, shut down with the run) or ray://host:port (Ray Client)"
        ),
    )
    num_samplers: int = Field(
        default=1, ge=1, description="ray: sampler actors; a call's prompts are split across the live ones"
    )
    sampler_resources: SamplerResources = SamplerResources()
    placement: Literal["spread", "pack"] = Field(
        default="spread",
        description=(
            "ray: placement-group strategy of the sampler actors: spread across nodes (soft), or pack onto few"
        ),
    )
    actor_timeout_s: float = Field(
        default=600.0,
        gt=0.0,
        description=(
            "ray: seconds an actor may take to start, load weights or answer one sample call before it counts as failed"
        ),
    )
    max_restarts: int = Field(
        default=3,
        ge=0,
        description=(
            "ray: times each sampler actor (and, with envs=ray, each env worker) is replaced after it dies or hangs (a "
            "new sampler gets the current weights and the rows again; the episodes of a lost env worker run again); "
            "past it the actor is retired and the live ones take its share; with none left the run fails"
        ),
    )

    sandbox: Literal["local", "ray"] = Field(
        default="local",
        description=(
            "where sandboxed code runs and is graded: local (threads of this process) or ray (Ray tasks spread over "
            "the cluster at cluster.address, any sampling backend; docs/scaling.md)"
        ),
    )
    grader_num_cpus: float = Field(
        default=1.0,
        gt=0.0,
        description=(
            "sandbox=ray: CPUs Ray reserves for each sandboxed run (a run at once per reserved slot on each node)"
        ),
    )
    grade_timeout_s: float = Field(
        default=600.0,
        gt=0.0,
        description=(
            "sandbox=ray: seconds one remote run may take, queueing included, before it fails its sample (the "
            "sandbox's own limits still bound the code; this bounds a lost node or a full cluster)"
        ),
    )
    grade_retries: int = Field(
        default=2,
        ge=0,
        description=(
            "sandbox=ray: times Ray re-runs a sandboxed run whose worker or node died (a grader's own error is never "
            "retried: it fails its sample)"
        ),
    )

    envs: Literal["local", "ray"] = Field(
        default="local",
        description=(
            "where a tool task's episodes keep their tools and state: local (this process) or ray "
            "(cluster.num_env_workers actors spread over the cluster; an episode whose worker dies runs again from its "
            "start on a live one; docs/scaling.md)"
        ),
    )
    num_env_workers: int = Field(
        default=2, ge=1, description="envs=ray: env-worker actors; each episode lives on one of them"
    )
    env_worker_num_cpus: float = Field(
        default=1.0, gt=0.0, description="envs=ray: CPUs Ray reserves for each env worker"
    )
    env_worker_concurrency: int = Field(
        default=16,
        ge=1,
        description=(
            "envs=ray: tool calls one env worker runs at once (its threads; a tool that hangs holds one until the "
            "process ends, as a local tool holds a thread)"
        ),
    )

    server_url: str | None = Field(
        default=None,
        description=(
            "server: the OpenAI-compatible server rollouts are sampled from (posttrain serve --weights-dir DIR, or "
            "vLLM / SGLang with a reload endpoint); it must return token ids and per-token logprobs"
        ),
    )
    server_model: str | None = Field(
        default=None, description="server: the served model's name (default: the first of /v1/models)"
    )
    server_api_key: str | None = Field(
        default=None,
        description=(
            "server: the key sent as `Authorization: Bearer` on sampling and weight-reload requests (posttrain serve "
            "--api-key); default: the environment's POSTTRAIN_API_KEY"
        ),
    )
    weights_dir: str | None = Field(
        default=None,
        description=(
            "server: a folder the trainer writes weights.safetensors to and the server reloads from at every sync"
        ),
    )
    num_servers: int = Field(
        default=1,
        ge=1,
        description=(
            "server with sampling.engine=vllm: vLLM servers posttrain starts, supervises (a dead or hung one "
            "restarted, its rows sampled again) and pushes weights into each step"
        ),
    )
    server_start_timeout_s: float = Field(
        default=300.0,
        gt=0.0,
        description=(
            "server with sampling.engine=vllm: seconds a vLLM server may take to start before it counts as failed"
        ),
    )
    server_timeout_s: float = Field(
        default=300.0,
        gt=0.0,
        description=(
            "server: seconds one sampling request or one weight reload may take "
            "(each retried a bounded number of times)"
        ),
    )

    weight_transport: Literal["auto", "shared_memory", "group", "file", "object_store"] = Field(
        default="auto",
        description=(
            "how each step's weights reach the engines: shared_memory (one shared block the engines on this host load "
            "in place), group (a bucketed broadcast over a torch.distributed group the engines join: gloo on CPU, NCCL "
            "on GPU; the path to engines on other hosts), file (a safetensors file each engine reloads) or "
            "object_store (ray: Ray's object store). auto: shared_memory for vLLM servers (they run on this host); for "
            "Ray sampler actors, shared memory to the actors on this host and the group to the others; docs/engines.md"
        ),
    )
    weight_bucket_mb: float = Field(
        default=64.0,
        gt=0.0,
        description=(
            "weight_transport=group: MB per broadcast bucket (an engine loads one bucket while the next is on the wire)"
        ),
    )

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if v not in ("auto", "local") and not v.startswith("ray://"):
            raise ValueError(f"cluster.address must be auto, local or ray://host:port, got {v!r}")
        return v


# Which transports each setup can use (auto picks for it; loop/wiring.py).
_TRANSPORTS = {
    ("server", "vllm"): {"shared_memory", "group", "file"},
    ("ray", "vllm"): {"shared_memory", "group", "object_store"},
    ("ray", "own"): {"shared_memory", "group", "object_store"},
    ("server", "own"): {"file"},
}


def weight_transport_problem(backend: str, engine: str, transport: str) -> str | None:
    """Why `cluster.weight_transport` cannot serve this setup, or None."""
    if transport == "auto":
        return None
    allowed = _TRANSPORTS.get((backend, engine), set())
    if transport in allowed:
        return None
    where = (
        f"cluster.backend={backend} with sampling.engine={engine}"
        if backend != "local"
        else "cluster.backend=local (the sampler is in this process: its weights are shared, nothing moves)"
    )
    return (
        f"cluster.weight_transport={transport} does not apply to {where}; "
        f"{'use one of ' + ', '.join(sorted(allowed)) + ' or auto' if allowed else 'leave it auto'}"
    )
