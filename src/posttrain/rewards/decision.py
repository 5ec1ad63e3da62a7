"""Rewards and metrics for calibrated decisions (the `decision-routing` task; docs/decision.md).

The answer is one bounded JSON object: `{"label": L, "probs": {L: p, ...}, "confidence": c}`.

    parse_decision(text, labels, tol) -> Decision | str        the decision, or why it is invalid
    DecisionRewards(labels, calibration)                       the rubric components and the metrics they keep
        .schema        1 when the answer is a valid decision, else 0 (the task's rubric gate)
        .correct       the gold share of the chosen label: 1 / 0 on a clear item, fractional on an ambiguous one
        .calibration   "rlcr": 1 - (confidence - correct)^2;  "brier": 1 - Brier(probs, gold) / 2;  both in [0, 1]
        .drain_metrics()  decision/* metrics over the samples scored since the last drain

Rows carry `gold` (label -> share; a clear item is {label: 1.0}). Everything is bounded, so no single sample can
dominate a group's advantages (the reason there is no log score: calibration.py).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Literal

from posttrain.bounded import BoundedError, loads_json
from posttrain.rewards.calibration import bin_index, brier, confidence_brier, ece
from posttrain.rewards.text import completion_text

CALIBRATIONS = ("rlcr", "brier")
N_BINS = 10


@dataclass(frozen=True)
class Decision:
    label: str
    probs: dict[str, float]  # every label, missing ones filled with 0
    confidence: float


def _strip_fence(text: str) -> str:
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else ""
        t = t.rsplit("```", 1)[0] if "```" in t else t
    return t.strip()


def parse_decision(text: str, labels: list[str], tol: float = 0.05) -> Decision | str:
    """The decision in `text` (the whole text is one JSON object, optionally in a ``` fence), or a short reason it is
    invalid: not JSON, a missing or extra key, an unknown label, a probability outside [0, 1], probabilities that
    do not sum to 1 within `tol`, a confidence outside [0, 1]. `probs` may leave out labels (they count as 0), so a
    small model can write only the labels it considers."""
    try:
        obj = loads_json(_strip_fence(text))  # bounded: size, depth; no NaN, Infinity or 1e999
    except BoundedError:
        return "not one JSON object"
    if not isinstance(obj, dict):
        return "not a JSON object"
    if set(obj) != {"label", "probs", "confidence"}:
        return f"keys must be label, probs, confidence; got {sorted(obj)}"
    label, probs, conf = obj["label"], obj["probs"], obj["confidence"]
    if not isinstance(label, str) or label not in labels:
        return f"unknown label {str(label)[:40]!r}"
    if not isinstance(probs, dict) or not probs:
        return "probs must be a non-empty object"
    out: dict[str, float] = dict.fromkeys(labels, 0.0)
    for k, v in probs.items():
        if k not in labels:
            return f"unknown label {k[:40]!r} in probs"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            return f"probs[{k!r}] must be a number in [0, 1]"
        out[k] = float(v)
    if abs(sum(out.values()) - 1.0) > tol:
        return f"probs sum to {sum(out.values()):.3f}, not 1"
    if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not 0.0 <= conf <= 1.0:
        return "confidence must be a number in [0, 1]"
    return Decision(label, out, float(conf))


def correctness(decision: Decision, gold: dict[str, float]) -> float:
    """The gold share of the chosen label: the chance a random annotator agrees with it."""
    return float(gold.get(decision.label, 0.0))


class DecisionRewards:
    """The three components over one metrics ledger. Each parses the completion itself (a small JSON object: cheaper
    than a cache). The schema component sees every sample (it is the gate), so it is the one that records; the
    others are spared gated-out samples."""

    def __init__(self, labels: list[str], calibration: Literal["rlcr", "brier"] = "rlcr", tol: float = 0.05):
        if calibration not in CALIBRATIONS:
            raise ValueError(
                f"calibration must be one of {', '.join(CALIBRATIONS)} (the log score is not offered: "
                f"it is unbounded), got {calibration!r}"
            )
        self.labels, self.calibration, self.tol = list(labels), calibration, tol
        self._lock = threading.Lock()
        self._records: list[tuple[bool, float, float, float, int]] = []  # valid, correct, confidence, brier, tokens

    def _parse(self, completion: Any) -> Decision | str:
        return parse_decision(completion_text(completion), self.labels, self.tol)

    def schema(
        self,
        completions: list[Any],
        gold: list[dict[str, float]],
        completion_ids: list[list[int]] | None = None,
        smoke: list[Any] | None = None,
        **_: Any,
    ) -> list[float]:
        out, recs = [], []
        for i, c in enumerate(completions):
            d = self._parse(c)
            ok = isinstance(d, Decision)
            out.append(1.0 if ok else 0.0)
            if smoke is not None and smoke[i]:  # env-check rows are not the policy's decisions
                continue
            tokens = len(completion_ids[i]) if completion_ids and completion_ids[i] is not None else 0
            if ok:
                rec = (True, correctness(d, gold[i]), d.confidence, brier(d.probs, gold[i]), tokens)
            else:
                rec = (False, 0.0, math.nan, math.nan, tokens)
            recs.append(rec)
        with self._lock:  # all at once: if this call raised halfway, the rubric's per-sample retry records them
            self._records.extend(recs)
        return out

    def correct(self, completions: list[Any], gold: list[dict[str, float]], **_: Any) -> list[float]:
        return [
            correctness(d, g) if isinstance(d := self._parse(c), Decision) else 0.0 for c, g in zip(completions, gold)
        ]

    def calibration_score(self, completions: list[Any], gold: list[dict[str, float]], **_: Any) -> list[float]:
        out = []
        for c, g in zip(completions, gold):
            d = self._parse(c)
            if not isinstance(d, Decision):
                out.append(0.0)
            elif self.calibration == "rlcr":
                out.append(1.0 - confidence_brier(d.confidence, correctness(d, g)))
            else:
                out.append(1.0 - brier(d.probs, g) / 2.0)
        return out

    def drain_metrics(self) -> dict[str, float]:
        """decision/* over the samples scored since the last call, then forget them. Accuracy and tokens are over
        every sample (an invalid answer is a wrong decision); ECE, Brier and confidence over the valid ones. The
        `decision/rel/bK/*` sums are the reliability diagram's bins (posttrain report draws them)."""
        with self._lock:
            recs, self._records = self._records, []
        if not recs:
            return {}
        valid = [r for r in recs if r[0]]
        m = {
            "decision/n": float(len(recs)),
            "decision/valid_rate": len(valid) / len(recs),
            "decision/accuracy": sum(r[1] for r in recs) / len(recs),
            "decision/tokens_per_decision": sum(r[4] for r in recs) / len(recs),
        }
        if valid:
            conf, corr = [r[2] for r in valid], [r[1] for r in valid]
            m["decision/ece"] = ece(conf, corr, N_BINS)
            m["decision/brier"] = sum(r[3] for r in valid) / len(valid)
            m["decision/confidence"] = sum(conf) / len(conf)
            m["decision/accuracy_valid"] = sum(corr) / len(corr)
            for c, y in zip(conf, corr):
                b = f"decision/rel/b{bin_index(c, N_BINS)}"
                m[f"{b}/n"] = m.get(f"{b}/n", 0.0) + 1.0
                m[f"{b}/conf_sum"] = m.get(f"{b}/conf_sum", 0.0) + c
                m[f"{b}/correct_sum"] = m.get(f"{b}/correct_sum", 0.0) + y
        return m
