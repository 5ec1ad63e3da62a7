"""vLLM as the rollout engine, in this process: the `Sampler` protocol over a `vllm.LLM` (sampling.engine=vllm).

    engine = VLLMSampler(EngineSpec(...), tokenizer, stop_token_ids)
    await engine.sample(prompts_P, params, n)     token ids in, token ids + processed log-probs + version out
    engine.load_weights(named_tensors, version)   full weights, in place (the worker's reload_weights)
    engine.load_adapter(folder, version)          LoRA: a new adapter id, the old one dropped
    engine.close()

What vLLM gives: paged KV memory, continuous batching, prefix caching, tensor-parallel inference, its kernels. What
this module adds is what RL needs from it:

- **Tokens in, tokens out.** Prompts go in as token ids (never re-tokenized); completions come back as token ids
  with the log-prob of each sampled token under the processed distribution (`logprobs_mode=processed_logprobs`:
  after temperature, top-k and top-p, our convention), the stop strings cut from the text only.
- **Weights in place.** A push runs the worker's `reload_weights` on the trainer's tensors (vLLM repacks them into
  its kernel layout; on the CPU build the model's own `load_weights` cannot, because the CPU linear layers hold
  repacked weights), then resets the prefix cache: without the reset, prompts whose KV was cached under the old
  weights come back with the old weights' tokens. Under LoRA only the adapter moves (`load_adapter`, vLLM's LoRA).
- **One version per call, or updates in flight.** By default a weight push and a `generate` call take turns on one
  lock, so every completion of a call comes from one policy version. With `in_flight=True`
  (sampling.vllm.weight_update=in_flight) a push made while a call generates is applied by the generating thread
  between two engine steps (a token boundary): the weights change, the running requests are preempted so their KV
  is recomputed under the new weights, and the same requests continue, no request dropped or restarted. Either
  way the version is the engine's own record of what it loaded (`get_weight_version`), set after the reload, and
  vLLM stamps each token with the version that sampled it (`weight_versions` spans), so a completion that spans a
  push says so token by token.
- **The process stays ours.** vLLM's CPU worker replaces `torch.set_num_threads` with a no-op and binds OpenMP
  threads to cores; colocated with the trainer that would freeze the trainer's thread count, so both are put back
  after the engine starts (and the engine is told not to bind).

Not here: a per-request seed (`SamplingParams.seed`) stops the CPU engine in 0.32, so the engine is seeded once at
start (`EngineSpec.seed`) and per-call seeds are ignored; vLLM runs are therefore not bit-reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.sampling.coalesce import Coalescer
from posttrain.sampling.constrained import vllm_structured
from posttrain.sampling.context import ContextBudget
from posttrain.sampling.vllm_common import (
    EngineSpec,
    VLLMUnavailable,
    as_version,
    check_rows,
    completion_from,
    import_vllm,
    is_cpu_build,
    sampling_params,
)
from posttrain.types import Completion, SampleParams

log = logging.getLogger(__name__)


class StaleEngineError(RuntimeError):
    """The engine serves another policy version than the trainer pushed (a missed or lost push)."""


_live: list[Any] = []  # the engine alive in this process (vLLM's parallel state is process-global)


@dataclass
class _PendingPush:
    """A weight change waiting for the generating thread's next step; `done` is set when applied or failed."""

    change: Any
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class VLLMSampler:
    """The Sampler protocol over one in-process `vllm.LLM`."""

    def __init__(
        self,
        spec: EngineSpec,
        tokenizer: Any,
        stop_token_ids: list[int],
        log=print,
        context: ContextBudget | None = None,
        in_flight: bool = False,
        push_timeout_s: float = 600.0,
    ):
        if _live:
            # Measured: a second engine in one process re-initialises vLLM's process-global parallel groups, and
            # closing either one tears them down under the other ("pipeline model parallel group is not
            # initialized"). One engine per process; more engines: servers or Ray actors.
            raise VLLMUnavailable(
                "a vLLM engine is already running in this process (one per process: close it "
                "first, or use cluster.backend=server / ray for more engines)"
            )
        self.vllm = import_vllm()
        self.spec, self.tokenizer = spec, tokenizer
        self.stop_token_ids = list(stop_token_ids)
        self.cpu = is_cpu_build(self.vllm)
        spec.check(self.cpu)
        import torch

        set_threads, threads = torch.set_num_threads, torch.get_num_threads()
        self.threads = threads  # the CPU attention kernel checks that every call runs with the count it started with
        try:
            self.llm = self.vllm.LLM(**spec.llm_kwargs(self.cpu))
            _live.append(self)
        finally:  # the CPU worker swaps torch.set_num_threads for a no-op; the trainer in this process needs it
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        self._lock = threading.Lock()  # a push and a generate call take turns (in flight: a push made outside a call)
        # In flight: a push made while a call generates is queued here and applied by the generating thread at its
        # next engine step (`_step_hook`); `_generating` says whether such a thread exists to apply it.
        self.in_flight, self.push_timeout_s = in_flight, push_timeout_s
        self._cv = threading.Lock()
        self._generating = False
        self._pending: list[_PendingPush] = []
        self.steps = 0  # engine steps taken (a step: one token for every running request)
        self._hook_steps()
        self._lora: Any = None  # the LoRARequest the engine serves, if any
        self._lora_ids = 0
        self._version = -1
        self.expected_version: int | None = None  # what the trainer last pushed (VLLMWeights sets it)
        # The engine refuses a whole generate call for one row past max_model_len: rows are fitted per caller first.
        self.context = context if context is not None else ContextBudget(spec.max_model_len)
        self._coalescer = Coalescer(
            lambda rows, params: asyncio.to_thread(self._sample_rows, rows, params), self.context
        )
        self._seed_warned = False
        self.stats = {"pushes": 0, "prefix_resets": 0, "in_flight_pushes": 0}
        log(
            f"vllm: {spec.model_dir} in process ({'CPU' if self.cpu else 'GPU'} build {self.vllm.__version__}, "
            f"{spec.dtype}, {'compiled' if spec.compile else 'eager'})"
        )

    # ---- Sampler protocol ------------------------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        """The version the engine itself reports it loaded (-1: nothing pushed yet)."""
        return self._version

    @policy_version.setter
    def policy_version(self, v: int) -> None:
        """Only a version bump without new weights (the run's start: the engine loaded the trainer's weights)."""
        with self._lock:
            self._set_engine_version(v)

    def set_version(self, version: int) -> None:
        """Only a version bump without new weights (the run's start: the engine loaded the trainer's weights)."""
        self.policy_version = version

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        """Concurrent calls in one event-loop turn become one `generate` call (vLLM batches them continuously)."""
        return await self._coalescer.sample(prompts_P, params, n)

    def sample_sync(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        fitted = self.context.fit_rows(prompts_P, params)  # a row past the context fails alone (context.py)
        flat = self._sample_rows([p for p in fitted.prompts_P for _ in range(n)], fitted.params)
        return fitted.merge([flat[i * n : (i + 1) * n] for i in range(len(fitted.prompts_P))], n)

    def _sample_rows(self, rows: list[list[int]], params: SampleParams) -> list[Completion]:
        """One completion per row; identical rows go in as one prompt with n completions (one prefill)."""
        if not rows:
            return []
        check_rows(rows, params, self.context)
        if params.seed is not None and not self._seed_warned:
            self._seed_warned = True
            log.warning("vllm engine: per-call seeds are ignored (the engine is seeded once at start)")
        uniq: dict[tuple[int, ...], list[int]] = {}
        for i, r in enumerate(rows):
            uniq.setdefault(tuple(r), []).append(i)
        from vllm.inputs import TokensPrompt

        with self._lock:
            self._check_version()
            version = self._version
            sps = [sampling_params(self.vllm, params, len(idx), self.stop_token_ids) for idx in uniq.values()]
            if params.constraint is not None:  # vLLM's structured outputs (constrained.py `vllm_structured`)
                from vllm.sampling_params import StructuredOutputsParams

                for sp in sps:
                    sp.structured_outputs = StructuredOutputsParams(**vllm_structured(params.constraint))
            with self._cv:
                self._generating = True
            try:
                with self._engine_threads():
                    outs = self.llm.generate(
                        [TokensPrompt(prompt_token_ids=list(p)) for p in uniq],
                        sps,
                        use_tqdm=False,
                        lora_request=self._lora,
                    )
            finally:
                with self._cv:
                    self._generating = False
                self._apply_pending(running=False)  # a push queued after the last step
        result: list[Completion | None] = [None] * len(rows)
        for idx, out in zip(uniq.values(), outs):
            for i, o in zip(idx, out.outputs):
                result[i] = completion_from(o, version)
        return result  # type: ignore[return-value]  # every row was filled

    # ---- weights ---------------------------------------------------------------------------------------------
    def load_weights(self, named_tensors: dict[str, Any], version: int) -> None:
        """Full weights in HF checkpoint names (vLLM stacks q/k/v and gate/up itself), in place."""
        items = list(named_tensors.items())

        def reload(worker: Any) -> bool:
            worker.model_runner.reload_weights(weights_iterator=iter(items))
            return True

        def change(running: bool) -> None:
            with self._engine_threads():
                self.llm.collective_rpc(reload)
                self._after_change(version, running)

        self._change(change)

    def load_adapter(self, folder: str | Path, version: int) -> None:
        """A LoRA adapter folder (peft's save_pretrained) as `version`: a new adapter id, so no cached copy of an
        older adapter under the same id can be served; the previous one is dropped from the engine."""
        from vllm.lora.request import LoRARequest

        # Always between calls: a request holds its LoRARequest, so a new adapter serves new requests only.
        with self._lock:
            old = self._lora
            self._lora_ids += 1
            self._lora = LoRARequest(f"policy-v{version}", self._lora_ids, str(folder))
            if old is not None:
                with contextlib.suppress(Exception):
                    self.llm.llm_engine.remove_lora(old.lora_int_id)
            self._after_change(version, running=False)

    # ---- in-flight updates -----------------------------------------------------------------------------------
    def _change(self, change: Any) -> None:
        """Apply a weight change: queued for the generating thread when a call is generating and updates are in
        flight (bounded wait), otherwise now, between calls."""
        pending = None
        if self.in_flight:
            with self._cv:
                if self._generating:
                    pending = _PendingPush(change)
                    self._pending.append(pending)
        if pending is None:
            with self._lock:  # a call that started meanwhile finishes first: the push then lands between calls
                change(False)
            return
        if not pending.done.wait(self.push_timeout_s):
            raise TimeoutError(f"the vLLM engine did not take an in-flight weight push within {self.push_timeout_s:g}s")
        if pending.error is not None:
            raise pending.error

    def _hook_steps(self) -> None:
        """Every engine step of a `generate` call first applies the pushes queued since the last one: the token
        boundary where an in-flight update lands. An attribute on this engine object only; vLLM's class is
        untouched."""
        engine = self.llm.llm_engine
        step = engine.step

        def step_with_updates(*args: Any, **kwargs: Any) -> Any:
            if self._pending:  # read without the lock: a push queued just after is taken at the next step
                self._apply_pending(running=True)
            self.steps += 1
            return step(*args, **kwargs)

        engine.step = step_with_updates

    def _apply_pending(self, running: bool) -> None:
        with self._cv:
            todo, self._pending = self._pending, []
        for p in todo:
            try:
                p.change(running)
                self.stats["in_flight_pushes"] += int(running)
            except BaseException as e:  # noqa: BLE001 - handed to the pushing thread, which raises it
                p.error = e
            finally:
                p.done.set()

    @contextlib.contextmanager
    def _engine_threads(self):
        """The engine's thread count for the call, the caller's restored after (the trainer may use another)."""
        import torch

        now = torch.get_num_threads()
        if now != self.threads:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            if now != self.threads:
                torch.set_num_threads(now)

    def _after_change(self, version: int, running: bool) -> None:
        # Mandatory: cached KV was computed by the old weights. With requests running (in flight) they are preempted
        # by the reset and their KV is recomputed under the new weights when they continue.
        self.llm.reset_prefix_cache(reset_running_requests=running)
        self.stats["prefix_resets"] += 1
        self.stats["pushes"] += 1
        self._set_engine_version(version)

    def _set_engine_version(self, v: int) -> None:
        self.llm.llm_engine.set_weight_version(str(v))
        self._version = as_version(self.llm.llm_engine.get_weight_version())

    def _check_version(self) -> None:
        """A push the trainer made must be what the engine serves; a missed one stops the call."""
        if self.expected_version is not None and self._version != self.expected_version:
            raise StaleEngineError(
                f"the vLLM engine serves policy version {self._version}, the trainer pushed "
                f"{self.expected_version}: a weight push was missed"
            )

    def drain_metrics(self) -> dict[str, float]:
        """vLLM's prefix-cache counters since the last drain, under the own sampler's names: prompt tokens whose KV
        was reused (a multi-turn episode's earlier turns, a group's shared prompt) and tokens prefilled anyway.
        The CPU build caches whole blocks of 128 tokens, so shorter prefixes never hit there."""
        flight = {"sampling/in_flight_pushes": float(self.stats["in_flight_pushes"])} if self.in_flight else {}
        self.stats["in_flight_pushes"] = 0
        now = {}
        with contextlib.suppress(Exception):  # metrics are an aid: an engine without them reports nothing
            for m in self.llm.get_metrics():
                if m.name in ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"):
                    now[m.name] = float(getattr(m, "value", 0.0))
        if not now:
            return flight
        last, self._counters = getattr(self, "_counters", {}), now
        hits = now.get("vllm:prefix_cache_hits", 0.0) - last.get("vllm:prefix_cache_hits", 0.0)
        queries = now.get("vllm:prefix_cache_queries", 0.0) - last.get("vllm:prefix_cache_queries", 0.0)
        if queries <= 0:
            return flight
        return {**flight, "sampling/prefix_reused_tokens": hits, "sampling/prefill_tokens": queries - hits}

    def close(self) -> None:
        """Shut the engine down (its memory and vLLM's process state), so another can start in this process."""
        if self in _live:
            _live.remove(self)
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            del llm
        import gc

        gc.collect()
