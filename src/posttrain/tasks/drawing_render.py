"""The `drawing` task's renderer: a tiny interpreter over a gated program's syntax tree, drawing with Pillow.

The program is never handed to Python's exec/eval: `render` walks the tree that drawing_gate.check_program
accepted and performs each node itself, so only what is written here can happen. It still checks everything at
run time (the gate is static): numbers only in arithmetic, finite values, integer loop counts up to MAX_RANGE, a
budget of interpreter steps, draw calls and wall time. Coordinates are logical (0..100 on both axes unless
`canvas(w, h)` says otherwise) and scaled to a small square raster (64 x 64 by default). Deterministic: the same
program gives the same pixels.

    render(source_or_tree, size=64) -> PIL.Image (RGB)        raises RenderError on any failure
    image_distance(a, b, grid=16) -> float in [0, 1]            mean colour distance at low resolution
    flat_distance(ref, grid=16) -> float                        the distance of the best one-colour page to `ref`
    region_score(img, ref, grid=16) -> float in [0, 1]          per-cell progress from the background (figure x ground)
"""

from __future__ import annotations

import ast
import math
import time
from typing import Any

from PIL import Image, ImageDraw

from posttrain.tasks.drawing_gate import DRAW_CALLS, MAX_RANGE, check_program

MAX_STEPS = 20_000  # expression and statement evaluations
MAX_DRAWS = 400
# The step and draw budgets are the deterministic bound (worst case well under 0.1 s of CPU); the wall-time budget
# is only a backstop, generous so a loaded machine does not turn a good program into a failed one.
TIME_BUDGET_S = 5.0

PALETTE: dict[str, tuple[int, int, int]] = {
    "black": (0, 0, 0),
    "white": (255, 255, 255),
    "grey": (128, 128, 128),
    "gray": (128, 128, 128),
    "silver": (192, 192, 192),
    "red": (220, 30, 30),
    "maroon": (128, 0, 0),
    "orange": (255, 140, 0),
    "yellow": (250, 220, 40),
    "gold": (255, 200, 0),
    "beige": (240, 230, 200),
    "sand": (220, 200, 150),
    "tan": (210, 180, 140),
    "brown": (130, 80, 40),
    "green": (40, 160, 60),
    "darkgreen": (0, 90, 30),
    "lime": (150, 230, 60),
    "olive": (120, 130, 40),
    "teal": (0, 128, 128),
    "cyan": (0, 220, 230),
    "skyblue": (135, 200, 240),
    "lightblue": (180, 220, 250),
    "blue": (30, 80, 220),
    "navy": (10, 30, 110),
    "indigo": (75, 0, 130),
    "purple": (130, 50, 170),
    "violet": (190, 120, 230),
    "pink": (250, 160, 190),
    "magenta": (220, 40, 180),
}


class RenderError(ValueError):
    """The program could not be drawn (a run-time error or a spent budget)."""


def color(value: Any) -> tuple[int, int, int]:
    """A palette name or a #rgb / #rrggbb string as an RGB triple."""
    if not isinstance(value, str):
        raise RenderError(f"a colour must be a name or '#rrggbb', got {type(value).__name__}")
    v = value.strip().lower()
    if v in PALETTE:
        return PALETTE[v]
    if v.startswith("#") and len(v) in (4, 7) and all(ch in "0123456789abcdef" for ch in v[1:]):
        h = v[1:] if len(v) == 7 else "".join(ch * 2 for ch in v[1:])
        return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)
    raise RenderError(
        f"unknown colour {value[:24]!r}; use a palette name ({', '.join(list(PALETTE)[:8])}, ...) or '#rrggbb'"
    )


class _Painter:
    """The drawing functions, in logical coordinates, onto an RGB raster."""

    def __init__(self, size: int):
        self.size = size
        self.img = Image.new("RGB", (size, size), PALETTE["white"])
        self.draw = ImageDraw.Draw(self.img)
        self.w, self.h = 100.0, 100.0

    def _x(self, x: float) -> float:
        return x * self.size / self.w

    def _y(self, y: float) -> float:
        return y * self.size / self.h

    def _box(self, x0: float, y0: float, x1: float, y1: float) -> list[float]:
        xa, xb = sorted((self._x(x0), self._x(x1)))
        ya, yb = sorted((self._y(y0), self._y(y1)))
        return [xa, ya, xb, yb]

    def _width(self, width: float) -> int:
        return max(1, min(self.size, round(width * self.size / self.w)))

    def canvas(self, w: float, h: float) -> None:
        if not (1 <= w <= 10_000 and 1 <= h <= 10_000):
            raise RenderError(f"canvas size must be between 1 and 10000, got {w:g} x {h:g}")
        self.w, self.h = float(w), float(h)

    def fill(self, c: Any) -> None:
        self.draw.rectangle([0, 0, self.size, self.size], fill=color(c))

    def gradient(self, top: Any, bottom: Any) -> None:
        a, b = color(top), color(bottom)
        for row in range(self.size):
            t = row / max(1, self.size - 1)
            self.draw.line([(0, row), (self.size, row)], fill=tuple(round(a[i] + (b[i] - a[i]) * t) for i in range(3)))

    def rect(self, x: float, y: float, w: float, h: float, c: Any) -> None:
        self.draw.rectangle(self._box(x, y, x + w, y + h), fill=color(c))

    def circle(self, x: float, y: float, r: float, c: Any) -> None:
        self.ellipse(x, y, r, r, c)

    def ellipse(self, x: float, y: float, rx: float, ry: float, c: Any) -> None:
        rx, ry = abs(rx), abs(ry)
        self.draw.ellipse(self._box(x - rx, y - ry, x + rx, y + ry), fill=color(c))

    def line(self, x1: float, y1: float, x2: float, y2: float, c: Any, width: float = 1.0) -> None:
        self.draw.line(
            [(self._x(x1), self._y(y1)), (self._x(x2), self._y(y2))], fill=color(c), width=self._width(width)
        )

    def polygon(self, c: Any, *coords: float) -> None:
        if len(coords) % 2:
            raise RenderError("polygon takes a colour then x, y pairs")
        self.draw.polygon(
            [(self._x(coords[i]), self._y(coords[i + 1])) for i in range(0, len(coords), 2)], fill=color(c)
        )

    def stroke(self, x1: float, y1: float, x2: float, y2: float, c: Any, width: float) -> None:
        # A brush stroke: a round-capped line at 60% opacity, so strokes layer like paint
        mask = Image.new("L", self.img.size, 0)
        md = ImageDraw.Draw(mask)
        w = self._width(width)
        p, q = (self._x(x1), self._y(y1)), (self._x(x2), self._y(y2))
        md.line([p, q], fill=153, width=w)
        for cx, cy in (p, q):
            md.ellipse([cx - w / 2, cy - w / 2, cx + w / 2, cy + w / 2], fill=153)
        self.img.paste(color(c), (0, 0, *self.img.size), mask)

    def wash(self, c: Any, alpha: float) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise RenderError(f"wash alpha must be in [0, 1], got {alpha:g}")
        self.img = Image.blend(self.img, Image.new("RGB", self.img.size, color(c)), alpha)
        self.draw = ImageDraw.Draw(self.img)


assert set(DRAW_CALLS) == {n for n in vars(_Painter) if not n.startswith("_")}, "gate and painter disagree"


class _Interpreter:
    def __init__(self, size: int, max_steps: int, max_draws: int, time_budget_s: float):
        self.painter = _Painter(size)
        self.vars: dict[str, Any] = {}
        self.steps, self.draws = 0, 0
        self.max_steps, self.max_draws = max_steps, max_draws
        self.deadline = time.perf_counter() + time_budget_s

    def _tick(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise RenderError(f"program ran more than {self.max_steps} steps")
        if self.steps % 256 == 0 and time.perf_counter() > self.deadline:
            raise RenderError("program ran past its time budget")

    def run(self, body: list[ast.stmt]) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, node: ast.stmt) -> None:
        self._tick()
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            self.call(node.value)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.vars[node.targets[0].id] = self.expr(node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            if node.target.id not in self.vars:
                raise RenderError(f"{node.target.id!r} is used before it is assigned")
            self.vars[node.target.id] = self.arith(node.op, self.vars[node.target.id], self.expr(node.value))
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Call):
            args = [self.integer(self.expr(a)) for a in node.iter.args]
            r = range(*args)
            if len(r) > MAX_RANGE:
                raise RenderError(f"range of {len(r)} iterations; at most {MAX_RANGE}")
            for i in r:
                self.vars[node.target.id] = float(i)
                self.run(node.body)
        elif isinstance(node, ast.Pass):
            pass
        else:  # the gate should have refused it; never run what we do not understand
            raise RenderError(f"cannot run a {type(node).__name__} statement")

    def integer(self, v: Any) -> int:
        if not isinstance(v, float) or not v.is_integer():
            raise RenderError(f"range needs whole numbers, got {v!r}")
        return int(v)

    def expr(self, node: ast.expr) -> Any:
        self._tick()
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, str):
                return v
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return self.finite(float(v))
        elif isinstance(node, ast.Name):
            if node.id not in self.vars:
                raise RenderError(f"{node.id!r} is used before it is assigned")
            return self.vars[node.id]
        elif isinstance(node, ast.BinOp):
            return self.arith(node.op, self.expr(node.left), self.expr(node.right))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.number(self.expr(node.operand))
            return -v if isinstance(node.op, ast.USub) else v
        raise RenderError(f"cannot evaluate a {type(node).__name__}")

    def number(self, v: Any) -> float:
        if not isinstance(v, float):
            raise RenderError(f"expected a number, got {type(v).__name__}")
        return v

    def finite(self, v: float) -> float:
        if not math.isfinite(v) or abs(v) > 1e9:
            raise RenderError("a number went out of range")
        return v

    def arith(self, op: ast.operator, a: Any, b: Any) -> float:
        a, b = self.number(a), self.number(b)
        try:
            if isinstance(op, ast.Add):
                return self.finite(a + b)
            if isinstance(op, ast.Sub):
                return self.finite(a - b)
            if isinstance(op, ast.Mult):
                return self.finite(a * b)
            if isinstance(op, ast.Div):
                return self.finite(a / b)
            if isinstance(op, ast.FloorDiv):
                return self.finite(float(a // b))
            if isinstance(op, ast.Mod):
                return self.finite(a % b)
        except ZeroDivisionError:
            raise RenderError("division by zero") from None
        raise RenderError(f"operator {type(op).__name__} is not allowed")

    def call(self, node: ast.Call) -> None:
        if not isinstance(node.func, ast.Name) or node.func.id not in DRAW_CALLS or node.keywords:
            raise RenderError("only drawing functions can be called")
        name = node.func.id
        lo, hi = DRAW_CALLS[name]
        if not lo <= len(node.args) <= hi:
            raise RenderError(f"{name} takes {lo} to {hi} arguments")
        self.draws += 1
        if self.draws > self.max_draws:
            raise RenderError(f"more than {self.max_draws} drawing calls")
        args = [self.expr(a) for a in node.args]
        try:
            getattr(self.painter, name)(*args)  # name is one of DRAW_CALLS, checked above
        except RenderError:
            raise
        except (TypeError, ValueError, OverflowError) as e:  # e.g. a colour where a number belongs
            raise RenderError(f"{name}: {type(e).__name__}: {str(e)[:80]}") from None


def render(
    program: str | ast.Module,
    size: int = 64,
    max_steps: int = MAX_STEPS,
    max_draws: int = MAX_DRAWS,
    time_budget_s: float = TIME_BUDGET_S,
) -> Image.Image:
    """Draw a program (source text, gated here, or a tree the gate accepted) to a size x size RGB image."""
    if isinstance(program, str):
        g = check_program(program)
        if not g.ok:
            raise RenderError(f"refused by the gate: {g.reason}")
        assert g.tree is not None  # the gate keeps the tree of a program it accepts
        tree = g.tree
    else:
        tree = program
    it = _Interpreter(size, max_steps, max_draws, time_budget_s)
    it.run(tree.body)
    return it.painter.img


def image_distance(a: Image.Image, b: Image.Image, grid: int = 16) -> float:
    """The mean per-cell RGB distance, normalised to [0, 1] (0: same colours everywhere), after box-downsampling both
    images to grid x grid. Low resolution on purpose: it asks for the right colours in the right places, not a
    pixel-exact copy."""
    pa, pb = (im.convert("RGB").resize((grid, grid), Image.Resampling.BOX).tobytes() for im in (a, b))
    total = sum(math.dist(pa[i : i + 3], pb[i : i + 3]) for i in range(0, len(pa), 3))
    return total / (grid * grid * 255.0 * math.sqrt(3.0))


def _cells(im: Image.Image, grid: int) -> list[bytes]:
    px = im.convert("RGB").resize((grid, grid), Image.Resampling.BOX).tobytes()
    return [px[i : i + 3] for i in range(0, len(px), 3)]


def flat_distance(ref: Image.Image, grid: int = 16) -> float:
    """How close a blank page of one colour gets to `ref`: the smallest distance of a page in the reference's most
    common colour, in its mean colour, or white (the untouched canvas), at `grid` x `grid`. The image score measures
    progress past it, so painting only the background earns nothing."""
    small = ref.convert("RGB").resize((grid, grid), Image.Resampling.BOX)
    cells = _cells(small, grid)
    common = max(set(cells), key=cells.count)
    mean = bytes(round(sum(c[k] for c in cells) / len(cells)) for k in range(3))
    pages = (common, mean, b"\xff\xff\xff")
    return min(image_distance(Image.new("RGB", small.size, tuple(c)), small, grid) for c in pages)


_FAR = 255.0 * math.sqrt(3.0)  # the colour cube's diagonal: distances below are shares of it
FIGURE_CONTRAST = 0.1  # a reference cell this far from the background is figure, to be drawn
GROUND_MATCH = 0.005  # a reference cell this close to the background is ground, to be left alone
SPOILED = 0.04  # a ground cell the picture moved this far is fully spoiled


def region_score(img: Image.Image, ref: Image.Image, grid: int = 16) -> float:
    """Per-cell progress from the background to the reference, in [0, 1]: the reference scores 1, every one-colour
    page 0.

    At `grid` x `grid`, the background is the reference's most common cell colour. Ground cells are the reference
    cells of that colour; figure cells differ from it by more than FIGURE_CONTRAST (cells in between, gradients
    and blurred edges, count for neither). A figure cell earns max(0, 1 - d(img, ref) / d(background, ref)) when
    the picture there is nearer the reference than the background, else 0. A ground cell is spoiled by
    min(1, d(img, ref) / SPOILED). score = mean figure gain x (1 - mean ground spoiled).

    Why per cell: the global score (1 - d / d_flat) pays nothing until the whole picture beats a blank page, so a
    sun drawn half over its place (half its figure gained, as much ground spoiled) scores 0 there, like no sun at
    all; here it scores about a half. Why no page can score: to gain a figure cell, a one-colour page must be
    nearer the figure colour than the background, so at least FIGURE_CONTRAST / 2 from the background, which
    spoils every ground cell (GROUND_MATCH + SPOILED < FIGURE_CONTRAST / 2)."""
    want, have = _cells(ref, grid), _cells(img, grid)
    background = max(set(want), key=want.count)
    base = [math.dist(background, w) / _FAR for w in want]
    figure = [i for i, b in enumerate(base) if b > FIGURE_CONTRAST]
    if not figure:  # a (nearly) one-colour reference: matching it is all there is
        return max(0.0, 1.0 - image_distance(img, ref, grid) / FIGURE_CONTRAST)
    gain = 0.0
    for i in figure:
        d = math.dist(have[i], want[i]) / _FAR
        if d < math.dist(have[i], background) / _FAR:
            gain += max(0.0, 1.0 - d / base[i])
    ground = [i for i, b in enumerate(base) if b <= GROUND_MATCH]  # never empty: the background's own cells
    spoiled = sum(min(1.0, math.dist(have[i], want[i]) / _FAR / SPOILED) for i in ground)
    return (gain / len(figure)) * (1.0 - spoiled / len(ground))
