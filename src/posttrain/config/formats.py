"""How an answer is read from a completion: the one list of answer formats (rewards/extract.py's EXTRACTORS hold
one reader each; tests/config/test_task_options.py holds the two equal). Every option that takes a format is typed
`AnswerFormat`: task.answer_format, eval_suite.answer_format, a reward entry's, a reasoning-gym dataset's."""

from __future__ import annotations

from typing import Literal, get_args

AnswerFormat = Literal["auto", "answer_tag", "boxed", "last_line", "last_number", "none"]
ANSWER_FORMATS: tuple[str, ...] = get_args(AnswerFormat)
