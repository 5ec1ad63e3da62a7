"""LLM judges: pointwise (a rubric component), pairwise (both orders) and group ranking (a group reward), over a
local HF model or an OpenAI-compatible endpoint, with an on-disk cache, batching, timeouts and bounded retries.

    backend = LocalHFBackend("default")                       # or OpenAIBackend("http://localhost:8000/v1")
    judge = PointwiseJudge(JudgeRunner(backend), 'Reply: {completion}\\nDoes the reply ...? Answer Yes or No.')
    Rubric([RewardComponent("judge", judge)])

Modules: backends.py (protocol), local_hf.py, openai_backend.py, runner.py (cache, batches, timeouts,
retries), cache.py (sqlite), verdicts.py (strict parsing of every verdict: a judge's reply is hostile input),
pointwise.py, pairwise.py, ranking.py, agreement.py (kappa, confusion),
audit.py (`posttrain judge audit`), stats.py (metrics). See docs/judges.md.
"""

from posttrain.rewards.judges.agreement import Confusion, agreement, cohen_kappa, confusion
from posttrain.rewards.judges.backends import JudgeBackend
from posttrain.rewards.judges.cache import JudgeCache
from posttrain.rewards.judges.errors import (
    JudgeBadOutput,
    JudgeError,
    JudgeRequestError,
    JudgeTimeout,
    JudgeUnavailable,
)
from posttrain.rewards.judges.local_hf import LocalHFBackend
from posttrain.rewards.judges.openai_backend import OpenAIBackend
from posttrain.rewards.judges.pairwise import PairVerdict, PairwiseJudge, pair_verdict
from posttrain.rewards.judges.pointwise import PointwiseJudge
from posttrain.rewards.judges.ranking import RankingJudge, parse_ranking, rank_scores
from posttrain.rewards.judges.runner import JudgeRunner
from posttrain.rewards.judges.stats import JudgeStats

__all__ = [
    "Confusion",
    "JudgeBackend",
    "JudgeBadOutput",
    "JudgeCache",
    "JudgeError",
    "JudgeRequestError",
    "JudgeRunner",
    "JudgeStats",
    "JudgeTimeout",
    "JudgeUnavailable",
    "LocalHFBackend",
    "OpenAIBackend",
    "PairVerdict",
    "PairwiseJudge",
    "PointwiseJudge",
    "RankingJudge",
    "agreement",
    "cohen_kappa",
    "confusion",
    "pair_verdict",
    "parse_ranking",
    "rank_scores",
]
