"""Which reasoning-gym datasets are within reach of the base model? Held-out pass@1 per dataset, greedy.

For each candidate dataset (task `reasoning_gym:<name>`, default answer format: `<answer>` tags, with the fallback
to the last number or line), the base model answers `--prompts` held-out prompts greedily with `--max-tokens` new
tokens, through the eval suite (loop/eval_suite.py, what `posttrain eval --task A --task B` runs). A dataset is "in
reach" when its pass@1 is between 5% and 70%: some signal to learn from, room to learn. The input of a later
benchmark (bench/tasks_suite.py), not a test.

    python bench/rg_survey.py [--model default] [--prompts 32] [--max-tokens 128] [--datasets a b ...]
                              [--configs easy|default] [--system-prompt TEXT-or-reasoning-gym-name] [--json PATH]

`--configs easy` (the default) runs each dataset with the small config in CANDIDATES (two one-digit terms, one
animal, words of three or four letters: what a 135M model might answer); `--configs default` with the dataset's
own defaults, which are mostly out of its reach. Some easy configs have small problem spaces (products with
one-digit factors: 81 questions): a task built from them with a large train_size has few new held-out questions
left (the task warns, or refuses when none is left); `distinct` in the JSON counts the distinct questions in 2000
draws. Prints a markdown table (dataset, pass@1, mean reward, share of
replies with an <answer> tag, seconds) and writes it as JSON. One process, one model load; set OMP_NUM_THREADS to
the cores you give it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name -> an easy config. Short answers and short prompts, a range of skills: arithmetic, counting, string edits,
# logic, sequences, number theory.
CANDIDATES: dict[str, dict] = {
    "basic_arithmetic": {"max_terms": 2, "max_digits": 2, "operators": ["+", "-"], "allow_parentheses": False,
                         "allow_negation": False},
    "chain_sum": {"max_terms": 2, "max_digits": 2},
    "products": {"max_digits": 1},
    "decimal_chain_sum": {"max_terms": 2, "max_digits": 1, "max_decimal_places": 1},
    "leg_counting": {"min_animals": 1, "max_animals": 1, "max_instances": 3},
    "letter_counting": {"min_words": 1, "max_words": 3},
    "count_bits": {"max_n": 255},
    "gcd": {"max_value": 20},
    "lcm": {"max_value": 20},
    "prime_factorization": {"max_value": 100},
    "simple_equations": {"min_terms": 2, "max_terms": 2, "max_value": 10, "operators": ["+", "-"],
                         "operators_weights": [0.5, 0.5]},
    "number_sequence": {"max_terms": 5, "max_complexity": 1, "min_value": -10, "max_value": 10},
    "base_conversion": {"max_base": 10, "max_value": 20},
    "spell_backward": {"min_word_len": 3, "max_word_len": 4},
    "word_sorting": {"min_words": 2, "max_words": 3, "max_word_length": 6},
    "word_sequence_reversal": {"min_words": 2, "max_words": 3},
    "syllogism": {},
    "coin_flip": {"max_trials": 8},
    "aiw": {"max_entities": 3},
}
IN_REACH = (0.05, 0.70)


def survey(model: str, datasets: list[str], prompts: int, max_tokens: int, system_prompt: str | None,
           seed: int = 0, easy: bool = True) -> list[dict]:
    from posttrain.config import load_config
    from posttrain.loop.components import build
    from posttrain.loop.eval_suite import SuiteSettings, SuiteTask, run_suite

    options = {"eval_size": prompts, "train_size": 64, "seed": seed, "max_tokens": max_tokens}
    if system_prompt is not None:
        options["system_prompt"] = system_prompt
    # The model loads once, with the first dataset as the run's task; every dataset then runs as a suite task.
    overrides = [f"model.name={model}", f"task.name=reasoning_gym:{datasets[0]}", "sampling.eval_temperature=0",
                 "logging.console=false", "task.env_check=off"]
    c = build(load_config(None, overrides), log=lambda s: None)
    rows = []
    for name in datasets:
        t0 = time.perf_counter()
        config = CANDIDATES.get(name, {}) if easy else {}
        st = SuiteTask.load(f"reasoning_gym:{name}", {**options, **config}, prompts=prompts,
                            answer_format="answer_tag", seed=seed)
        st.max_tokens = max_tokens
        res = run_suite([st], c.sampler, c.tokenizer, SuiteSettings(samples=1, temperature=0.0, max_tokens=max_tokens))
        m = res.tasks[0].metrics
        distinct = _distinct(name, config)
        rows.append({"dataset": name, "prompts": res.tasks[0].prompts, "pass@1": m.get("pass@1", 0.0),
                     "reward": m.get("reward", 0.0), "tag": m.get("eval/pass/format", 0.0),
                     "seconds": round(time.perf_counter() - t0, 1), "distinct": distinct})
        print(_line(rows[-1]), flush=True)
    return rows


def _distinct(name: str, config: dict, draws: int = 2000) -> int:
    """Distinct questions in `draws` items: a floor on the problem space's size (held-out rows must be new)."""
    from posttrain.tasks.reasoning_gym_datasets import build_dataset

    ds = build_dataset({"name": name, "config": {**config, "size": draws, "seed": 0}})
    return len({ds[i]["question"] for i in range(draws)})


def _line(r: dict) -> str:
    lo, hi = IN_REACH
    mark = "in reach" if lo <= r["pass@1"] <= hi else ""
    return (f"| {r['dataset']:24s} | {r['prompts']:3d} | {r['pass@1']:6.1%} | {r['reward']:6.3f} | {r['tag']:6.1%} "
            f"| {r['distinct']:5d} | {r['seconds']:6.1f} | {mark:8s} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--datasets", nargs="+", default=list(CANDIDATES))
    ap.add_argument("--configs", choices=["easy", "default"], default="easy")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--system-prompt", default=None,
                    help="text, or a reasoning-gym SYSTEM_PROMPTS name; default: the task's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "rg_survey.json")
    a = ap.parse_args()
    print("| dataset                  |   n | pass@1 | reward | <answer> | distinct | seconds | 5-70%    |")
    print("|---|---|---|---|---|---|---|---|")
    rows = survey(a.model, a.datasets, a.prompts, a.max_tokens, a.system_prompt, a.seed, a.configs == "easy")
    n = sum(IN_REACH[0] <= r["pass@1"] <= IN_REACH[1] for r in rows)
    print(f"\n{n} of {len(rows)} datasets in reach ({IN_REACH[0]:.0%}-{IN_REACH[1]:.0%} pass@1)")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    configs = {r["dataset"]: CANDIDATES.get(r["dataset"], {}) if a.configs == "easy" else {} for r in rows}
    a.json.write_text(json.dumps({"model": a.model, "prompts": a.prompts, "max_tokens": a.max_tokens,
                                  "system_prompt": a.system_prompt, "seed": a.seed, "configs": configs,
                                  "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
