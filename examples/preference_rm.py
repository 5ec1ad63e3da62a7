"""A reward model from your own preference data, then used as a reward, with the library API.

    python examples/preference_rm.py --model tiny-random      # a smoke run: 1 to 4 minutes on a CPU
    python examples/preference_rm.py                          # the default model, first 4 layers (minutes)

1. Preference pairs as a `datasets.Dataset` with `prompt` / `chosen` / `rejected` columns (here made by the
   built-in product-blurb generator so the example runs offline; `datasets.load_dataset(...)` of a hub dataset
   with those columns plugs in the same way, or pass `data="hf:NAME:SPLIT"`).
2. `train_reward_model` fits a Bradley-Terry reward model and saves a HF folder (what `posttrain rm train` does).
3. `reward_model(folder)` is a TRL-style reward function: put it in any task's rubric, or name it in a config
   with `task.rewards=[{fn: reward_model, path: FOLDER}]`, or for product-blurb `task.options.rm=FOLDER`.
"""

import argparse
import tempfile

from datasets import Dataset

from posttrain.tasks.product_blurb import preference_pairs
from posttrain.rewards.reward_model import reward_model
from posttrain.training.reward_model_fit import RMTrainConfig, train_reward_model
from posttrain.rewards.rubric import RewardComponent, Rubric


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--pairs", type=int, default=480)
    args = ap.parse_args()
    train, held = preference_pairs(n_train=args.pairs, n_eval=100)
    cols = ("prompt", "chosen", "rejected")
    ds = Dataset.from_list([{k: p[k] for k in cols} for p in train])
    held_ds = Dataset.from_list([{k: p[k] for k in cols} for p in held])
    out = tempfile.mkdtemp(prefix="rm-example-")
    tiny = args.model == "tiny-random"
    res = train_reward_model(RMTrainConfig(data=ds, eval_data=held_ds, model=args.model, out=out,
                                           layers=None if tiny else 4, lr=1e-3 if tiny else 3e-4,
                                           train_embeddings=tiny))
    print(f"held-out pair accuracy {res.eval_accuracy_before:.1%} -> {res.eval_accuracy:.1%}")

    rubric = Rubric([RewardComponent("rm", reward_model(res.out))])
    p = held[0]
    scores = rubric.score([p["chosen"], p["rejected"]], [{}, {}], prompts=[p["prompt"]] * 2)
    print(f"chosen:   {p['chosen']!r} -> {scores[0].reward:+.3f}")
    print(f"rejected: {p['rejected']!r} -> {scores[1].reward:+.3f}")


if __name__ == "__main__":
    main()
