"""The best model by a held-out metric (HF Trainer's `load_best_model_at_end`): RL can trade correct answers for a
format bonus, and a run must not ship the worse model it ended with.

    best = BestModel("eval/pass_rate", run_dir / "best", save)   save(folder): the policy as an HF folder
    best.observe(step, eval_metrics)      after every held-out eval: a new best (ties go to the later step) is saved
    best.finish(final_dir, save, last)    loop.final_model=best: final/ is the best step's model; last: the last's

`best/` holds the best model seen so far (written atomically by the caller's `save`); its step and value are in
the checkpoint's loop state, so a resumed run keeps comparing against it. Higher is better.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SaveFn = Callable[[Path], Any]


@dataclass
class BestModel:
    metric: str
    folder: Path
    step: int | None = None
    value: float | None = None

    def observe(self, step: int, metrics: dict[str, float], save: SaveFn) -> bool:
        """Save the policy when `metrics[metric]` is at least the best so far. True when it did."""
        v = metrics.get(self.metric)
        if v is None:
            return False
        if self.value is not None and v < self.value:
            return False
        save(self.folder)
        self.step, self.value = step, float(v)
        return True

    def finish(self, final_dir: Path, save_last: SaveFn, last_step: int, use_best: bool) -> tuple[int, str]:
        """Export final/ (the best step's model under use_best, else the last one): (its step, a line saying so)."""
        if not use_best or self.step is None or self.step == last_step or not self.folder.is_dir():
            save_last(final_dir)
            return last_step, (
                f"final/ is step {last_step}"
                + (f" (held-out {self.metric} {self.value:.3f}, the best)" if self.step == last_step else "")
            )
        tmp = final_dir.with_name(f".{final_dir.name}-best")
        if tmp.exists():
            shutil.rmtree(tmp)
        shutil.copytree(self.folder, tmp)
        if final_dir.exists():
            shutil.rmtree(final_dir)
        tmp.rename(final_dir)
        return self.step, (
            f"final/ is step {self.step}, the best held-out {self.metric} ({self.value:.3f}); the last step "
            f"{last_step} scored lower (loop.final_model=last exports the last step instead)"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.value = state.get("step"), state.get("value")
