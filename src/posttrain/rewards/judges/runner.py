"""Asking a backend many questions: cache, batches, a timeout on every call, bounded retries, per-question failures.

`JudgeRunner.ask(kind, template, prompts)` returns one answer per prompt, or a `JudgeError` in the place of each
prompt that got none. Order of work:

1. look every prompt up in the cache (key: judge id, kind, template, prompt text); duplicates are asked once;
2. send the misses in batches of `batch_size`; each batch call runs in a worker thread and is abandoned after
   `timeout_s` (Python cannot kill the thread; its late answer is dropped);
3. a batch that fails as a whole (timeout, endpoint down) or prompts whose answer was a transient error are
   retried, at most `max_retries` times, after `backoff_s * 2**attempt` seconds; malformed output is final;
4. answers are parsed (`parse`; a parse error is a malformed-output failure) and only good answers are cached,
   so a failure is asked again on the next run; the cache itself refuses NaN and infinity (cache.py).

A failed prompt fails only itself: the other prompts of its batch keep their answers. An exception of any kind
that a backend puts in a prompt's place (not only a JudgeError) is that prompt's failure, never an answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from typing import Any

from posttrain.rewards.judges.backends import JudgeBackend
from posttrain.rewards.judges.cache import JudgeCache, cache_key
from posttrain.rewards.judges.errors import JudgeBadOutput, JudgeError, JudgeTimeout
from posttrain.rewards.judges.stats import JudgeStats

log = logging.getLogger(__name__)


@dataclass
class JudgeRunner:
    backend: JudgeBackend
    cache: JudgeCache = field(default_factory=JudgeCache)
    batch_size: int = 16
    timeout_s: float = 60.0  # one batch call
    max_retries: int = 2
    backoff_s: float = 0.5
    stats: JudgeStats = field(default_factory=JudgeStats)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0:
            raise ValueError(
                f"need batch_size >= 1, timeout_s > 0, max_retries >= 0, backoff_s >= 0; got "
                f"{self.batch_size}, {self.timeout_s}, {self.max_retries}, {self.backoff_s}"
            )

    def ask(
        self,
        kind: str,
        template: str,
        prompts: list[str],
        call: Callable[[list[str]], list[Any]] | None = None,
        parse: Callable[[Any], Any] = lambda x: x,
    ) -> list[Any]:
        """`kind`: "yes_no" (backend.yes_prob) or "generate:<max_tokens>" (backend.generate), unless `call` is
        given. `template` is the question template the prompts came from (part of the cache key)."""
        call = call or self._call_for(kind)
        judge_id = self.backend.judge_id  # once: resolving it may ask a (dead, slow) endpoint, bounded by a timeout
        keys = [cache_key(judge_id, kind, template, p) for p in prompts]
        cached = self.cache.get_many(list(dict.fromkeys(keys)))
        answers: dict[str, Any] = {}
        for k, v in cached.items():
            try:
                answers[k] = parse(v)
            except Exception:  # noqa: BLE001 - a cached value the parser now rejects is asked again
                pass
        todo = {k: p for k, p in zip(keys, prompts) if k not in answers}
        self.stats.add(lookups=len(prompts), cache_hits=sum(1 for k in keys if k in answers))
        fresh = self._ask_backend(todo, call, parse, judge_id)
        self.cache.put_many(
            {k: raw for k, (raw, v) in fresh.items() if not isinstance(v, Exception)}
        )  # raw: re-parsed on a hit
        answers.update({k: v for k, (_, v) in fresh.items()})
        out = [answers[k] for k in keys]
        self.stats.add(failures=sum(1 for v in out if isinstance(v, Exception)))
        return out

    def _call_for(self, kind: str) -> Callable[[list[str]], list[Any]]:
        if kind == "yes_no":
            return self.backend.yes_prob
        if kind.startswith("generate:"):
            n = int(kind.split(":", 1)[1])
            return lambda ps: self.backend.generate(ps, n)
        raise ValueError(f"unknown judge question kind {kind!r}")

    def _ask_backend(self, todo: dict[str, str], call, parse, judge_id: str) -> dict[str, tuple[Any, Any]]:
        """key -> (raw answer, parsed answer or JudgeError) for every key of `todo`."""
        done: dict[str, tuple[Any, Any]] = {}
        pending = list(todo)
        for attempt in range(self.max_retries + 1):
            if not pending:
                break
            if attempt:
                self.stats.add(retries=len(pending))
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            retry: list[str] = []
            for i in range(0, len(pending), self.batch_size):
                batch = pending[i : i + self.batch_size]
                for k, res in zip(batch, self._one_call(call, [todo[k] for k in batch])):
                    done[k] = _answer(res, parse)
                    if isinstance(done[k][1], JudgeError) and done[k][1].transient:
                        retry.append(k)
            pending = retry
        for k in pending:
            log.warning("judge %s: giving up after %d attempts: %s", judge_id, self.max_retries + 1, done[k][1])
        return done

    def _one_call(self, call, prompts: list[str]) -> Sequence[Any]:
        """One backend call with a timeout; a whole-call failure becomes that error for every prompt."""
        t0 = time.perf_counter()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="judge")
        try:
            res = pool.submit(call, prompts).result(timeout=self.timeout_s)
            if not isinstance(res, (list, tuple)) or len(res) != len(prompts):
                got = f"{len(res)} answers" if isinstance(res, (list, tuple)) else f"a {type(res).__name__}"
                err: JudgeError = JudgeBadOutput(f"backend returned {got} for {len(prompts)} prompts")
                res = [err] * len(prompts)
        except FuturesTimeout:
            res = [JudgeTimeout(f"judge call took longer than {self.timeout_s:g}s")] * len(prompts)
        except JudgeError as e:
            res = [e] * len(prompts)
        except Exception as e:  # noqa: BLE001 - an unexpected backend error (a bug, not the network): final
            res = [JudgeError(f"judge backend raised {type(e).__name__}: {e}")] * len(prompts)
        finally:
            pool.shutdown(wait=False)
            self.stats.add(calls=1, latency_total_s=time.perf_counter() - t0)
        timeouts: list[JudgeTimeout] = []  # a batch that timed out shares one exception: one event
        for r in res:
            if isinstance(r, JudgeTimeout) and not any(r is t for t in timeouts):
                timeouts.append(r)
        self.stats.add(timeouts=len(timeouts))
        return res


def _answer(res: Any, parse: Callable[[Any], Any]) -> tuple[Any, Any]:
    """(raw answer, parsed answer or JudgeError) of one prompt. An exception of any kind in the prompt's place, or
    from its parser, fails that prompt alone; only a JudgeError may be transient (retried)."""
    if isinstance(res, Exception):
        return None, res if isinstance(res, JudgeError) else JudgeError(f"judge backend: {type(res).__name__}: {res}")
    try:
        return res, parse(res)
    except Exception as e:  # noqa: BLE001 - any parse error is malformed judge output
        return res, e if isinstance(e, JudgeError) else JudgeBadOutput(f"{type(e).__name__}: {e}")
