"""Remedies: what the loop changes, within set bounds, while a diagnostic is active (`diagnostics.remedies`).

A pure policy: `Remedies.update(step, record, events)` takes the step's train record and the diagnostic events
it produced, and returns the `Overrides` for the next step's sampling and training, with the changes it made
(`overrides.changes`, each to be logged). It never touches the reward: the reward functions, their weights and
the pass rate stay what the task defines; only exploration (temperature, G, a format hint appended to the
prompt), the update size (learning-rate scale, an entropy bonus) and the length controls (stop strings, the
soft overlong penalty) move.

- no learning signal, or a plateau with no pass (or `no_pass_steps` steps in a row without a passing sample, which
  comes earlier: a reward climbing on partial credit is not a plateau yet, but by the time it is, the policy has
  learned the wrong format too well for a hint to help): each stalled step (no sample passed) raises the stall
  level by 1; temperature = base + level x step (at most temperature_max), G = base x 2^floor(level) (at most
  num_generations_max), and after format_hint_after stalled steps the row's `format_hint` is appended to the
  prompt. In `guide` mode (the default) the hinted samples are trained as if the prompt had no hint (the Guide
  recipe: Nath et al. 2025, "Adaptive Guidance Accelerates Reinforcement Learning of Reasoning Models"), so
  what the hint made likely becomes likely without it; a share `guide_share` of each group is hinted, the rest
  not, and only the plain samples' passes count as passes. A step with a pass holds the level. Once the
  diagnostics clear (the groups have variance again) the level decays (x decay per step), so temperature, G
  and the hint come back to the config's values.
- entropy collapse: an entropy bonus (entropy_coef) or a lower learning rate (lr_scale), while it lasts.
- policy blow-up or a skipped step: the lower learning rate, while it lasts.
- runaway length: the soft overlong penalty (overlong_buffer_frac) and stop strings; truncation: stop strings.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from posttrain.config.schema import DiagnosticsConfig, RemediesConfig
from posttrain.obs.diagnostics import DiagnosticEvent

STALLS = {"no_signal", "plateau_no_pass"}  # the diagnostics that more exploration remedies
# The stall level stops rising here: it already gives the largest boost (G x 2^4, temperature + 4 steps), and a long
# stall must not take log2(its length) steps of decay to wind down once it is over.
LEVEL_CAP = 4.0


@dataclass(frozen=True)
class RemedyEvent:
    step: int
    remedy: str
    detail: str

    def to_record(self) -> dict[str, Any]:
        return {"kind": "remedy", **asdict(self)}

    def line(self) -> str:
        return f"remedy at step {self.step}: {self.remedy}: {self.detail}"


@dataclass(frozen=True)
class Overrides:
    """Settings for the next step. `None` / neutral values mean "as configured"."""

    temperature: float | None = None  # sampling AND trainer scoring temperature (they must stay equal)
    num_generations: int | None = None  # G per prompt
    format_hint: bool = False  # append row["format_hint"] (when the row has one) to the prompt: with_format_hint
    guide: bool = False  # with format_hint: train the hinted samples on the prompt without the hint
    guide_share: float = 1.0  # with guide: share of each group sampled with the hint
    entropy_coef: float = 0.0  # loss -= entropy_coef x mean token entropy
    lr_scale: float = 1.0  # multiply every param group's learning rate for this step
    overlong_buffer_frac: float | None = None  # turn the soft overlong penalty on (algorithm.overlong_buffer_frac)
    extra_stop: tuple[str, ...] = ()  # stop strings added to the sampling params
    changes: tuple[RemedyEvent, ...] = ()  # what this update changed: log each (metrics.jsonl + console)

    @property
    def neutral(self) -> bool:
        return self == Overrides(changes=self.changes)


class Remedies:
    def __init__(
        self,
        cfg: RemediesConfig,
        base_temperature: float,
        base_num_generations: int,
        diag_cfg: DiagnosticsConfig | None = None,
        has_format_hints: bool = True,
    ):
        self.cfg = cfg
        self.has_hints = has_format_hints  # the task's rows carry a `format_hint` (else no hint to give)
        self.diag_cfg = diag_cfg or DiagnosticsConfig()
        self.base_t = base_temperature
        self.base_g = base_num_generations
        self.level = 0.0  # stall level: +1 per stalled step, x decay per step with signal
        self.stalled_steps = 0  # consecutive stalled steps (the format hint waits for format_hint_after of them)
        self.steps_without_pass = 0  # train steps in a row in which no sample passed
        self.active: set[str] = set()  # diagnostics that are on now (from the start/clear events)
        self.current = Overrides()

    @classmethod
    def from_config(cls, cfg, has_format_hints: bool = True) -> Remedies:
        """From a whole posttrain Config."""
        return cls(
            cfg.diagnostics.remedies,
            cfg.sampling.temperature,
            cfg.algorithm.num_generations,
            cfg.diagnostics,
            has_format_hints,
        )

    def update(self, step: int, record: dict[str, Any], events: list[DiagnosticEvent]) -> Overrides:
        for e in events:
            (self.active.add if e.state == "start" else self.active.discard)(e.name)
        if not self.cfg.enabled:
            return self.current
        if record.get("kind") == "train":
            self._track_stall(record)
        new = self._overrides()
        changes = tuple(RemedyEvent(step, name, detail) for name, detail in _diff(self.current, new))
        self.current = replace(new, changes=changes)
        return self.current

    def _track_stall(self, record: dict[str, Any]) -> None:
        """The stall level. While a stall diagnostic is on, a step in which nothing passed raises it; a step with
        a pass holds it (the exploration found something: keep it until the diagnostic clears, so the policy
        can learn from it). Once no stall diagnostic is on, it decays. Why not "decay at the first step whose
        groups differ": on partial_credit (seed 0) groups that differ only by 0 vs 0.3 came every other step,
        and the boost decayed before a full answer was ever sampled."""
        # With guided samples in the step, only the plain ones count: a pass the hint made is not the policy's.
        if "pass_rate" not in record:
            return  # no headline on the training samples (label-free training): nothing to call a stall
        passed = float(record.get("pass_rate/unguided", record.get("pass_rate", 0.0)) or 0.0) > 0.0
        self.steps_without_pass = 0 if passed else self.steps_without_pass + 1
        early = 0 < self.cfg.no_pass_steps <= self.steps_without_pass
        if passed and "pass_rate/unguided" in record:
            # The plain samples pass: the policy has it. The guided hint and its teacher stop now rather than as
            # the level decays (partial_credit, seed 2: five more hinted steps after that, and the policy collapsed
            # to empty replies).
            self.stalled_steps = 0
        if self.active & STALLS or early:
            if not passed:
                self.level = min(self.level + 1.0, LEVEL_CAP)
                self.stalled_steps += 1
        else:
            self.level = self.level * self.cfg.decay if self.level >= 0.05 else 0.0
            self.stalled_steps = 0 if self.level < 0.5 else self.stalled_steps

    def _overrides(self) -> Overrides:
        c, o = self.cfg, Overrides()
        if self.level > 0:
            t = min(max(c.temperature_max, self.base_t), self.base_t + self.level * c.temperature_step)
            g = min(max(c.num_generations_max, self.base_g), self.base_g * 2 ** math.floor(self.level))
            hint = c.format_hint and self.has_hints and self.level >= 0.5 and self.stalled_steps >= c.format_hint_after
            if hint and c.format_hint_mode == "guide":
                # The hint is the exploration: a hotter sampler breaks a small model's hinted replies (base model on
                # partial_credit: 22% of hinted samples pass at T=0.7, 12% at T=1.0, and those are mostly junk).
                t = self.base_t
            o = replace(
                o,
                temperature=round(t, 3) if round(t, 3) != self.base_t else None,
                num_generations=g if g != self.base_g else None,
                format_hint=hint,
                guide=hint and c.format_hint_mode == "guide",
                guide_share=c.guide_share if hint and c.format_hint_mode == "guide" else 1.0,
            )
        if "entropy_collapse" in self.active and c.entropy == "bonus":
            o = replace(o, entropy_coef=c.entropy_bonus)
        if ("entropy_collapse" in self.active and c.entropy == "lr") or self.active & {
            "entropy_blowup",
            "skipped_steps",
        }:
            o = replace(o, lr_scale=c.lr_scale)
        if "length_runaway" in self.active and c.overlong_buffer_frac > 0:
            o = replace(o, overlong_buffer_frac=c.overlong_buffer_frac)
        if self.active & {"length_runaway", "truncation"} and c.stop:
            o = replace(o, extra_stop=tuple(c.stop))
        return o

    def state_dict(self) -> dict[str, Any]:
        cur = asdict(replace(self.current, changes=()))
        return {
            "level": self.level,
            "stalled_steps": self.stalled_steps,
            "active": sorted(self.active),
            "steps_without_pass": self.steps_without_pass,
            "current": {**cur, "changes": [], "extra_stop": list(cur["extra_stop"])},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.level, self.stalled_steps = float(state["level"]), int(state["stalled_steps"])
        self.steps_without_pass = int(state.get("steps_without_pass", 0))
        self.active = set(state["active"])
        cur = dict(state["current"])
        self.current = Overrides(**{**cur, "changes": (), "extra_stop": tuple(cur["extra_stop"])})


_NAMES = {
    "temperature": "raise exploration",
    "num_generations": "raise exploration",
    "format_hint": "format hint",
    "guide": "format hint",
    "entropy_coef": "entropy bonus",
    "lr_scale": "lower learning rate",
    "overlong_buffer_frac": "overlong penalty",
    "extra_stop": "stop strings",
}


_NEUTRAL = Overrides()


def _diff(old: Overrides, new: Overrides) -> list[tuple[str, str]]:
    out = []
    for f in _NAMES:
        a, b = getattr(old, f), getattr(new, f)
        if a != b:
            back = " (back to the config)" if b == getattr(_NEUTRAL, f) else ""
            out.append((_NAMES[f], f"{f} {_show(a)} -> {_show(b)}{back}"))
    return out


def _show(v: Any) -> str:
    return "config" if v is None else repr(v)


def with_format_hint(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its `format_hint` column appended to the last user message (or to a text prompt). Rows
    without one come back unchanged. The reward sees the same columns: only the prompt text changes."""
    hint = row.get("format_hint")
    if not hint:
        return row
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return {**row, "prompt": f"{prompt}\n{hint}"}
    msgs = [dict(m) for m in prompt]
    for m in reversed(msgs):
        if m.get("role") == "user":
            m["content"] = f"{m['content']}\n{hint}"
            break
    return {**row, "prompt": msgs}
