"""Fixtures for running agent frameworks, unchanged, against posttrain's OpenAI-compatible server.

    served            a ScriptedPolicy (scripted_policy.py; default script: weather_rules()) served over HTTP exactly
                      as `posttrain serve` serves a model (create_app behind an HttpGuard with an API key), on
                      127.0.0.1, port 0, in a thread with its own event loop, so a framework's blocking client
                      never blocks the server. `served.base_url` is `http://127.0.0.1:PORT/v1`; `served.policy.rules`
                      may be replaced by a test.
    train_one_step    runs an agent function inside AgentEnv for one training step on tiny-random (the script's
                      tokens scored by the model, so the logprobs are the policy's) and returns the step's metrics.

Hermetic: OPENAI_API_KEY is the served key (nothing reaches api.openai.com: every client here is pointed at the
fixture), tracing and telemetry of the frameworks are off.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from posttrain.envs.scoring import scored_by

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from scripted_policy import Rule, ScriptedPolicy, weather_rules

API_KEY = "sk-posttrain-test"
TRACING_OFF = {
    "OPENAI_API_KEY": API_KEY,
    "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",  # a client not pointed at the fixture fails at once, offline
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGSMITH_API_KEY": "",
    "LOGFIRE_IGNORE_NO_CONFIG": "1",
    "LOGFIRE_SEND_TO_LOGFIRE": "false",
    "DO_NOT_TRACK": "1",
}


@pytest.fixture(autouse=True)
def _offline_frameworks(monkeypatch):
    for k, v in TRACING_OFF.items():
        monkeypatch.setenv(k, v)
    try:
        from agents import set_tracing_disabled
    except ImportError:
        pass
    else:
        set_tracing_disabled(True)
    yield


@pytest.fixture
def tok():
    from posttrain.models.tiny import tiny_tokenizer

    return tiny_tokenizer()


class ServerThread:
    """An app served by posttrain's in-loop server (sampling/http_serve.py) in a daemon thread with its own event
    loop; `url` once started. A context manager: stops the server and joins the thread on exit."""

    def __init__(self, app: Any, api_key: str | None = API_KEY):
        from posttrain.sampling.http_serve import HttpGuard

        self.app, self.guard = app, HttpGuard(api_key=api_key)
        self.url = ""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="agents-test-server", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # noqa: BLE001 - handed to the test thread, which raises it
            self._error = e
            self._ready.set()

    async def _main(self) -> None:
        from posttrain.sampling.http_serve import serve_in_loop

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with serve_in_loop(self.app, guard=self.guard) as srv:
            self.url = srv.url
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the test server did not start within 30 s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)
        assert not self._thread.is_alive(), "the test server's thread did not stop within 20 s"


@dataclass
class Served:
    base_url: str  # http://127.0.0.1:PORT/v1
    api_key: str
    policy: ScriptedPolicy
    app: Any

    def script(self, rules: list[Rule]) -> None:
        with self.policy.lock:
            self.policy.rules = list(rules)


@pytest.fixture
def served(tok) -> Iterator[Served]:
    from posttrain.sampling.openai_server import create_app

    policy = ScriptedPolicy(tok, weather_rules())
    app = create_app(policy, tok, model_name="policy", request_timeout_s=30.0, default_max_tokens=256)
    with ServerThread(app) as srv:
        yield Served(srv.url + "/v1", API_KEY, policy, app)


@dataclass
class StepResult:
    trajectories: list[Any]
    metrics: dict[str, float]  # the episodes' agent/* means, train/* of the step, weights/changed (1.0: updated)
    policy: ScriptedPolicy
    stats: dict[str, int] = field(default_factory=dict)  # the episodes' counts: timeouts, failed, dropped_calls


def run_train_step(
    agent_fn: Callable[[Any, dict[str, Any]], Any],
    rules: list[Rule],
    rows: list[dict[str, Any]] | None = None,
    group: int = 2,
    chains: str = "all",
    max_tokens: int = 64,
    task: Any = None,
) -> StepResult:
    """`agent_fn` run inside AgentEnv (group episodes per row), the episodes built into a batch and trained on for
    one optimizer step of tiny-random. The script's tokens are scored by that model (ScriptedPolicy(model=...)), so
    train/sampler_logp_abs_diff measures the recorded-vs-trainer logprob gap as with a real sampler. Advantages are
    the rewards themselves ("reward"), so any nonzero reward moves the weights. `task`: scores an agent that returns
    its answer (AgentEnv's rubric path)."""
    import torch

    from posttrain.algos import LOSSES, LossParams
    from posttrain.envs.agent import AgentEnv
    from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
    from posttrain.models import ensure_pad_token, load_model
    from posttrain.training.trainer import Trainer
    from posttrain.types import Group, SampleParams

    model, tokenizer = load_model("tiny-random", seed=0)
    ensure_pad_token(tokenizer)
    model.eval()  # the scripted logprobs and the trainer's forward must agree (tiny-random has no dropout anyway)
    policy = ScriptedPolicy(tokenizer, rules, model=model)
    env = AgentEnv(agent_fn, task=task, tokenizer=tokenizer, timeout_s=60, request_timeout_s=30, chains=chains)
    params = SampleParams(max_tokens=max_tokens, temperature=1.0)
    rows = rows or [{"prompt": "What is the weather in Paris?"}]

    async def go() -> list[Any]:
        try:
            trajs = list(await asyncio.gather(*(env.rollout(r, policy, params) for r in rows for _ in range(group))))
            trajs = await scored_by(env, trajs)
            return trajs
        finally:
            await env.close()

    trajs = asyncio.run(go())
    failed = [t.error for t in trajs if t.failed]
    assert not failed, failed
    groups = [Group(i, trajs[i * group : (i + 1) * group]) for i in range(len(rows))]
    batch, _ = build_batch(sequences_from_groups(groups), BatchOptions(advantage="reward"), policy.policy_version)
    assert batch.sequences, "the episodes gave no trainable sequence"
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model, pad_id=tokenizer.pad_token_id, lr=1e-3, temperature=params.temperature)
    metrics = dict(trainer.forward_backward(batch, LOSSES["ppo_clip"], LossParams()).metrics)
    metrics.update(trainer.optim_step())
    changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    for key in ("agent/calls", "agent/chains", "agent/dropped_calls", "agent/temperature_overrides"):
        metrics[key] = sum(t.metrics.get(key, 0.0) for t in trajs) / len(trajs)
    metrics["weights/changed"] = float(changed)
    metrics["batch/sequences"] = float(len(batch.sequences))
    stats = {
        "timeouts": int(sum(t.metrics.get("agent/timed_out", 0.0) for t in trajs)),
        "failed": sum(t.failed for t in trajs),
        "dropped_calls": int(sum(t.metrics.get("agent/dropped_calls", 0.0) for t in trajs)),
    }
    return StepResult(trajs, metrics, policy, stats)


@pytest.fixture
def train_one_step() -> Callable[..., StepResult]:
    """run_train_step, as a fixture (see its docstring)."""
    return run_train_step

