"""The generator of `data/listing_triplets.jsonl`: (query, engaged listing, non-engaged listing) triplets.

Written for this project from templates: shop listings in twelve product families. Each listing has a noun,
a colour, a material, a motif or style, a size or feature and a recipient. A triplet's query names two or three
of the ENGAGED listing's attributes ("teal stoneware mug with a mountain design"); the NON-ENGAGED listing is
the same kind of product that differs in those attributes and shares the rest. Titles are keyword-stuffed from
one pool per family, as shop titles often are, so a title alone barely tells the two apart: the details that
match the query sit in the description, between shipping and care boilerplate. A summary that names them lets
a retriever rank the engaged listing first; a generic keyword list does not.

    python -m posttrain.tasks.listing_data      # rewrites the data file (deterministic, seed 0)
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_FILE = Path(__file__).parent / "data" / "listing_triplets.jsonl"
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
    "teal",
    "navy",
    "mustard",
    "sage",
    "terracotta",
    "lavender",
    "burgundy",
    "cream",
]
RECIPIENTS = [
    "mom",
    "dad",
    "a teacher",
    "a new baby",
    "a best friend",
    "a bridesmaid",
    "a coworker",
    "a grandmother",
    "a couple",
    "a gardener",
]


@dataclass(frozen=True)
class Family:
    noun: str
    materials: list[str]
    motifs: list[str]  # a design, pattern or style, as a phrase that follows "with a" / "in a"
    features: list[str]  # a size or feature phrase
    title_words: list[str]  # the keyword-stuffing pool of this family's titles
    made: str  # how it is made, "{m}" is the material


FAMILIES = [
    Family(
        "mug",
        ["stoneware", "porcelain", "enamel", "earthenware"],
        ["mountain design", "floral pattern", "cat illustration", "geometric pattern", "speckled glaze"],
        ["holds 12 oz", "holds 16 oz", "with an oversized handle", "with a matching lid"],
        [
            "Handmade Mug",
            "Coffee Cup",
            "Pottery Mug",
            "Tea Mug",
            "Gift for Her",
            "Birthday Gift",
            "Unique Gift",
            "Ceramic Mug",
            "Kitchen Decor",
        ],
        "Each mug is thrown by hand in {m}",
    ),
    Family(
        "necklace",
        ["sterling silver", "gold-filled", "brass", "rose gold"],
        ["moon pendant", "birthstone charm", "initial disc", "tiny heart", "pressed flower locket"],
        ["on an 18 inch chain", "on a 16 inch chain", "with an adjustable chain", "with a layered chain"],
        [
            "Dainty Necklace",
            "Minimalist Jewelry",
            "Gift for Her",
            "Layering Necklace",
            "Personalized Gift",
            "Everyday Necklace",
            "Bridesmaid Gift",
            "Pendant Necklace",
        ],
        "Each piece is made from {m}",
    ),
    Family(
        "blanket",
        ["merino wool", "cotton", "alpaca", "chunky acrylic"],
        ["waffle knit", "cable knit", "herringbone weave", "striped pattern", "fringed edge"],
        ["in a throw size", "in a queen size", "in a baby size", "with a weighted fill"],
        [
            "Knit Blanket",
            "Throw Blanket",
            "Cozy Home Decor",
            "Housewarming Gift",
            "Sofa Throw",
            "Soft Blanket",
            "Nursery Decor",
            "Gift Idea",
        ],
        "Each blanket is knitted from {m}",
    ),
    Family(
        "tote bag",
        ["canvas", "vegan leather", "jute", "recycled cotton"],
        ["botanical print", "bold stripe", "embroidered name", "sunflower print", "minimalist logo"],
        ["with a zip top", "with an inner pocket", "with long shoulder straps", "in an oversized size"],
        [
            "Tote Bag",
            "Shopping Bag",
            "Beach Bag",
            "Reusable Bag",
            "Gift for Her",
            "Teacher Gift",
            "Market Bag",
            "Everyday Bag",
        ],
        "Each bag is sewn from {m}",
    ),
    Family(
        "candle",
        ["soy wax", "beeswax", "coconut wax", "rapeseed wax"],
        ["lavender scent", "sandalwood scent", "fresh linen scent", "pumpkin spice scent", "sea salt scent"],
        ["in a 200 g amber jar", "in a travel tin", "with a wooden wick", "with a 50 hour burn time"],
        [
            "Scented Candle",
            "Home Fragrance",
            "Candle Gift",
            "Relaxation Gift",
            "Self Care",
            "Hygge Decor",
            "Natural Candle",
            "Gift Box",
        ],
        "Each candle is hand poured from {m}",
    ),
    Family(
        "print",
        ["matte paper", "watercolour paper", "canvas", "recycled card"],
        ["abstract line art", "botanical illustration", "city map", "ocean landscape", "vintage poster style"],
        ["in A4 size", "in A3 size", "in a square 30 cm size", "with an oak frame"],
        [
            "Wall Art",
            "Art Print",
            "Home Decor",
            "Poster",
            "Gallery Wall",
            "Living Room Art",
            "Printable Gift",
            "Modern Art",
        ],
        "Each print is produced on {m}",
    ),
    Family(
        "planter",
        ["terracotta", "concrete", "glazed ceramic", "recycled plastic"],
        ["face design", "ribbed texture", "hanging macrame cradle", "drip glaze", "geometric faceted shape"],
        ["10 cm wide", "for small succulents", "with a drainage hole", "with a bamboo saucer"],
        [
            "Plant Pot",
            "Indoor Planter",
            "Succulent Pot",
            "Plant Lover Gift",
            "Home Decor",
            "Gardening Gift",
            "Modern Planter",
            "Cactus Pot",
        ],
        "Each planter is cast in {m}",
    ),
    Family(
        "earrings",
        ["sterling silver", "polymer clay", "gold-plated brass", "wood"],
        ["hoop shape", "dangling leaf", "pearl drop", "stud style", "arch shape"],
        ["for sensitive ears", "in a small size", "in a statement size", "with hypoallergenic hooks"],
        [
            "Earrings",
            "Dangle Earrings",
            "Gift for Her",
            "Boho Jewelry",
            "Statement Earrings",
            "Minimalist",
            "Birthday Gift",
            "Handmade Jewelry",
        ],
        "Each pair is shaped from {m}",
    ),
    Family(
        "cutting board",
        ["walnut", "maple", "olive wood", "acacia"],
        ["engraved recipe", "juice groove", "paddle shape", "end grain checkerboard", "live edge"],
        ["in a large 45 cm size", "in a small serving size", "with a leather hanging strap", "with rubber feet"],
        [
            "Cutting Board",
            "Charcuterie Board",
            "Kitchen Gift",
            "Wedding Gift",
            "Housewarming Gift",
            "Cheese Board",
            "Personalized Gift",
            "Chopping Board",
        ],
        "Each board is cut from solid {m}",
    ),
    Family(
        "sweater",
        ["merino wool", "cotton", "cashmere blend", "mohair"],
        ["cable knit", "fair isle pattern", "embroidered flowers", "oversized fit", "turtleneck style"],
        ["in size small", "in size large", "with balloon sleeves", "in a cropped length"],
        [
            "Knit Sweater",
            "Handmade Jumper",
            "Cozy Sweater",
            "Winter Fashion",
            "Gift for Her",
            "Womens Pullover",
            "Knitwear",
            "Chunky Knit",
        ],
        "Each sweater is hand knitted from {m}",
    ),
    Family(
        "notebook",
        ["recycled paper", "leather cover", "linen cover", "kraft card"],
        ["dotted pages", "pressed flower cover", "embossed initials", "lined pages", "blank sketch pages"],
        ["in A5 size", "in pocket size", "with 200 pages", "with a lay-flat binding"],
        [
            "Journal",
            "Notebook",
            "Sketchbook",
            "Stationery Gift",
            "Travel Journal",
            "Bullet Journal",
            "Planner",
            "Writing Gift",
        ],
        "Each notebook is bound by hand with a {m}",
    ),
    Family(
        "dog collar",
        ["leather", "nylon webbing", "waxed canvas", "hemp"],
        ["engraved name tag", "floral pattern", "reflective stripe", "bow tie", "tartan pattern"],
        ["for small dogs", "for large dogs", "with a quick release buckle", "with a matching lead"],
        [
            "Dog Collar",
            "Pet Accessories",
            "Puppy Collar",
            "Dog Lover Gift",
            "Personalized Collar",
            "Pet Gift",
            "Adjustable Collar",
            "New Puppy",
        ],
        "Each collar is made from {m}",
    ),
]
BOILERPLATE = [
    "Ships within 3 to 5 business days.",
    "Please allow for small variations, as every piece is handmade.",
    "Gift wrapping is available at checkout.",
    "Message me with any questions before ordering.",
    "Colours may look slightly different on your screen.",
    "Made to order in my small studio.",
    "Free shipping on orders over 35 dollars.",
    "Thank you for supporting a small business!",
]
QUERY_FORMS = [
    "{colour} {material} {noun}",
    "{colour} {noun} with {motif}",
    "{material} {noun} {feature}",
    "{noun} with {motif} for {recipient}",
    "{colour} {noun} {feature}",
    "{material} {noun} with {motif}",
]


def _attrs(fam: Family, rng: random.Random) -> dict[str, str]:
    return {
        "noun": fam.noun,
        "colour": rng.choice(COLOURS),
        "material": rng.choice(fam.materials),
        "motif": rng.choice(fam.motifs),
        "feature": rng.choice(fam.features),
        "recipient": rng.choice(RECIPIENTS),
    }


def _differ(fam: Family, a: dict[str, str], keys: list[str], rng: random.Random) -> dict[str, str]:
    """A copy of `a` with every attribute in `keys` changed and the others kept."""
    pools = {
        "colour": COLOURS,
        "material": fam.materials,
        "motif": fam.motifs,
        "feature": fam.features,
        "recipient": RECIPIENTS,
    }
    b = dict(a)
    for k in keys:
        b[k] = rng.choice([v for v in pools[k] if v != a[k]])
    return b


def listing_text(fam: Family, a: dict[str, str], rng: random.Random) -> str:
    title = ", ".join(rng.sample(fam.title_words, 5))
    facts = [
        f"{fam.made.format(m=a['material'])} and finished in {a['colour']}.",
        f"It comes with a {a['motif']}.",
        f"Details: {a['feature']}.",
        f"A lovely present for {a['recipient']}.",
    ]
    rng.shuffle(facts)
    body = facts + rng.sample(BOILERPLATE, 2)
    rng.shuffle(body)
    return f"{title}\n{' '.join(body)}"


def _keys(form: str) -> list[str]:
    return [k for k in ("colour", "material", "motif", "feature", "recipient") if "{" + k + "}" in form]


def triplet(rng: random.Random) -> dict[str, Any]:
    fam = rng.choice(FAMILIES)
    form = rng.choice(QUERY_FORMS)
    keys = _keys(form)
    eng = _attrs(fam, rng)
    # The non-engaged listing differs in one or all of the queried attributes: sometimes only one detail
    # separates the two (the hard case), sometimes everything the query asks for.
    changed = keys if rng.random() < 0.5 else [rng.choice(keys)]
    non = _differ(fam, eng, changed, rng)
    query = form.format(**{k: (v if k != "motif" else f"a {v}") for k, v in eng.items()})
    return {
        "query": query,
        "engaged": listing_text(fam, eng, rng),
        "non_engaged": listing_text(fam, non, rng),
        "family": fam.noun,
        "differs_in": changed,
    }


def generate(n_train: int = 400, n_eval: int = 100, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n_train + n_eval:
        t = triplet(rng)
        if t["query"] + t["engaged"] in seen:
            continue
        seen.add(t["query"] + t["engaged"])
        rows.append({**t, "split": "train" if len(rows) < n_train else "eval"})
    return rows


def write(path: Path = DATA_FILE) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in generate()))


if __name__ == "__main__":
    write()
    print(f"wrote {DATA_FILE}")
