"""`posttrain auto`: an autonomous tuning loop over config diffs (docs/auto.md).

program.py (program.md: goal, metric, budget, search space, frozen keys), rules.py (noise-aware keep/revert),
runner.py (a trial as a `posttrain train` subprocess with a timeout), proposers.py (Optuna TPE + pruning, or an
LLM through an OpenAI-compatible endpoint), search.py (the loop, results.tsv, resume), report.py (report.html).
Importing this package does not import torch or optuna.
"""

from posttrain.auto.program import Param, Program, ProgramError, load_program
from posttrain.auto.results import read_results
from posttrain.auto.rules import Verdict, judge
from posttrain.auto.search import Search, SearchError, SearchResult, resume_search, start_search

__all__ = [
    "Param",
    "Program",
    "ProgramError",
    "Search",
    "SearchError",
    "SearchResult",
    "Verdict",
    "judge",
    "load_program",
    "read_results",
    "resume_search",
    "start_search",
]
