"""`drawing`: write a short drawing program for a description; it is gated, rendered and compared with a reference
(the watercolours recipe, small: a restricted drawing API, a gate against cheats, render-and-score, an optional
judge). docs/drawing.md.

Each row: a chat prompt (the description and the ten drawing calls), `description`, `reference` (the reference
program, drawing_data.py). The completion is the program (a ``` fence around it is allowed).

Rubric, in order (a failed rubric gate zeroes the sample and spares it the rest):
    drawing_gate    1 when the program passes the AST allow-list (drawing_gate.py) AND renders within budget
                    (drawing_render.py); else 0. The rubric gate.
    drawing_length  1 - characters / MAX_CHARS, in [0, 1], for a program whose image scores above 0, else 0:
                    shorter programs slightly favoured (small weight). Paid only to drawings that get somewhere:
                    paid to any gated program, it made `fill("white")` (draws nothing, 13 characters) the best
                    program a run could find (measured: every held-out program after 20 RL steps).
    drawing_image   max(0, 1 - d / d_flat): d the mean colour distance to the reference render at 16 x 16, d_flat
                    that of the best one-colour page (`image_baseline="flat"`, default), so a blank page or a right
                    background alone scores 0; `image_baseline="region"`: that progress per 16 x 16 cell (figure
                    cells gained x ground cells kept, drawing_render.region_score), which pays a shape half over its
                    place; `image_baseline="none"`: max(0, 1 - d / image_scale). The pass
                    component, at `pass_threshold`.
    judge           only with `judge=`: "llm" (a yes/no LLM judge on the program text and description) or
                    "module:function" (a learned scorer: fn(images, descriptions) -> scores in [0, 1], e.g. CLIP)
Metrics: drawing/render_ms (mean milliseconds per render), drawing/renders, drawing/gate_pass_rate.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections import OrderedDict
from typing import Any

from PIL import Image

from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import Task
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.rewards.text import completion_text
from posttrain.tasks import drawing_data as D
from posttrain.tasks import drawing_scenes as scenes
from posttrain.tasks.drawing_gate import MAX_CHARS, check_program
from posttrain.tasks.drawing_render import RenderError, flat_distance, image_distance, region_score, render

SYSTEM = "You write short drawing programs."
API = (
    "fill(color) gradient(top, bottom) rect(x, y, w, h, color) circle(x, y, r, color) "
    "ellipse(x, y, rx, ry, color) line(x1, y1, x2, y2, color, width) polygon(color, x1, y1, x2, y2, x3, y3, ...) "
    "stroke(x1, y1, x2, y2, color, width) wash(color, alpha) canvas(w, h)"
)
USER = (
    "Draw: {description}\nCalls: " + API + '\nCoordinates 0-100, y down; colours like "red" or "#ff0000"; '
    '`for i in range(n):` loops. Example:\nfill("skyblue")\ncircle(50, 30, 10, "yellow")\n'
    "Reply with only the code."
)
JUDGE_QUESTION = "A drawing program:\n{completion}\nDoes this program draw {description}? Answer Yes or No."
SIZE = 64
MIN_FLAT = 0.05  # a nearly flat reference still leaves room between a blank page and a copy
IMAGE_BASELINES = ("flat", "region", "none")
CACHE = 512  # renders kept per task (a step's gate, image score and judge share one render per program)


def program_text(completion: Any) -> str:
    """The program in a completion: the inside of its first ``` fence when it has one (prose around the fence is
    ignored: small models introduce their code with a sentence), else the whole text."""
    t = completion_text(completion)
    if "```" in t:
        t = t[t.index("```") + 3 :]
        t = t.split("\n", 1)[1] if "\n" in t else ""  # the fence line's language tag
        if "```" in t:
            t = t[: t.index("```")]
    return t.strip("\n")


class Renders:
    """Renders programs once (an LRU cache by source text), times them and keeps the drawing/* counters."""

    def __init__(self, size: int = SIZE):
        self.size = size
        self._cache: OrderedDict[str, Image.Image | str] = OrderedDict()
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.renders, self.render_s, self.checked, self.gate_passed = 0, 0.0, 0, 0

    def get(self, source: str, count: bool = True) -> Image.Image | str:
        """The image, or why it was refused or failed to render. `count=False`: leave it out of the metrics (the env
        check's rows)."""
        with self._lock:
            if source in self._cache:
                self._cache.move_to_end(source)
                return self._cache[source]
        g = check_program(source)
        if not g.ok:
            out: Image.Image | str = f"gate: {g.reason}"
        else:
            assert g.tree is not None  # the gate keeps the tree of a program it accepts
            t0 = time.perf_counter()
            try:
                out = render(g.tree, self.size)
            except RenderError as e:
                out = f"render: {e}"
            if count:
                with self._lock:
                    self.renders += 1
                    self.render_s += time.perf_counter() - t0
        with self._lock:
            self._cache[source] = out
            while len(self._cache) > CACHE:
                self._cache.popitem(last=False)
        return out

    def gate(self, completions: list[Any], smoke: list[Any] | None = None, **_: Any) -> list[float]:
        real = [not (smoke and smoke[i]) for i in range(len(completions))]  # env checks are not the policy's
        out = [1.0 if isinstance(self.get(program_text(c), r), Image.Image) else 0.0 for c, r in zip(completions, real)]
        counted = [v for v, r in zip(out, real) if r]
        with self._lock:
            self.checked += len(counted)
            self.gate_passed += int(sum(counted))
        return out

    def drain_metrics(self) -> dict[str, float]:
        """drawing/* since the last drain (reference renders count in render_ms too: they are renders; the env
        check's do not), then reset."""
        with self._lock:
            if not (self.renders or self.checked):
                return {}
            m = {"drawing/renders": float(self.renders), "drawing/checked": float(self.checked)}
            if self.renders:
                m["drawing/render_ms"] = 1000.0 * self.render_s / self.renders
            if self.checked:
                m["drawing/gate_pass_rate"] = self.gate_passed / self.checked
            self._reset()
        return m


def program_length(completions: list[Any]) -> list[float]:
    """1 - characters / MAX_CHARS, in [0, 1], whatever the program draws."""
    return [max(0.0, 1.0 - len(program_text(c)) / MAX_CHARS) for c in completions]


def _length_score(image_score):
    def drawing_length(completions: list[Any], reference: list[str], **kw: Any) -> list[float]:
        """The length term, for programs whose image scores; a blank page earns nothing here either."""
        image = image_score(completions, reference, **kw)
        return [n if im > 0.0 else 0.0 for n, im in zip(program_length(completions), image)]

    return drawing_length


def _image_score(renders: Renders, baseline: str, image_scale: float):
    flat: dict[str, float] = {}  # reference program -> its flat-page distance

    def drawing_image(
        completions: list[Any], reference: list[str], smoke: list[Any] | None = None, **_: Any
    ) -> list[float]:
        out = []
        for i, (c, ref) in enumerate(zip(completions, reference)):
            img, want = renders.get(program_text(c)), renders.get(ref, count=not (smoke and smoke[i]))
            if not isinstance(want, Image.Image):
                raise RenderError(f"the reference program does not render: {want}")  # a broken task, loudly
            if not isinstance(img, Image.Image):
                out.append(0.0)
                continue
            if baseline == "region":
                out.append(region_score(img, want))
                continue
            if baseline == "flat":
                if ref not in flat:
                    flat[ref] = max(MIN_FLAT, flat_distance(want))
                scale = flat[ref]
            else:
                scale = image_scale
            out.append(max(0.0, 1.0 - image_distance(img, want) / scale))
        return out

    return drawing_image


def _scorer_component(spec: str, renders: Renders):
    """A learned scorer named 'package.module:function': function(images, descriptions) -> scores in [0, 1]."""
    mod_name, _, fn_name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(
            f"judge {spec!r}: cannot load the scorer ({type(e).__name__}: {e}); expected "
            "'package.module:function' taking (images, descriptions)"
        ) from None

    def judge(completions: list[Any], description: list[str], **_: Any) -> list[float]:
        rendered = [renders.get(program_text(c)) for c in completions]
        images = [im for im in rendered if isinstance(im, Image.Image)]
        if len(images) != len(rendered):
            raise RenderError("judge called on a program that did not render (the gate should have stopped it)")
        scores = [float(s) for s in fn([im.copy() for im in images], list(description))]  # the cache keeps its own
        if len(scores) != len(images) or not all(0.0 <= s <= 1.0 for s in scores):
            raise ValueError(f"scorer {spec!r} must return one score in [0, 1] per image")
        return scores

    return judge


def _llm_judge(judge_model: str, judge_base_url: str | None):
    from posttrain.rewards.judges import JudgeRunner, PointwiseJudge
    from posttrain.tasks.json_judged import make_backend

    backend = make_backend(judge_model, judge_base_url)
    runner = JudgeRunner(backend, batch_size=8) if not judge_base_url else JudgeRunner(backend)
    return PointwiseJudge(runner, JUDGE_QUESTION, name="judge")


def _row(description: str, reference: str) -> dict[str, Any]:
    return {
        "prompt": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": USER.format(description=description)},
        ],
        "description": description,
        "reference": reference,
    }


def make_task(
    judge: str | None = None,
    judge_weight: float = 0.5,
    judge_model: str = "default",
    judge_base_url: str | None = None,
    image_baseline: str = "flat",
    image_scale: float = 0.5,
    pass_threshold: float = 0.5,
    weights: dict[str, float] | None = None,
    max_tokens: int = 160,
    train_pictures: int = 0,
    eval_pictures: int = 0,
) -> Task:
    """The `drawing` task. `judge`: None (default, off), "llm" (a yes/no judge on the program text, `judge_model` /
    `judge_base_url` as in json-extract-judged) or "package.module:function" (a scorer of the rendered images).
    `image_baseline`: "flat" (score the progress past the best one-colour page), "region" (the same progress per
    cell: figure drawn x ground kept, drawing_render.region_score) or "none" (with `image_scale`, the colour
    distance that scores 0). `weights` overrides drawing_gate, drawing_length, drawing_image by name.
    `train_pictures`: generated training pictures added to the 40 hand-written ones (drawing_scenes.py).
    `eval_pictures`: 0 (default) evaluates on the 15 hand-written held-out descriptions; N > 0 evaluates on N more
    generated pictures instead, none of them trained on: an in-distribution check that tells a policy that did not
    learn from one that learned but does not carry over to the hand-written set."""
    if image_baseline not in IMAGE_BASELINES:
        raise ValueError(f"image_baseline must be one of {IMAGE_BASELINES}, got {image_baseline!r}")
    if image_scale <= 0 or not 0 < pass_threshold <= 1:
        raise ValueError(f"need image_scale > 0 and 0 < pass_threshold <= 1, got {image_scale}, {pass_threshold}")
    for key, n in (("train_pictures", train_pictures), ("eval_pictures", eval_pictures)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{key} must be a whole number >= 0, got {n!r}")
    w = {"drawing_gate": 0.1, "drawing_length": 0.1, "drawing_image": 1.0}
    for k, v in (weights or {}).items():
        if k not in w:
            raise ValueError(f"unknown weight {k!r}; components: {', '.join(w)}")
        w[k] = float(v)
    renders = Renders()
    image = _image_score(renders, image_baseline, image_scale)
    comps = [
        RewardComponent("drawing_gate", renders.gate, weight=w["drawing_gate"]),
        RewardComponent("drawing_length", _length_score(image), weight=w["drawing_length"], pass_threshold=0.5),
        RewardComponent("drawing_image", image, weight=w["drawing_image"], pass_threshold=pass_threshold),
    ]
    judges: dict[str, Any] = {}
    if judge == "llm":
        j = _llm_judge(judge_model, judge_base_url)
        judges["judge"] = j
        comps.append(RewardComponent("judge", j, weight=judge_weight, pass_threshold=0.5))
    elif judge is not None:
        if ":" not in str(judge):
            raise ValueError(f"judge must be None, 'llm' or 'package.module:function', got {judge!r}")
        comps.append(
            RewardComponent("judge", _scorer_component(judge, renders), weight=judge_weight, pass_threshold=0.5)
        )
    # One generated sequence: the first train_pictures train and the next eval_pictures evaluate, so no eval
    # picture is ever trained on. The eval pictures depend on train_pictures: compare runs with the same value.
    generated = scenes.generate(train_pictures + eval_pictures)
    train_rows = [_row(d, p) for d, p in D.TRAIN + generated[:train_pictures]]
    held_out = generated[train_pictures:] if eval_pictures else D.HELD_OUT
    first = {**train_rows[0], "smoke": True}
    checks = [
        SmokeCheck("the reference program passes", row=first, completion=first["reference"]),
        SmokeCheck(
            "the reference in a ``` fence passes", row=first, completion=f"```python\n{first['reference']}\n```"
        ),
        SmokeCheck("a blank page fails", row=first, completion='fill("white")', expect="fail"),
        SmokeCheck(
            "an import is refused by the gate", row=first, completion="import os\n" + first["reference"], expect="fail"
        ),
        SmokeCheck("attribute escapes are refused", row=first, completion="fill(().__class__.__name__)", expect="fail"),
        SmokeCheck("prose fails", row=first, completion="Here is a red sun over the sea.", expect="fail"),
    ]
    return Task(
        name="drawing",
        train_rows=train_rows,
        eval_rows=[_row(d, p) for d, p in held_out],
        rubric=Rubric(comps, pass_component="drawing_image", gates=["drawing_gate"]),
        smoke_checks=checks,
        # Stop at a closing fence ("\n```" then a newline), not at an opening one ("\n```python"): the default
        # model writes a sentence, then the fenced program.
        judges=judges,
        max_tokens=max_tokens,
        stop=["\n```\n"],
        demonstrate=lambda row: [row["reference"]],  # a supervised warm start on the reference programs
        description=(
            "Write a short drawing program (ten allowed calls) for a description; gated by an AST "
            "allow-list, rendered at 64x64 and scored against a reference render"
            + (f", plus a judge ({judge})" if judge else "")
            + "."
        ),
    )
