"""TTT-Discover-style continuous reward for single-problem discovery: a completion earns how much its score beats
the best score found so far (docs/ttrl.md).

    improvement_rewards(scores_G, best) -> (rewards_G, new_best)     pure
    BestSoFarReward(scorer, baseline, state_file)                    a Task.group_rewards function

Bookkeeping: a group is compared with the best as it stood before the group (so its G samples compete on equal
terms), then the best moves up to the group's top score. A sample the scorer could not score (None) earns 0 and
does not move the best. Before anything was scored the best is `baseline` (default 0): a first sample earns its
score above it. Bests are kept per row id (one per problem; a discovery run usually has one problem).

Where the state lives: in this object for the run, and, with `state_file`, in a JSON file rewritten atomically
after every group, with the best completion so far (the discovery itself). The loop's checkpoints do not hold task
state, so without `state_file` a resumed run starts again from `baseline`; name the same file to carry on.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from posttrain.rewards.text import completion_text


def improvement_rewards(scores: list[float | None], best: float) -> tuple[list[float], float]:
    rewards = [max(0.0, s - best) if s is not None else 0.0 for s in scores]
    valid = [s for s in scores if s is not None]
    return rewards, max([best, *valid])


class BestSoFarReward:
    __name__ = "improvement"

    def __init__(
        self, scorer: Any, baseline: float = 0.0, state_file: str | Path | None = None, id_column: str = "ttrl_id"
    ):
        """`scorer(completions, rows) -> list[float | None]`: the task's own score of each completion."""
        self.scorer, self.baseline, self.id_column = scorer, float(baseline), id_column
        self.state_file = Path(state_file) if state_file else None
        self._lock = threading.Lock()
        self.best: dict[str, float] = {}
        self.best_text: dict[str, str] = {}
        self._stats = {"groups": 0.0, "improved": 0.0, "score_sum": 0.0, "scored": 0.0}
        if self.state_file is not None and self.state_file.exists():
            self.load_state_dict(json.loads(self.state_file.read_text()))

    def __call__(self, completions: list[Any], prompts: list[Any] | None = None, **columns: Any) -> list[float]:
        n = len(completions)
        rows = [{k: v[i] for k, v in columns.items()} for i in range(n)]
        scores = self.scorer(completions, rows)
        key = str((columns.get(self.id_column) or [0])[0])
        with self._lock:
            before = self.best.get(key, self.baseline)
            rewards, after = improvement_rewards(scores, before)
            if after > before:
                top = max(range(n), key=lambda i: -float("inf") if scores[i] is None else scores[i])
                self.best[key], self.best_text[key] = after, completion_text(completions[top])
                self._stats["improved"] += 1
            self._stats["groups"] += 1
            valid = [s for s in scores if s is not None]
            self._stats["score_sum"] += sum(valid)
            self._stats["scored"] += len(valid)
            if self.state_file is not None:
                self._save()
        return rewards

    def state_dict(self) -> dict[str, Any]:
        return {"best": dict(self.best), "best_text": dict(self.best_text), "baseline": self.baseline}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = {str(k): float(v) for k, v in state.get("best", {}).items()}
        self.best_text = {str(k): str(v) for k, v in state.get("best_text", {}).items()}

    def _save(self) -> None:
        assert self.state_file is not None
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps(self.state_dict(), indent=1))
        os.replace(tmp, self.state_file)  # atomic: a crash leaves the old state, never half a file

    def drain_metrics(self) -> dict[str, float]:
        with self._lock:
            s = dict(self._stats)
            self._stats = dict.fromkeys(s, 0.0)
            best = max(self.best.values()) if self.best else (self.baseline if s["groups"] else None)
        out: dict[str, float] = {}
        if s["groups"]:
            out["ttrl/improved_groups"] = s["improved"] / s["groups"]
        if s["scored"]:
            out["ttrl/score_mean"] = s["score_sum"] / s["scored"]
        if best is not None:
            out["ttrl/best_score"] = best
        return out
