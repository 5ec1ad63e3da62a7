"""The base of every settings model (`Strict`, public: each config module derives from it): unknown keys are errors,
assignments are validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
