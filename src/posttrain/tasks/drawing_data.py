"""Targets for the `drawing` task, written for this project: (description, reference program) pairs. The
reference program is rendered to the reference image a completion is compared with. Coordinates are 0..100, x to
the right, y down. TRAIN and HELD_OUT share no description.
"""

from __future__ import annotations

TRAIN: list[tuple[str, str]] = [
    ("a red sun over a blue sea", 'fill("skyblue")\nrect(0, 60, 100, 40, "blue")\ncircle(50, 35, 15, "red")'),
    ("a yellow sun in a clear sky", 'fill("skyblue")\ncircle(70, 30, 14, "yellow")'),
    ("a green hill under a blue sky", 'fill("skyblue")\nellipse(50, 100, 70, 40, "green")'),
    ("a night sky with a white moon", 'fill("navy")\ncircle(70, 25, 10, "white")'),
    (
        "a sunset: orange sky over a dark sea",
        'gradient("orange", "pink")\nrect(0, 65, 100, 35, "navy")\ncircle(50, 65, 12, "gold")',
    ),
    (
        "a brown tree trunk with a green crown",
        'fill("white")\nrect(45, 55, 10, 40, "brown")\ncircle(50, 40, 22, "green")',
    ),
    (
        "a red house with a brown roof",
        'fill("skyblue")\nrect(0, 80, 100, 20, "green")\n'
        'rect(30, 50, 40, 30, "red")\npolygon("brown", 25, 50, 50, 30, 75, 50)',
    ),
    (
        "a snowy mountain",
        'fill("lightblue")\npolygon("grey", 10, 90, 50, 20, 90, 90)\npolygon("white", 38, 41, 50, 20, 62, 41)',
    ),
    ("three blue circles in a row", 'fill("white")\nfor i in range(3):\n    circle(20 + 30 * i, 50, 10, "blue")'),
    ("a black square in the middle of a white page", 'fill("white")\nrect(35, 35, 30, 30, "black")'),
    (
        "a pink flower with a green stem",
        'fill("white")\nline(50, 50, 50, 95, "green", 3)\ncircle(50, 40, 12, "pink")\ncircle(50, 40, 4, "yellow")',
    ),
    ("a purple sky over a black field", 'fill("purple")\nrect(0, 70, 100, 30, "black")'),
    ("a lake with a sandy beach", 'fill("skyblue")\nrect(0, 50, 100, 50, "blue")\nellipse(50, 100, 60, 20, "sand")'),
    (
        "a rainbow of stripes",
        'rect(0, 0, 100, 17, "red")\nrect(0, 17, 100, 17, "orange")\nrect(0, 34, 100, 17, "yellow")\n'
        'rect(0, 51, 100, 17, "green")\nrect(0, 68, 100, 16, "blue")\nrect(0, 84, 100, 16, "purple")',
    ),
    ("a grey cloud in a blue sky", 'fill("skyblue")\nellipse(40, 35, 20, 12, "grey")\nellipse(58, 32, 18, 14, "grey")'),
    (
        "a green field with a yellow path",
        'fill("skyblue")\nrect(0, 45, 100, 55, "green")\npolygon("yellow", 45, 45, 55, 45, 80, 100, 20, 100)',
    ),
    ("a blue square on an orange background", 'fill("orange")\nrect(25, 25, 50, 50, "blue")'),
    ("a red ball on green grass", 'fill("skyblue")\nrect(0, 65, 100, 35, "green")\ncircle(50, 58, 10, "red")'),
    (
        "a white sailboat on a blue sea",
        'fill("skyblue")\nrect(0, 60, 100, 40, "blue")\n'
        'polygon("white", 50, 20, 50, 55, 25, 55)\nrect(30, 55, 30, 6, "brown")',
    ),
    (
        "a forest of five dark green trees",
        'fill("lightblue")\nrect(0, 80, 100, 20, "green")\nfor i in range(5):\n'
        '    polygon("darkgreen", 4 + 20 * i, 85, 14 + 20 * i, 40, 24 + 20 * i, 85)',
    ),
    ("a black and white checkerboard row", 'fill("white")\nfor i in range(5):\n    rect(20 * i, 40, 10, 20, "black")'),
    (
        "a golden desert under a pale sky",
        'fill("lightblue")\nellipse(30, 100, 60, 35, "gold")\nellipse(80, 100, 50, 28, "sand")',
    ),
    (
        "a teal square with a white circle inside",
        'fill("white")\nrect(20, 20, 60, 60, "teal")\ncircle(50, 50, 18, "white")',
    ),
    ("a red stripe across a white flag", 'fill("white")\nrect(0, 40, 100, 20, "red")'),
    ("a blue vertical stripe on a yellow flag", 'fill("yellow")\nrect(40, 0, 20, 100, "blue")'),
    (
        "a watercolour wash of blue over green hills",
        'fill("white")\nellipse(30, 90, 50, 30, "green")\nellipse(75, 95, 45, 25, "darkgreen")\nwash("blue", 0.3)',
    ),
    (
        "soft pink brush strokes on white paper",
        'fill("white")\nfor i in range(4):\n    stroke(10, 20 + 20 * i, 90, 15 + 20 * i, "pink", 6)',
    ),
    ("a dark room with one yellow window", 'fill("black")\nrect(40, 30, 20, 25, "yellow")'),
    (
        "a red heart shape",
        'fill("white")\ncircle(38, 40, 14, "red")\ncircle(62, 40, 14, "red")\npolygon("red", 25, 46, 75, 46, 50, 80)',
    ),
    ("a green triangle on a grey background", 'fill("grey")\npolygon("green", 50, 20, 85, 80, 15, 80)'),
    ("an orange circle on a navy background", 'fill("navy")\ncircle(50, 50, 25, "orange")'),
    (
        "two white clouds in a blue sky",
        'fill("skyblue")\nellipse(30, 30, 15, 8, "white")\nellipse(70, 45, 18, 9, "white")',
    ),
    (
        "a beach with a blue sea and yellow sand",
        'fill("skyblue")\nrect(0, 45, 100, 25, "blue")\nrect(0, 70, 100, 30, "sand")',
    ),
    (
        "a lighthouse on a rock",
        'fill("skyblue")\nrect(0, 75, 100, 25, "blue")\nellipse(50, 80, 25, 10, "grey")\n'
        'rect(44, 35, 12, 42, "white")\nrect(44, 45, 12, 6, "red")\nrect(44, 60, 12, 6, "red")',
    ),
    (
        "a brown fence across green grass",
        'fill("skyblue")\nrect(0, 60, 100, 40, "green")\nrect(0, 62, 100, 4, "brown")\n'
        'for i in range(6):\n    rect(5 + 17 * i, 55, 5, 25, "brown")',
    ),
    (
        "a magenta circle above a cyan square",
        'fill("white")\ncircle(50, 28, 15, "magenta")\nrect(35, 55, 30, 30, "cyan")',
    ),
    ("an evening sky fading from violet to orange", 'gradient("violet", "orange")'),
    (
        "a dawn sky fading from navy to pink over dark hills",
        'gradient("navy", "pink")\nellipse(50, 100, 70, 25, "black")',
    ),
    (
        "a yellow road with white dashes",
        'fill("darkgreen")\nrect(0, 40, 100, 20, "grey")\nfor i in range(5):\n    rect(5 + 20 * i, 48, 10, 4, "white")',
    ),
    (
        "a snowman",
        'fill("lightblue")\nrect(0, 80, 100, 20, "white")\ncircle(50, 70, 16, "white")\ncircle(50, 42, 11, "white")\n'
        'circle(50, 42, 2, "black")',
    ),
]

HELD_OUT: list[tuple[str, str]] = [
    ("a white moon over a dark sea", 'fill("navy")\nrect(0, 65, 100, 35, "black")\ncircle(35, 30, 10, "white")'),
    (
        "a green tree on a yellow field",
        'fill("skyblue")\nrect(0, 65, 100, 35, "yellow")\nrect(46, 45, 8, 25, "brown")\ncircle(50, 38, 15, "green")',
    ),
    ("a red square on a blue background", 'fill("blue")\nrect(30, 30, 40, 40, "red")'),
    (
        "four yellow circles in a row on black",
        'fill("black")\nfor i in range(4):\n    circle(14 + 24 * i, 50, 9, "yellow")',
    ),
    (
        "a blue house with a red roof",
        'fill("skyblue")\nrect(0, 80, 100, 20, "green")\n'
        'rect(30, 50, 40, 30, "blue")\npolygon("red", 25, 50, 50, 28, 75, 50)',
    ),
    (
        "an orange sun setting behind purple mountains",
        'gradient("orange", "yellow")\ncircle(50, 55, 15, "orange")\npolygon("purple", 0, 100, 30, 45, 60, 100)\n'
        'polygon("purple", 40, 100, 75, 50, 100, 100)',
    ),
    ("a pink sky over a green sea", 'fill("pink")\nrect(0, 55, 100, 45, "teal")'),
    ("a white flag with a green cross", 'fill("white")\nrect(40, 0, 20, 100, "green")\nrect(0, 40, 100, 20, "green")'),
    ("a grey rock on sand", 'fill("sand")\nellipse(50, 60, 25, 15, "grey")'),
    (
        "a blue flower with a yellow centre",
        'fill("white")\nline(50, 55, 50, 95, "green", 3)\ncircle(50, 42, 13, "blue")\ncircle(50, 42, 5, "yellow")',
    ),
    ("three red stripes on white", 'fill("white")\nfor i in range(3):\n    rect(0, 10 + 30 * i, 100, 12, "red")'),
    (
        "a brown boat on a blue lake",
        'fill("skyblue")\nrect(0, 50, 100, 50, "blue")\npolygon("brown", 25, 60, 75, 60, 65, 72, 35, 72)',
    ),
    (
        "a starry night with a yellow moon",
        'fill("navy")\ncircle(75, 25, 10, "yellow")\n'
        'for i in range(6):\n    circle(8 + 12 * i, 15 + 9 * (i % 3), 1, "white")',
    ),
    ("a gold circle on a maroon background", 'fill("maroon")\ncircle(50, 50, 28, "gold")'),
    ("a wash of pink over a blue sea and sky", 'fill("skyblue")\nrect(0, 55, 100, 45, "blue")\nwash("pink", 0.35)'),
]
