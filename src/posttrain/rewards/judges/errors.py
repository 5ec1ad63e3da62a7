"""Why a judge call failed. `transient` errors (the endpoint down, a timeout, HTTP 429/5xx) are retried a bounded
number of times; the others (malformed output, a rejected request) are final at once, since asking the same
deterministic judge the same question again gives the same answer."""

from __future__ import annotations

from posttrain.errors import PosttrainError


class JudgeError(PosttrainError, RuntimeError):
    transient = False


class JudgeUnavailable(JudgeError):
    """The judge could not be reached (connection refused, DNS, HTTP 429 / 5xx)."""

    fix = "start the judge's server, or point the judge at one that answers (docs/judges.md)"

    transient = True


class JudgeTimeout(JudgeError):
    transient = True


class JudgeBadOutput(JudgeError):
    """The judge answered, but not in the form the question asked for (no Yes/No, no score, no ranking)."""


class JudgeRequestError(JudgeError):
    """The endpoint rejected the request (HTTP 4xx other than 408/429): a configuration error."""
