"""What one Ray sampler actor holds: its own copy of the policy, built from the run's config the way the builder
builds the trainer's (models/policy.py `load_base_model` + `with_lora`), behind an HFSampler.

A plain class: ray_sampler.py wraps it with `ray.remote`, so this module imports no Ray and is tested without it.
Ray runs one method of an actor at a time, so a weight load never lands in the middle of a decode and every
completion carries the one policy version it was sampled with.

Weights arrive three ways (cluster/ray_weights.py): `load_weights` (a state from the object store),
`load_from_shared` (a view of the trainer's shared-memory block, when this actor is on the trainer's node) and
`join_weight_group` then `load_from_group` (a bucketed broadcast from the trainer over a gloo group). The join and the
receive are separate calls because the group outlives one push: it is joined once and received from at every push
until the trainer rebuilds it. A receive collects every tensor before loading any, so a broadcast that fails midway
leaves the sampler on its previous version, whole.
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.config.schema import Config
from posttrain.sampling import weight_group as wg
from posttrain.sampling import weight_transfer as wt
from posttrain.types import Completion, SampleParams


class SamplerWorker:
    def __init__(self, cfg: Config, rank: int, incarnation: int = 0):
        """`rank`: the actor's slot in the pool; `incarnation`: how many times that slot was replaced. Both seed
        the sampler, so actors (and a replacement) do not draw the same completions for the same prompt."""
        from posttrain.models.load import stop_token_ids
        from posttrain.models.policy import load_base_model, set_threads, with_lora
        from posttrain.sampling.context import run_budget
        from posttrain.sampling.hf_sampler import HFSampler

        set_threads(cfg)
        torch.manual_seed(cfg.run.seed)
        model, tok = load_base_model(cfg, log=lambda *_: None)
        seed = cfg.run.seed + 7919 * (rank + 1) + 104_729 * incarnation
        if cfg.sampling.engine == "vllm":  # a vLLM engine in this actor; the driver pushes full HF-named weights
            self.sampler = _vllm_engine(cfg, model, tok, seed)
            del model  # the engine holds its own copy
        else:
            model = with_lora(cfg, model).eval()
            self.sampler = HFSampler(model, tok, stop_token_ids(model, tok), seed=seed, context=run_budget(cfg, model))
        self.sampler.set_version(-1)  # serves nothing the driver pushed until its first load_weights
        self._group: Any = None  # the weight group this actor last joined, and its name
        self._group_name = ""

    def ready(self) -> dict[str, Any]:
        """Where this actor runs (the node id lets tests and logs see the placement) and what it serves."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "version": self.sampler.policy_version,
            "max_context": self.sampler.context.max_context,
        }

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        """The trainer's trainable tensors (the adapter alone under LoRA), as `version`."""
        self.sampler.load_weights(state, version)
        return version

    def load_from_shared(self, layout_json: str, version: int) -> int:
        """Same node as the trainer: every tensor of the layout read from its shared-memory block (`shm` in the
        layout) and copied into the sampler, again if a refill tore the copy; the views are dropped before the block
        is unmapped."""
        specs, _, extra = wt.parse_layout(layout_json)
        wt.load_shared(extra["shm"], specs, lambda items: self.sampler.load_weights(dict(items), version))
        return version

    def join_weight_group(self, args_json: str) -> dict[str, Any]:
        """Join the trainer's weight group by its invitation (sampling/weight_group.py: the trainer is rank 0 and
        hosts the store; the invitation carries the group's secret); blocks until every member joined and presented
        the group's tag, at most about `timeout_s`. Replaces the group joined before, whose sockets close with it."""
        inv = wg.Invitation.from_json(args_json)
        self._group, self._group_name = None, ""
        self._group = wg.open_group(inv)
        self._group_name = inv.name
        return {"name": inv.name, "rank": inv.rank}

    def load_from_group(self, layout_json: str, version: int) -> int:
        """Receive the trainer's broadcast of the layout over the group named in it, then load it as `version`.
        A failed receive (a peer died, the group's timeout passed) drops the group: the trainer rebuilds it."""
        specs, buckets, extra = wt.parse_layout(layout_json)
        if self._group is None or extra["name"] != self._group_name:
            raise RuntimeError(f"not a member of weight group {extra['name']!r} (joined: {self._group_name!r})")
        try:
            # Views of the received buckets: the state is held once here (as the object store path holds it)
            # and the sampler copies it in only when all of it arrived.
            # Each bucket is checked against its digest as it arrives: a forged one fails the load before any is.
            state = dict(wg.iter_received(self._group, specs, buckets, extra["nonce"], extra["digests"]))
        except BaseException:
            self._group, self._group_name = None, ""
            raise
        self.sampler.load_weights(state, version)
        return version

    def sample_rows(self, rows: list[list[int]], params: SampleParams) -> list[Completion]:
        """One completion per row (identical rows share their prefill), stamped with this actor's version."""
        return [c for (c,) in self.sampler.sample_sync(rows, params, n=1)]


def _vllm_engine(cfg: Config, model: Any, tok: Any, seed: int) -> Any:
    """The actor's engine, started from the base model's folder (written to a private folder when the model has
    none); seeded per actor and incarnation like the own sampler."""
    from dataclasses import replace

    from posttrain.models.load import stop_token_ids
    from posttrain.sampling.context import run_budget
    from posttrain.sampling.engines import engine_model_dir, engine_spec, work_dir
    from posttrain.sampling.vllm_engine import VLLMSampler

    spec = engine_spec(cfg, model, engine_model_dir(cfg, model, tok, work_dir(cfg), log=lambda *_: None))
    return VLLMSampler(
        replace(spec, seed=seed),
        tok,
        stop_token_ids(model, tok),
        log=lambda *_: None,
        context=run_budget(cfg, model, spec.max_model_len),
        in_flight=cfg.sampling.vllm.weight_update == "in_flight",
    )
