"""More training pictures for the `drawing` task: (description, reference program) pairs generated from scene
families, each the generalisation of a hand-written training target in `drawing_data.TRAIN` (its colours, counts
and parts varied; the layout and the wording kept).

Why: with 40 training pictures, GRPO after the warm start collapsed onto one template (a big central circle) that
does not generalise (docs/drawing.md). Many pictures that differ only in colours, counts and parts make a policy
that reads the description score higher than one that writes a template. `make_task(train_pictures=N)` adds N of
these to the 40 references.

The generator is seeded by its own fixed seed, not the run's, so every run trains on the same pictures. No
generated description equals a held-out or a hand-written training one.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from posttrain.tasks import drawing_data as D
from posttrain.tasks.drawing_render import PALETTE

# Common colour words only: a 135M model knows "red", not "indigo" or "tan".
COLOURS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "white", "black", "grey", "brown")
NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five"}
GENERATOR_SEED = 20261203

Scene = tuple[str, str]  # (description, program)


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _distinct(rng: random.Random, k: int) -> list[str]:
    """k colours, each pair far enough apart that a figure of one on the other is a visible figure (the region
    score needs a figure cell to differ from the ground by more than 10% of the colour cube's diagonal)."""
    while True:
        picked: list[str] = rng.sample(COLOURS, k)
        if all(_far(a, b) for i, a in enumerate(picked) for b in picked[i + 1 :]):
            return picked


def _far(a: str, b: str) -> bool:
    pa, pb = PALETTE[a], PALETTE[b]
    return sum((x - y) ** 2 for x, y in zip(pa, pb)) ** 0.5 > 0.25 * (3 * 255**2) ** 0.5


# --- families: each takes the RNG and returns one scene. The training target it generalises is named. ---


def _shape_on_background(rng: random.Random) -> Scene:
    # "a blue square on an orange background", "an orange circle on a navy background", "a green triangle ..."
    c, bg = _distinct(rng, 2)
    shape = rng.choice(("circle", "square", "triangle"))
    draw = {
        "circle": f'circle(50, 50, 25, "{c}")',
        "square": f'rect(25, 25, 50, 50, "{c}")',
        "triangle": f'polygon("{c}", 50, 20, 85, 80, 15, 80)',
    }[shape]
    return f"{_article(c)} {c} {shape} on {_article(bg)} {bg} background", f'fill("{bg}")\n{draw}'


def _sky_over_ground(rng: random.Random) -> Scene:
    # "a purple sky over a black field"
    sky, ground = _distinct(rng, 2)
    kind, top = rng.choice((("field", 70), ("sea", 60), ("lake", 55)))
    return (
        f"{_article(sky)} {sky} sky over {_article(ground)} {ground} {kind}",
        f'fill("{sky}")\nrect(0, {top}, 100, {100 - top}, "{ground}")',
    )


def _sun_over_sea(rng: random.Random) -> Scene:
    # "a red sun over a blue sea", "a night sky with a white moon"
    body = rng.choice(("sun", "moon"))
    sky = "skyblue" if body == "sun" else "navy"
    while True:
        c, sea = _distinct(rng, 2)
        if _far(c, sky) and _far(sea, sky):
            break
    y, r = (35, 15) if body == "sun" else (28, 10)
    return (
        f"{_article(c)} {c} {body} over {_article(sea)} {sea} sea",
        f'fill("{sky}")\nrect(0, 60, 100, 40, "{sea}")\ncircle(50, {y}, {r}, "{c}")',
    )


def _circles_in_a_row(rng: random.Random) -> Scene:
    # "three blue circles in a row"
    c, bg = _distinct(rng, 2)
    n = rng.choice(sorted(NUMBERS))
    step = 100 // n
    r = min(12, step // 2 - 3)
    page = "" if bg == "white" else f" on {_article(bg)} {bg} page"
    return (
        f"{NUMBERS[n]} {c} circles in a row{page}",
        f'fill("{bg}")\nfor i in range({n}):\n    circle({step // 2} + {step} * i, 50, {r}, "{c}")',
    )


def _stripe_across_flag(rng: random.Random) -> Scene:
    # "a red stripe across a white flag", "a blue vertical stripe on a yellow flag"
    c, bg = _distinct(rng, 2)
    if rng.random() < 0.5:
        return f"{_article(c)} {c} stripe across {_article(bg)} {bg} flag", f'fill("{bg}")\nrect(0, 40, 100, 20, "{c}")'
    return (
        f"{_article(c)} {c} vertical stripe on {_article(bg)} {bg} flag",
        f'fill("{bg}")\nrect(40, 0, 20, 100, "{c}")',
    )


def _house(rng: random.Random) -> Scene:
    # "a red house with a brown roof"
    while True:
        wall, roof = _distinct(rng, 2)
        if _far(wall, "skyblue") and _far(roof, "skyblue"):
            break
    return (
        f"{_article(wall)} {wall} house with {_article(roof)} {roof} roof",
        f'fill("skyblue")\nrect(0, 80, 100, 20, "green")\nrect(30, 50, 40, 30, "{wall}")\n'
        f'polygon("{roof}", 25, 50, 50, 30, 75, 50)',
    )


def _flower(rng: random.Random) -> Scene:
    # "a pink flower with a green stem"
    while True:
        petals, centre = _distinct(rng, 2)
        if _far(petals, "white") and petals != "green":
            break
    return (
        f"{_article(petals)} {petals} flower with {_article(centre)} {centre} centre",
        f'fill("white")\nline(50, 50, 50, 95, "green", 3)\ncircle(50, 40, 12, "{petals}")\n'
        f'circle(50, 40, 4, "{centre}")',
    )


FAMILIES: tuple[Callable[[random.Random], Scene], ...] = (
    _shape_on_background,
    _sky_over_ground,
    _sun_over_sea,
    _circles_in_a_row,
    _stripe_across_flag,
    _house,
    _flower,
)


MAX_MISSES = 5000  # tries in a row without a new picture: the families are out


def generate(n: int, seed: int = GENERATOR_SEED) -> list[Scene]:
    """n distinct scenes, the families in turn, none with a held-out or a hand-written training description."""
    if n < 0:
        raise ValueError(f"train_pictures must be >= 0, got {n}")
    taken = {d for d, _ in D.HELD_OUT} | {d for d, _ in D.TRAIN}
    rng = random.Random(seed)
    out: list[Scene] = []
    tries = misses = 0
    while len(out) < n:
        tries += 1
        # A family that has no new picture left makes every later try a miss. Before that, the longest run of
        # misses between two new pictures is 110 (all 573 the families hold, this seed): 5000 in a row means out.
        if tries > 50 * n + 1000 or misses > MAX_MISSES:
            raise ValueError(f"the scene families ran out of new pictures after {len(out)}; ask for fewer than {n}")
        desc, program = FAMILIES[len(out) % len(FAMILIES)](rng)
        if desc not in taken:
            taken.add(desc)
            out.append((desc, program))
            misses = 0
        else:
            misses += 1
    return out
