"""What the named rewards (rewards/named.py's NAMED_REWARDS) share besides their options: the error a bad one
raises (RewardConfigError) and the nearest known name for a misspelt one (`nearest_name`). The options themselves
are the models of config/reward_options.py (frozen pydantic dataclasses), which the config checks `task.rewards`
with and the scorers read; its `schema_validator` (a JSON Schema checked and compiled) both refuses a bad
JsonSchemaOptions `schema` and checks each row's `schema_column` (rewards/answer_scores.py).

Apart from named.py (the registry, the reward classes) so the pure scorers can take their options without the
registry: answer_scores.py imports this module, named.py imports both, and neither imports named.py.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from posttrain.errors import PosttrainError


class RewardConfigError(PosttrainError, ValueError):
    """A reward named in the config (or by `named_reward`) that cannot be built: an unknown name, a bad option."""


def nearest_name(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""
