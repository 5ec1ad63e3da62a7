"""The best model by a held-out metric (HF Trainer's `load_best_model_at_end`): RL can trade correct answers for a
format bonus, and a run must not ship the worse model it ended with.

    best = BestModel("eval/pass_rate", run_dir / "best", save)   save(folder): the policy as an HF folder
    best.observe(step, eval_metrics)      after every held-out eval: a new best (ties go to the later step) is saved
    best.finish(final_dir, save, last)    loop.final_model=best: final/ is the best step's model; last: the last's

`best/` holds the best model seen so far (written atomically by the caller's `save`); its step and value are in
the checkpoint's loop state, so a resumed run keeps comparing against it. Higher is better.

The metric must be one the held-out eval writes: `check_best_metric(metric, eval_metric_names(task, samples))`
refuses a name that is not, with the nearest one (the run at its start and `--dry-run`, loop/start_checks.py). A
name only the run can know (an env's episode metric, a judge's or reward's own counter) is taken on trust; the
first eval without it says so, and so does final/'s line.
"""

from __future__ import annotations

import difflib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.envs.task import Task
from posttrain.errors import PosttrainError
from posttrain.types import TASK_COLUMN

SaveFn = Callable[[Path], Any]

# What every held-out eval writes (loop/evaluate.py from obs/rollout_stats.py; the Run adds eval/reward), beside
# the names of the task's reward components and a mixture's parts. The rollout/failed_* ones only when a sample
# failed. tests/loop/test_best_model.py compares this with what an eval writes.
_EVAL_METRICS = (
    "reward/mean", "reward/std", "reward", "pass_rate", "seconds",
    "completion/len_mean", "completion/len_max", "completion/truncated_frac",
    "rollouts/failed", "rollouts/count", "rollout/failed_rollout", "rollout/failed_score", "rollout/failed_frac",
)  # fmt: skip
_INSIGHTS = ("insights/pass_rate", "insights/retry_pass_rate", "insights/written")  # algorithm.insights


class BestMetricError(PosttrainError):
    """loop.best_metric names no metric the held-out eval writes: no best model would ever be kept."""

    fix = "set loop.best_metric to a metric the held-out eval writes, or loop.final_model=last"


def eval_metric_names(task: Task, samples: int, insights: bool = False) -> set[str]:
    """The metrics a held-out eval of `task` writes, `samples` completions a prompt."""
    names = [*_EVAL_METRICS, *(_INSIGHTS if insights else ())]
    for c in task.rubric.components:
        names += [f"reward/{c.name}", f"pass/{c.name}"]
    for part in sorted({str(r[TASK_COLUMN]) for r in task.eval_rows if TASK_COLUMN in r}):
        names += [f"task/{part}/pass_rate", f"task/{part}/reward", f"task/{part}/samples"]
    if samples > 1:
        names += ["pass_at_n", "samples_per_prompt"]
    return {f"eval/{n}" for n in names}


def check_best_metric(metric: str, names: set[str]) -> None:
    """BestMetricError unless `metric` is one of `names` or a name only the run knows (under eval/ and close to
    none of them); near-misses name the nearest."""
    if metric in names or any(metric.startswith(f"{n}/") for n in names):
        return  # written, or a counter under a written name (a named reward's own: eval/reward/math/errors)
    tries = [metric] if metric.startswith("eval/") else [f"eval/{metric}", metric]
    near = next((m for t in tries for m in difflib.get_close_matches(t, sorted(names), n=1, cutoff=0.8)), None)
    if near is None and metric.startswith("eval/"):
        return  # an episode metric or a judge's own counter: known once the eval runs
    shown = ["eval/pass_rate", "eval/reward/mean", *sorted(n for n in names if n.startswith("eval/pass/"))]
    said = f"did you mean {near!r}? " if near else "held-out metrics are named eval/...; "
    raise BestMetricError(
        f"loop.best_metric {metric!r} is not a metric the held-out eval writes; {said}(it writes "
        f"{', '.join(shown)} and more: docs/reference/config.md)"
    )


@dataclass
class BestModel:
    metric: str
    folder: Path
    step: int | None = None
    value: float | None = None
    say: Callable[[str], Any] | None = None  # the first eval without the metric is said here
    _absent: bool = field(default=False, init=False, repr=False)  # an eval has lacked the metric

    def observe(self, step: int, metrics: dict[str, float], save: SaveFn) -> bool:
        """Save the policy when `metrics[metric]` is at least the best so far. True when it did."""
        v = metrics.get(self.metric)
        if v is None:
            if not self._absent and self.say is not None:
                self.say(
                    f"warning: loop.best_metric {self.metric!r} is not in this held-out eval's metrics: no best "
                    "model is kept from it"
                )
            self._absent = True
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
            if use_best and self.step is None and self._absent:
                return last_step, (
                    f"final/ is step {last_step} (loop.best_metric {self.metric!r} was in no held-out eval: the "
                    "last step)"
                )
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
