"""The `eval_suite:` section: other tasks evaluated during a run, k samples per prompt (loop/eval_suite.py)."""

from __future__ import annotations

from pydantic import Field, model_validator

from posttrain.config.formats import AnswerFormat
from posttrain.config.loop import MAX_EVAL_SAMPLES
from posttrain.config.strict import Strict
from posttrain.config.task_options import SuiteTaskConfig


class EvalSuiteConfig(Strict):
    tasks: list[SuiteTaskConfig] = Field(
        default_factory=list,
        description=(
            "tasks evaluated with pass@1 / pass@k / maj@k beside the training task, e.g. [{name: count-a}, {name: "
            "reasoning_gym:leg_counting, options: {eval_size: 32}}]; empty: no suite"
        ),
    )
    every: int = Field(
        default=0, ge=0, description="run the suite every N steps as well (0: before and after training only)"
    )
    samples: int = Field(default=8, ge=1, le=MAX_EVAL_SAMPLES, description="k: completions per prompt (at most 1024)")
    prompts: int = Field(default=32, ge=1, description="held-out prompts per task")
    temperature: float = Field(
        default=0.7,
        ge=0.0,
        allow_inf_nan=False,
        description="sampling temperature of the suite (> 0 when samples > 1)",
    )
    answer_format: AnswerFormat = Field(
        default="auto", description="how maj@k reads an answer (rewards/extract.py): auto, answer_tag, boxed, ..."
    )

    @model_validator(mode="after")
    def _sampled(self) -> EvalSuiteConfig:
        if self.samples > 1 and self.temperature == 0:
            raise ValueError(
                f"eval_suite.samples={self.samples} at temperature 0 repeats one completion; set "
                "eval_suite.temperature > 0 (e.g. 0.7) or samples=1"
            )
        return self
