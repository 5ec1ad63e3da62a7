"""`product-blurb`: write a short product description; trained only by a reward model, judged by a hidden rule.

The point of this task is to check a reward-model pipeline end to end. The preference pairs
(`preference_pairs`) are generated from a HIDDEN RULE that no prompt states:

    a good blurb mentions the item's colour and is at most MAX_WORDS words long

`chosen` satisfies the rule, `rejected` breaks it in one of four ways, balanced: it leaves out the colour, it
runs long, both, or it names a different colour than the item's. Most rejections are hard negatives: the same
sentence as the chosen one with the colour taken out, swapped or with filler added, so a reward model cannot
separate them by style and must learn the rule. `posttrain rm train` (training/reward_model_fit.py) fits a
Bradley-Terry reward model to them.

The task's prompts are the same kind of product (same generator, held-out items unseen in training). Its
training reward is only the reward model (`reward_model` component, task.options.rm=<folder>); the hidden rule
is a weight-0 component and the pass, so `eval/pass_rate` is the share of held-out blurbs that satisfy it:
what the reward model was meant to teach, measured without it. `task.options.reward=rule` trains on the rule
itself instead (an oracle baseline to compare the reward model against).

Train and held-out are split by item noun (every noun pool halved), in the pairs and in the prompts alike.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.errors import MissingFileError

MAX_WORDS = 20
COLOURS = [
    "red",
    "blue",
    "green",
    "yellow",
    "black",
    "white",
    "grey",
    "pink",
    "purple",
    "orange",
    "brown",
    "beige",
    "navy",
    "teal",
    "ivory",
    "maroon",
    "olive",
    "turquoise",
    "crimson",
    "charcoal",
    "lavender",
    "mustard",
    "coral",
    "burgundy",
    "cream",
    "indigo",
]
MATERIALS = [
    "wool",
    "ceramic",
    "leather",
    "cotton",
    "linen",
    "bamboo",
    "glass",
    "oak",
    "steel",
    "canvas",
    "stoneware",
    "velvet",
    "felt",
    "cork",
    "walnut",
    "porcelain",
    "suede",
    "rattan",
]
# (noun, features that suit it). Split in halves by position: even -> train, odd -> held-out.
ITEMS: list[tuple[str, list[str]]] = [
    ("scarf", ["hand-knitted", "extra long", "soft on the skin"]),
    ("mug", ["holds 350 ml", "dishwasher safe", "with a wide handle"]),
    ("backpack", ["fits a 15-inch laptop", "with padded straps", "water resistant"]),
    ("lamp", ["with a dimmable bulb", "with a long cord", "with a weighted base"]),
    ("notebook", ["with 200 lined pages", "lies flat when open", "with a ribbon marker"]),
    ("vase", ["stands 30 cm tall", "with a narrow neck", "watertight inside"]),
    ("blanket", ["machine washable", "big enough for a double bed", "with tasselled edges"]),
    ("sweater", ["with a relaxed fit", "with ribbed cuffs", "machine washable"]),
    ("teapot", ["holds four cups", "with a built-in strainer", "with a drip-free spout"]),
    ("wallet", ["with six card slots", "with a coin pocket", "slim enough for a front pocket"]),
    ("candle", ["burns for 40 hours", "scented with cedar", "in a reusable jar"]),
    ("cushion", ["with a hidden zip", "filled with feathers", "45 cm square"]),
    ("umbrella", ["opens with one button", "with a wooden handle", "wind resistant"]),
    ("bowl", ["microwave safe", "with a wide rim", "stackable"]),
    ("tote bag", ["with an inner pocket", "with long handles", "folds flat"]),
    ("beanie", ["with a turn-up brim", "lined with fleece", "one size fits most"]),
    ("planter", ["with a drainage hole", "with a matching saucer", "for small succulents"]),
    ("jacket", ["with a detachable hood", "with two zip pockets", "lightly padded"]),
    ("rug", ["with a non-slip back", "120 by 170 cm", "easy to vacuum"]),
    ("apron", ["with adjustable ties", "with a front pocket", "stain resistant"]),
    ("clock", ["with a silent movement", "30 cm across", "battery powered"]),
    ("basket", ["with two handles", "collapsible", "lined with fabric"]),
    ("journal", ["with dotted pages", "with an elastic closure", "refillable"]),
    ("stool", ["seats one adult", "stackable", "with felt feet"]),
    ("tray", ["with raised edges", "with cut-out handles", "food safe"]),
    ("hat", ["with a wide brim", "packable", "with an inner sweatband"]),
    ("pouch", ["with a metal zip", "fits a phone", "with a wrist strap"]),
    ("bookend", ["sold as a pair", "with a non-slip base", "heavy enough for hardbacks"]),
]
# "{c}" is the colour, "{m}" the material; every opener ends in ", {feature}." so each feature reads right.
TEMPLATES = [
    "A {c} {m} {noun}, {feature}.",
    "This {c} {m} {noun} is made to order, {feature}.",
    "Our {c} {m} {noun}: {feature}.",
    "Meet the {c} {m} {noun}, {feature}.",
    "A handmade {m} {noun} in {c}, {feature}.",
    "Handmade {noun} in {c} {m}, {feature}.",
]
CLOSERS = [
    "Made to last.",
    "Ships in two days.",
    "A lovely gift.",
    "Made in small batches.",
    "Easy to care for.",
    "Built for daily use.",
    "",
]
# Filler for long blurbs: no colour words, nothing that states a fact the prompt did not give.
FILLERS = [
    "It is the kind of piece that quietly makes every room and every day feel a little more special.",
    "Whether you keep it for yourself or give it to someone you love, it is sure to delight.",
    "We designed it with care, tested it in our own homes, and refined it until it felt just right.",
    "Pair it with your favourite things and enjoy how naturally it fits into your everyday routine.",
    "Every single detail has been considered so that it looks good and works well for many years.",
    "It makes a thoughtful present for birthdays, holidays, housewarmings and every occasion in between.",
]
PROMPT = (
    "Write a short product description for our shop.\nItem: {noun}\nColour: {colour}\nMaterial: {material}\n"
    "Detail: {feature}"
)


def words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9'-]+", text)


def mentions(text: str, colour: str) -> bool:
    return re.search(rf"\b{re.escape(colour)}\b", text, re.IGNORECASE) is not None


def rule_ok(text: str, colour: str, max_words: int = MAX_WORDS) -> bool:
    """The hidden rule: the item's colour is named and the blurb has at most `max_words` words."""
    return mentions(text, colour) and 0 < len(words(text)) <= max_words


@dataclass(frozen=True)
class Product:
    noun: str
    colour: str
    material: str
    feature: str

    def prompt_text(self) -> str:
        return PROMPT.format(noun=self.noun, colour=self.colour, material=self.material, feature=self.feature)

    def messages(self) -> list[dict[str, str]]:
        # No system message: the reward model reads every prompt token of every pair, and on a CPU a dozen
        # tokens of boilerplate per pair is a sixth of its training time.
        return [{"role": "user", "content": self.prompt_text()}]


def items(split: str) -> list[tuple[str, list[str]]]:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return ITEMS[0::2] if split == "train" else ITEMS[1::2]


def product(rng: random.Random, split: str) -> Product:
    noun, feats = rng.choice(items(split))
    return Product(noun, rng.choice(COLOURS), rng.choice(MATERIALS), rng.choice(feats))


def _short(p: Product, rng: random.Random, colour: str | None) -> str:
    """A blurb of at most MAX_WORDS words, naming `colour` (None: no colour)."""
    first = rng.choice(TEMPLATES).format(c=colour or "", m=p.material, noun=p.noun, feature=p.feature)
    first = re.sub(r" in ,", ",", re.sub(r"  +", " ", first))  # no colour: "in {c}," and "{c} " drop out
    text = f"{first} {rng.choice(CLOSERS)}".strip()
    return text[0].upper() + text[1:]


def _long(text: str, rng: random.Random) -> str:
    """Pad a blurb with filler until it is clearly over the limit (MAX_WORDS + 4 words or more)."""
    fill = rng.sample(FILLERS, len(FILLERS))
    out = text
    while len(words(out)) < MAX_WORDS + 4:
        out = f"{out} {fill.pop()}"
    return out


REJECT_KINDS = ("no_colour", "too_long", "no_colour_long", "wrong_colour")


def pair(p: Product, rng: random.Random, kind: str) -> dict[str, Any]:
    """One preference pair for product `p`: chosen follows the rule, rejected breaks it the `kind` way."""
    tpl_rng = random.Random(rng.getrandbits(32))
    chosen = _short(p, random.Random(tpl_rng.getrandbits(32)), p.colour)
    # Hard negatives: half the time the rejected blurb is the chosen one's own sentence, altered.
    same = rng.random() < 0.5
    base_rng = random.Random(tpl_rng.getrandbits(32))  # read only when not `same`; tpl_rng has no other use after
    if kind == "no_colour":
        rejected = _short(p, base_rng, None) if not same else _drop_colour(chosen, p.colour)
    elif kind == "too_long":
        rejected = _long(chosen if same else _short(p, base_rng, p.colour), rng)
    elif kind == "no_colour_long":
        rejected = _long(_drop_colour(chosen, p.colour) if same else _short(p, base_rng, None), rng)
    elif kind == "wrong_colour":
        other = rng.choice([c for c in COLOURS if c != p.colour])
        rejected = re.sub(rf"\b{p.colour}\b", other, chosen) if same else _short(p, base_rng, other)
    else:
        raise ValueError(f"unknown rejection kind {kind!r}; known: {REJECT_KINDS}")
    assert rule_ok(chosen, p.colour) and not rule_ok(rejected, p.colour), (chosen, rejected)
    return {
        "prompt": p.messages(),
        "chosen": chosen,
        "rejected": rejected,
        "kind": kind,
        "colour": p.colour,
        "noun": p.noun,
    }


def _drop_colour(text: str, colour: str) -> str:
    out = re.sub(rf"\b{colour}\s+(?=\w)", "", text)  # "teal wool mug" -> "wool mug"; "in teal wool" -> "in wool"
    out = re.sub(rf"\s+in {colour}\b", "", out).strip()  # "mug in teal, holds" -> "mug, holds"
    return out[0].upper() + out[1:]


def preference_pairs(n_train: int = 3000, n_eval: int = 400, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train pairs, held-out pairs), rejection kinds balanced; held-out pairs use unseen item nouns.
    Deterministic in `seed`; the held-out pairs do not depend on `n_train`."""
    master = random.Random(seed)
    rngs = random.Random(master.getrandbits(64)), random.Random(master.getrandbits(64))
    out = []
    for n, split, rng in ((n_train, "train", rngs[0]), (n_eval, "eval", rngs[1])):
        kinds = [REJECT_KINDS[i % len(REJECT_KINDS)] for i in range(n)]
        rng.shuffle(kinds)
        out.append([pair(product(rng, split), rng, k) for k in kinds])
    return out[0], out[1]


# The judge's question (reward="judge"): the hidden rule, asked in words. `posttrain judge finetune --data
# product-blurb` teaches a local model to answer exactly this question (judge_examples below).
JUDGE_QUESTION = (
    "Product description: {completion}\n\nDoes this description name the colour {colour} and have "
    "at most 20 words? Answer Yes or No."
)


def default_judge_dir(name: str) -> Path:
    """Where `posttrain judge finetune --data NAME` saves by default: $POSTTRAIN_CACHE/judges/NAME."""
    from posttrain.models.default import cache_dir

    return cache_dir() / "judges" / name


def judge_examples(n_train: int = 4000, n_eval: int = 400, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train, held-out) examples for fine-tuning a judge on JUDGE_QUESTION: each preference pair gives its chosen
    blurb (Yes) and its rejected one (No), so both halves of the rule are asked about; held-out items use unseen
    nouns. The labels are the hidden rule's own (rule_ok), checked here."""
    out = []
    for pairs in preference_pairs(max(1, n_train // 2), max(1, n_eval // 2), seed):
        rows = []
        for p in pairs:
            for text in (p["chosen"], p["rejected"]):
                rows.append(
                    {
                        "question": JUDGE_QUESTION.format(completion=text, colour=p["colour"]),
                        "answer": "Yes" if rule_ok(text, p["colour"]) else "No",
                    }
                )
        out.append(rows)
    return out[0], out[1]


def hidden_rule(completions, colour, **kwargs) -> list[float]:
    """The held-out metric: 1.0 when the blurb names the item's colour and has at most MAX_WORDS words."""
    from posttrain.rewards.text import completion_text

    return [1.0 if rule_ok(completion_text(c), col) else 0.0 for c, col in zip(completions, colour)]


def _rows(n: int, rng: random.Random, split: str) -> list[dict[str, Any]]:
    rows = []
    for _ in range(n):
        p = product(rng, split)
        rows.append(
            {"prompt": p.messages(), "colour": p.colour, "noun": p.noun, "material": p.material, "feature": p.feature}
        )
    return rows


def make_task(
    rm: str | None = None,
    reward: str = "rm",
    seed: int = 0,
    n_train: int = 400,
    n_eval: int = 48,
    rm_batch_size: int = 16,
    rm_device: str = "cpu",
    max_tokens: int = 48,
    one_line: bool = True,
    judge_model: str | None = None,
):
    """The `product-blurb` task. `rm`: the reward-model folder (`posttrain rm train` writes one; default: the
    folder it writes by default, `$POSTTRAIN_CACHE/reward_models/product-blurb`). `reward`: "rm" (train on the
    reward model only), "judge" (train on an LLM judge only: JUDGE_QUESTION asked of `judge_model`, a HF folder
    such as `posttrain judge finetune` writes, default `$POSTTRAIN_CACHE/judges/product-blurb`, or 'default' for
    the untuned model) or "rule" (train on the hidden rule: the oracle baseline). `one_line`: a blurb ends at
    its first line break (every blurb the reward model was fitted to is one line; with `False` it ends at a
    blank line, and the default model then ran every completion to `max_tokens`, docs/reward_models.md)."""
    from posttrain.envs.smoke_checks import SmokeCheck
    from posttrain.envs.task import Task
    from posttrain.rewards.reward_model import default_rm_dir, reward_model
    from posttrain.rewards.rubric import RewardComponent, Rubric

    if reward not in ("rm", "judge", "rule"):
        raise ValueError(f"reward must be 'rm', 'judge' or 'rule', got {reward!r}")
    if n_train < 1 or n_eval < 0:
        raise ValueError(f"need n_train >= 1 and n_eval >= 0, got n_train={n_train}, n_eval={n_eval}")
    master = random.Random(seed)
    train_rows = _rows(n_train, random.Random(master.getrandbits(64)), "train")
    eval_rows = _rows(n_eval, random.Random(master.getrandbits(64)), "eval")
    rule = RewardComponent("hidden_rule", hidden_rule, weight=1.0 if reward == "rule" else 0.0)
    comps = [rule]
    if reward == "rm":
        # Checked now (folder and config, not the weights), so a wrong path fails at task load, not mid-run.
        comps.append(
            RewardComponent(
                "reward_model",
                reward_model(rm or default_rm_dir("product-blurb"), batch_size=rm_batch_size, device=rm_device),
                weight=1.0,
                pass_threshold=0.0,
            )
        )
    judges = {}
    if reward == "judge":
        from posttrain.rewards.judges import JudgeRunner, LocalHFBackend, PointwiseJudge

        folder = judge_model or str(default_judge_dir("product-blurb"))
        if folder not in ("default", "tiny-random") and not (Path(folder) / "config.json").exists():
            raise MissingFileError(
                f"product-blurb: judge model {folder!r} is not a HF folder; write one with "
                "`posttrain judge finetune --data product-blurb`, or pass "
                "task.options.judge_model=default for the untuned model"
            )
        judge = PointwiseJudge(
            JudgeRunner(LocalHFBackend(folder, max_batch=16), batch_size=16, timeout_s=600.0, max_retries=0),
            JUDGE_QUESTION,
            name="judge",
        )
        comps.append(RewardComponent("judge", judge, weight=1.0, pass_threshold=0.5))
        judges = {"judge": judge}
    first = train_rows[0]
    good = _short(
        Product(first["noun"], first["colour"], first["material"], first["feature"]), random.Random(0), first["colour"]
    )
    checks = [
        SmokeCheck("a blurb that follows the hidden rule passes", row=first, completion=good),
        SmokeCheck(
            "a blurb without the colour fails", row=first, completion=_drop_colour(good, first["colour"]), expect="fail"
        ),
    ]
    return Task(
        name="product-blurb",
        train_rows=train_rows,
        eval_rows=eval_rows,
        rubric=Rubric(comps, pass_component="hidden_rule"),
        smoke_checks=checks,
        description=(
            "Write a short product description. Training reward: "
            + {
                "rm": "a reward model fitted to preferences from",
                "judge": "an LLM judge asked about",
                "rule": "the rule itself, the oracle, of",
            }[reward]
            + f" a hidden rule (name the colour, at most {MAX_WORDS} words); held-out pass: the rule."
        ),
        max_tokens=max_tokens,
        stop=["\n"] if one_line else ["\n\n"],
        judges=judges,
    )
