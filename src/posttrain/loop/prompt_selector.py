"""The run's prompt selector (`loop.prompt_selection`): the registered pure function of algos/prompt_selection.py
over the run's per-prompt record, kept as run state. It picks each step's rows for the collector
(a RowChooser, loop/row_choice.py), learns from the scored groups, and is a stepper plugin: its counts join
each step's metrics and its record is saved with the checkpoint, so a resumed run draws what the uninterrupted one
drew."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from posttrain.algos.prompt_selection import SELECTIONS, PromptRecord, SelectionSettings
from posttrain.types import Group


class PromptSelector:
    """The collector's row chooser for `loop.prompt_selection` (loop/row_choice.py RowChooser): picks
    each step's rows with the registered function, learns from the scored groups, and is a stepper plugin (its
    counts join each step's metrics; its record is saved with the checkpoint)."""

    def __init__(self, name: str, n_rows: int, seed: int, settings: SelectionSettings):
        self.fn, self.name = SELECTIONS[name], name
        self.n_rows, self.seed, self.settings = n_rows, seed, settings
        self.record = PromptRecord()
        self.last: dict[str, float] = {}
        self.observed: dict[str, float] = {}  # this step's pass rate per row (the report's curriculum heat map)

    def rows_for(self, step: int, k: int, rows: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """`rows`: the collector's current rows (the record is over the run's `n_rows`, fixed at the start)."""
        picked = self.fn(self.record, self.n_rows, k, step, self.seed, self.settings)
        st = [self.record.get(r).state(self.settings.retire_after, self.settings.backoff_after) for r in picked]
        self.last = {
            "select/replayed": float(st.count("learnable")),
            "select/revisited": float(st.count("mastered") + st.count("hopeless")),
            "select/fresh": float(st.count("fresh")),
        }
        return picked

    def observe(self, step: int, groups: Iterable[Group]) -> None:
        groups = list(groups)
        self.record.observe(step, groups)
        for g in groups:
            trajs = [t for t in g.trajectories_G if not t.failed]
            if trajs:
                self.observed[str(g.task_index)] = round(sum(bool(t.passed) for t in trajs) / len(trajs), 4)

    def on_remedy(self) -> None:
        self.record.clear_backoff()

    def metrics(self, trajs: list[Any]) -> dict[str, Any]:
        c = self.record.counts(self.settings)
        # A dict, not a number: metrics.jsonl keeps it, the tracker sinks skip it (obs/sinks.py numeric).
        observed, self.observed = self.observed, {}
        return {
            **self.last,
            "select/retired": float(c["mastered"]),
            "select/backed_off": float(c["hopeless"]),
            "select/learnable": float(c["learnable"]),
            "select/pass_by_prompt": observed,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"record": self.record.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.record.load_state_dict(state.get("record", {}))
