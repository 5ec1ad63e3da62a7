"""The per-cell image score (`image_baseline="region"`, drawing_render.region_score): the reference scores 1, no
one-colour page scores anything, and a shape near its place earns part of the way (the density the global score
lacks)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from posttrain.envs.smoke_checks import check_task, score_completion
from posttrain.tasks import drawing_data as D
from posttrain.tasks.drawing import make_task
from posttrain.tasks.drawing_render import PALETTE, flat_distance, image_distance, region_score, render

REFS = D.TRAIN + D.HELD_OUT
RENDERS = {p: render(p) for _, p in REFS}
SUN = 'fill("skyblue")\ncircle({x}, 30, 14, "yellow")'  # "a yellow sun in a clear sky", sun at x = 70


def _flat(img: Image.Image, ref: Image.Image) -> float:
    return max(0.0, 1.0 - image_distance(img, ref) / max(0.05, flat_distance(ref)))


def test_every_reference_scores_one_against_itself() -> None:
    for description, program in REFS:
        assert region_score(RENDERS[program], RENDERS[program]) == pytest.approx(1.0), description


@settings(max_examples=60, deadline=None)
@given(rgb=st.tuples(*[st.integers(0, 255)] * 3), k=st.integers(0, len(REFS) - 1))
def test_no_one_colour_page_scores(rgb: tuple[int, int, int], k: int) -> None:
    ref = RENDERS[REFS[k][1]]
    assert region_score(Image.new("RGB", (64, 64), rgb), ref) == 0.0


def test_no_palette_page_scores_on_any_reference() -> None:
    for name in PALETTE:
        page = render(f'fill("{name}")')
        for description, program in REFS:
            assert region_score(page, RENDERS[program]) == 0.0, (name, description)


def test_painting_everything_in_the_figure_colour_scores_nothing() -> None:
    ref = render(SUN.format(x=70))
    assert region_score(render('fill("yellow")'), ref) == 0.0
    assert region_score(render('fill("skyblue")\nrect(0, 0, 100, 100, "yellow")'), ref) == 0.0


def test_a_sun_near_its_place_earns_part_of_the_way() -> None:
    ref = render(SUN.format(x=70))
    scores = [region_score(render(SUN.format(x=70 - dx)), ref) for dx in (0, 8, 16, 24, 32)]
    assert scores[0] == pytest.approx(1.0)
    assert scores == sorted(scores, reverse=True) and scores[-1] == 0.0  # farther is worse; off its place, nothing
    # 20 apart the global score pays nothing (it is worse than a blank page); the per-cell one pays the overlap.
    off = render(SUN.format(x=70 - 20))  # 20 of 100 apart, the sun 28 wide
    assert _flat(off, ref) == 0.0 < region_score(off, ref)


def test_the_task_option_scores_and_blank_pages_earn_only_the_gate() -> None:
    task = make_task(image_baseline="region")
    assert all(r.ok for r in check_task(task))
    row = task.train_rows[1]
    assert row["reference"] == SUN.format(x=70)
    blank, near, ref = (score_completion(task, row, c) for c in
                        ('fill("skyblue")', SUN.format(x=70 - 16), row["reference"]))
    assert blank.components["drawing_image"] == 0.0 and blank.reward == pytest.approx(0.1)
    assert 0.0 < near.components["drawing_image"] < 1.0 and ref.components["drawing_image"] == pytest.approx(1.0)
    assert blank.reward < near.reward < ref.reward
    with pytest.raises(ValueError, match="image_baseline"):
        make_task(image_baseline="pixels")
