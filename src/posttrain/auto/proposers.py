"""Who proposes the next trial: Optuna (TPE, median pruning on the intermediate held-out evals) or an LLM.

    proposer.baseline(params, value)       tell it the base config's result (trial 0)
    p = proposer.propose(incumbent, tsv)   a Proposal: every searched key's value, a reason, who proposed it
    proposer.intermediate(p, step, value)  an intermediate eval; True: prune the trial
    proposer.finish(p, value, state)       complete | pruned | failed

The Optuna study lives in SEARCH_DIR/optuna.db (sqlite), so `--resume` continues the same study. The LLM proposer
reads program.md and results.tsv through any OpenAI-compatible endpoint and answers a JSON diff with a reason; a
diff that is not JSON, names a key outside the search space (a frozen one included) or a value out of range is
rejected and counted, and Optuna proposes instead. An accepted LLM diff is enqueued into the same study, so the
study (and its parameter importance) sees every trial.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.auto.program import Param, Program
from posttrain.bounded import BoundedError, loads_json
from posttrain.errors import MissingExtraError

STUDY = "posttrain-auto"


class ProposalRejected(ValueError):
    """An LLM proposal that cannot be run (bad JSON, unknown or frozen key, out of range)."""


@dataclass
class Proposal:
    params: dict[str, Any]  # every searched key
    reason: str
    source: str  # optuna | llm | optuna (llm rejected)
    handle: Any = None  # the optuna trial


def _optuna():
    try:
        import optuna
    except ImportError:
        raise MissingExtraError("posttrain auto needs optuna: pip install 'posttrain[auto]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def distributions(prog: Program) -> dict[str, Any]:
    optuna = _optuna()
    d = optuna.distributions
    out = {}
    for k, p in prog.search.items():
        if p.kind == "categorical":
            out[k] = d.CategoricalDistribution(p.choices)
        elif p.kind == "int":
            low, high = p.bounds()
            out[k] = d.IntDistribution(int(low), int(high), log=p.log)
        else:
            low, high = p.bounds()
            out[k] = d.FloatDistribution(low, high, log=p.log)
    return out


def open_study(prog: Program, search_dir: Path):
    optuna = _optuna()
    opts = prog.proposer.get("optuna") or {}
    sampler = optuna.samplers.TPESampler(seed=prog.seeds[0], n_startup_trials=int(opts.get("startup_trials", 4)))
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=int(opts.get("prune_after_trials", 2)), n_warmup_steps=0)
        if prog.pruning
        else optuna.pruners.NopPruner()
    )
    study = optuna.create_study(
        storage=f"sqlite:///{Path(search_dir).resolve() / 'optuna.db'}",
        study_name=STUDY,
        direction="maximize" if prog.direction == "max" else "minimize",
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,
    )
    for t in study.get_trials(deepcopy=False):  # a search stopped mid-trial: that trial did not finish
        if t.state == optuna.trial.TrialState.RUNNING:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
    return study


class OptunaProposer:
    def __init__(self, prog: Program, search_dir: Path):
        self.prog = prog
        self.study = open_study(prog, search_dir)
        self.dists = distributions(prog)
        self.reported: dict[int, set[int]] = {}

    def baseline(self, params: dict[str, Any], value: float) -> None:
        """The base config as a completed trial, when its values lie inside the search space."""
        optuna = _optuna()
        if all(self.prog.search[k].contains(v) for k, v in params.items()):
            self.study.add_trial(optuna.trial.create_trial(params=params, distributions=self.dists, value=value))

    def propose(self, incumbent: dict[str, Any] | None = None, history: str = "") -> Proposal:
        trial = self.study.ask(self.dists)
        return Proposal(
            {k: self.prog.search[k].coerce(v) for k, v in trial.params.items()},
            "TPE sample" if _n_complete(self.study) >= self._startup() else "random (TPE startup)",
            "optuna",
            trial,
        )

    def propose_fixed(self, params: dict[str, Any], reason: str, source: str) -> Proposal:
        self.study.enqueue_trial(params)
        trial = self.study.ask(self.dists)
        return Proposal(dict(trial.params), reason, source, trial)

    def intermediate(self, p: Proposal, step: int, value: float) -> bool:
        seen = self.reported.setdefault(p.handle.number, set())
        if step in seen:
            return False
        seen.add(step)
        p.handle.report(value, step)
        return bool(self.prog.pruning and p.handle.should_prune())

    def finish(self, p: Proposal, value: float | None, state: str) -> None:
        optuna = _optuna()
        S = optuna.trial.TrialState
        if state == "complete" and value is not None:
            self.study.tell(p.handle, value)
        else:
            self.study.tell(p.handle, state=S.PRUNED if state == "pruned" else S.FAIL)

    def _startup(self) -> int:
        return int((self.prog.proposer.get("optuna") or {}).get("startup_trials", 4))


def _n_complete(study) -> int:
    optuna = _optuna()
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


SYSTEM = """You tune the hyper-parameters of a reinforcement-learning post-training run, one trial at a time.
You see the program (goal, metric, budget, search space, frozen keys) and results.tsv (one row per finished
trial: its params, metric, kept or reverted). Propose the next trial as a change to the incumbent (the best
config so far). Answer with one JSON object and nothing else:
{"diff": {"dotted.config.key": value, ...}, "reason": "one sentence: why this change"}
Only keys of the search space; values inside their ranges; never a frozen key."""


class LLMProposer:
    """Asks a chat model (any OpenAI-compatible endpoint) for the next diff; falls back to Optuna's proposal."""

    def __init__(self, prog: Program, fallback: OptunaProposer, client: Any = None):
        self.prog, self.fallback, self.rejected = prog, fallback, 0
        self.rejections: list[str] = []
        cfg = prog.proposer
        if client is None:
            try:
                from openai import OpenAI
            except ImportError:
                raise MissingExtraError("the llm proposer needs openai: pip install 'posttrain[serve]'") from None
            key = os.environ.get(cfg.get("api_key_env", "OPENAI_API_KEY"), "none")
            client = OpenAI(
                base_url=cfg.get("base_url"), api_key=key, timeout=float(cfg.get("timeout_s", 120)), max_retries=1
            )
        self.client = client

    def baseline(self, params: dict[str, Any], value: float) -> None:
        self.fallback.baseline(params, value)

    def prompt(self, incumbent: dict[str, Any], history: str) -> str:
        space = "\n".join(f"- {k}: {p.describe()}" for k, p in self.prog.search.items())
        return (
            f"# program.md\n{self.prog.text}\n\n# search space\n{space}\n\n# frozen\n{', '.join(self.prog.frozen)}"
            f"\n\n# incumbent (best so far)\n{json.dumps(incumbent)}\n\n# results.tsv\n{history}\n"
        )

    def ask(self, incumbent: dict[str, Any], history: str) -> tuple[dict[str, Any], str]:
        try:
            r = self.client.chat.completions.create(
                model=self.prog.proposer["model"],
                temperature=float(self.prog.proposer.get("temperature", 0.7)),
                messages=[
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": self.prompt(incumbent, history)},
                ],
            )
            text = r.choices[0].message.content or ""
        except Exception as e:  # noqa: BLE001 - an endpoint that is down must not end the search
            raise ProposalRejected(f"endpoint error: {type(e).__name__}: {str(e)[:200]}") from None
        return parse_llm_diff(text, self.prog, incumbent)

    def propose(self, incumbent: dict[str, Any] | None = None, history: str = "") -> Proposal:
        incumbent = dict(incumbent or {})
        try:
            params, reason = self.ask(incumbent, history)
        except ProposalRejected as e:
            self.rejected += 1
            self.rejections.append(str(e))
            p = self.fallback.propose()
            p.reason, p.source = f"LLM proposal rejected ({e}); {p.reason} instead", "optuna (llm rejected)"
            return p
        return self.fallback.propose_fixed(params, reason, "llm")

    def intermediate(self, p: Proposal, step: int, value: float) -> bool:
        return self.fallback.intermediate(p, step, value)

    def finish(self, p: Proposal, value: float | None, state: str) -> None:
        self.fallback.finish(p, value, state)


def parse_llm_diff(text: str, prog: Program, incumbent: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The LLM's answer -> (every searched key's value: the incumbent's with the diff applied, reason)."""
    # From the first '{' to the last '}' (a ``` fence around it holds neither), parsed with posttrain.bounded's
    # caps: the answer is model text.
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ProposalRejected(f"no JSON object in the answer: {text[:120]!r}")
    try:
        obj = loads_json(text[start : end + 1])
    except BoundedError as e:
        raise ProposalRejected(f"bad JSON ({e.reason}): {text[:120]!r}") from None
    diff, reason = (
        obj.get("diff") if isinstance(obj, dict) else None,
        obj.get("reason", "") if isinstance(obj, dict) else "",
    )
    if not isinstance(diff, dict) or not diff:
        raise ProposalRejected('the answer needs a non-empty "diff" object')
    out = dict(incumbent)
    for k, v in diff.items():
        if k in prog.frozen or any(k.startswith(f + ".") for f in prog.frozen):
            raise ProposalRejected(f"'{k}' is frozen")
        p: Param | None = prog.search.get(k)
        if p is None:
            raise ProposalRejected(f"'{k}' is not in the search space ({', '.join(prog.search)})")
        v = p.coerce(v)
        if not p.contains(v):
            raise ProposalRejected(f"{k}={v!r} is outside the search space ({p.describe()})")
        out[k] = v
    for k, p in prog.search.items():  # keys the diff left alone keep the incumbent's value: it must fit too
        if k not in out or not p.contains(out[k]):
            raise ProposalRejected(
                f"{k} needs a value in the diff: the incumbent's ({out.get(k)!r}) is outside "
                f"the search space ({p.describe()})"
            )
    return out, str(reason)[:300] or "(no reason given)"


def make_proposer(prog: Program, search_dir: Path, client: Any = None):
    opt = OptunaProposer(prog, search_dir)
    return LLMProposer(prog, opt, client) if prog.proposer.get("kind") == "llm" else opt
