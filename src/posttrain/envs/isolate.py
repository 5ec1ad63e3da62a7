"""Per-sample failure isolation: one sample's bad output fails that sample, never its step or the run.

    safe_rollout(env, row, sampler, params) -> Trajectory   env.rollout, or a failed trajectory if it raised
    score_isolated(env, trajectories) -> trajectories        scored by env.score; if the batch raises, one by one

A model output can make an env raise anything (a RecursionError out of a parser fed deeply nested JSON, a
UnicodeEncodeError from a lone surrogate written to a file, an exception nobody foresaw). Collectors gather G x P
rollouts at once, so one escaped exception would abort the whole gather: the step (sync) or the run (async). Every
place that rolls out or scores many samples goes through these two functions instead of calling the env directly.

A failed sample is an ordinary failed trajectory (`failed=True`, reward 0, not passed, `error` naming the exception),
so everything downstream already knows what to do with it: it is kept out of training (loop/batch.py), out of the
reward means and feedback, and counted. `failed_in` says where it failed ("rollout" or "score"; a reward
function that raised inside the rubric leaves it unset), which obs/rollout_stats.py turns into per-step counts.

What is not isolated, on purpose: `asyncio.CancelledError` and `KeyboardInterrupt` (BaseExceptions: the run is
being stopped), and the errors that say the machinery is gone rather than that a sample was bad (`INFRASTRUCTURE`:
an env worker pool or sampler pool with no live member, a sampler server that stopped answering, a weight sync
that failed). Isolating those would turn a dead cluster into a run that trains on nothing, step after step.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from posttrain.envs.scoring import scored
from posttrain.rewards.rubric import Score
from posttrain.types import SampleParams, Trajectory, Turn

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 500  # an exception's message may quote the whole (megabyte) model output: keep the record small

# (module, class) of the errors that propagate. Looked up in sys.modules only: an exception whose module was
# never imported cannot have been raised, so envs need not import cluster or sampler code to recognise them.
INFRASTRUCTURE = (
    ("posttrain.envs.tools", "EnvWorkerLost"),  # ReissueOnLoss already re-ran what it could
    ("posttrain.cluster.ray_sampler", "SamplerPoolError"),
    ("posttrain.sampling.openai_sampler", "OpenAISamplerError"),
    ("posttrain.sampling.weight_ipc", "WeightSyncError"),
)


def is_infrastructure(e: BaseException) -> bool:
    """True for an error of the machinery (see INFRASTRUCTURE), which must stop the run, not fail a sample."""
    for module, name in INFRASTRUCTURE:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(e, cls):
            return True
    return False


def describe(e: BaseException, where: str) -> str:
    """'<where> raised <Type>: <message>' with the message cut to MAX_ERROR_CHARS (str(e) itself may raise)."""
    try:
        msg = str(e)
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails still has a type to report
        msg = "<message unprintable>"
    if len(msg) > MAX_ERROR_CHARS:
        msg = msg[:MAX_ERROR_CHARS] + f"... [{len(msg) - MAX_ERROR_CHARS} more chars]"
    return f"{where} raised {type(e).__name__}: {msg}"


def _where(e: BaseException) -> str:
    """The innermost frame of the traceback as 'file:line in fn' (for the log line: which parser blew up)."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return "?"
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


class FailureLog:
    """Rate-limited warnings: the first isolated failure at once, then at most one line per `every_s` seconds,
    saying how many more failed meanwhile. A step of 64 samples that all raise must not print 64 tracebacks."""

    def __init__(self, every_s: float = 30.0):
        self.every_s = every_s
        self._last = float("-inf")
        self._suppressed = 0

    def note(self, error: str, e: BaseException) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._suppressed += 1
            return
        more = f" ({self._suppressed} more samples failed since the last warning)" if self._suppressed else ""
        log.warning("sample failed, kept out of training: %s [at %s]%s", error, _where(e), more)
        self._last, self._suppressed = now, 0


failures = FailureLog()


def _prompt_ids(env: Any, row: dict[str, Any]) -> list[int]:
    """The row's first prompt when the env can say so cheaply (SingleTurnEnv, GymTextEnv: `prompt_ids(row)`),
    else none: a failed trajectory never trains, so its prompt is only for the record."""
    fn: Callable[[dict[str, Any]], Iterable[int]] | None = getattr(env, "prompt_ids", None)
    if not callable(fn):
        return []
    try:
        return [int(i) for i in fn(row)]
    except Exception:  # noqa: BLE001 - the row that broke the rollout may break rendering too
        return []


def failed_trajectory(
    row: dict[str, Any], prompt_ids: list[int], policy_version: int, error: str, failed_in: str
) -> Trajectory:
    """The smallest valid trajectory: one turn with the prompt and no completion (so `policy_version`,
    `sequence()` and the staleness checks work), reward 0, failed, with the reason."""
    turn = Turn(
        prompt_ids=list(prompt_ids),
        completion_ids=[],
        completion_logprobs=[],
        policy_version=policy_version,
        finish_reason="error",
    )
    return Trajectory(
        turns=[turn],
        prompt_text=prompt_text(row.get("prompt")),
        row=row,
        reward=0.0,
        passed=False,
        failed=True,
        error=error,
        failed_in=failed_in,
    )


def prompt_text(prompt: Any) -> str:
    """The row's prompt as the records show it (samples.jsonl), as SingleTurnEnv writes it."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(f"[{m.get('role')}] {m.get('content')}" for m in prompt if isinstance(m, dict))
    return ""


def _version(sampler: Any) -> int:
    try:
        return int(sampler.policy_version)
    except Exception:  # noqa: BLE001 - a sampler without a version: the failed sample's version is moot
        return 0


async def safe_rollout(env: Any, row: dict[str, Any], sampler: Any, params: SampleParams | None = None) -> Trajectory:
    """`env.rollout(row, sampler, params)`; any Exception it raises becomes a failed trajectory instead.
    The version is read before the rollout: it is the one the async collector admitted the sample under."""
    version = _version(sampler)
    try:
        return await env.rollout(row, sampler, params)
    except Exception as e:
        if is_infrastructure(e):
            raise
        error = describe(e, "rollout")
        failures.note(error, e)
        return failed_trajectory(row, _prompt_ids(env, row), version, error, "rollout")


async def score_isolated(env: Any, trajectories: list[Trajectory]) -> list[Trajectory]:
    """The trajectories scored: `env.score` over them in one batch (reward models batch); if that raises, each is
    scored on its own, and only those whose own scoring raises fail. Scores come back as values and are joined into
    new trajectories (envs/scoring.py), so a batch that raised half way left nothing to undo. Trajectories whose
    rollout failed are not scored (a rubric would score their empty completion and clear `failed`)."""
    todo = [i for i, t in enumerate(trajectories) if t.failed_in != "rollout"]
    out = list(trajectories)
    if not todo:
        return out
    try:
        scores = _checked(await env.score([trajectories[i] for i in todo]), len(todo))
        for i, s in zip(todo, scores, strict=True):
            out[i] = scored(trajectories[i], s)
        return out
    except Exception as e:
        if is_infrastructure(e):
            raise
    for i in todo:
        try:
            (s,) = _checked(await env.score([trajectories[i]]), 1)
            out[i] = scored(trajectories[i], s)
        except Exception as e:
            if is_infrastructure(e):
                raise
            error = describe(e, "score")
            failures.note(error, e)
            out[i] = scored(trajectories[i], Score(0.0, {}, False, True, error), failed_in="score")
    return out


def _checked(scores: Any, n: int) -> list[Score]:
    """An env's answer to `score`: one Score per trajectory it was asked about."""
    if scores is None:  # an env written when scoring set rewards in place (Trajectory is frozen now)
        raise TypeError("env.score returned None: it must return one rubric Score per trajectory (envs/scoring.py)")
    scores = list(scores)
    if len(scores) != n:
        raise ValueError(f"env.score returned {len(scores)} scores for {n} trajectories")
    return scores
