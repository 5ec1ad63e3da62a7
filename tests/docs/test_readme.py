"""The README is the short front page: at most 300 lines, the two commands and the demo's held-out table on its
first screen, and every link and image in it points at a file that exists (the long logs live in docs/results/)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FIRST_SCREEN = 50  # lines


def test_readme_is_short():
    n = len(README.splitlines())
    assert n <= 300, f"README.md has {n} lines; measurements and long guides go to docs/ (docs/results/ for logs)"


def test_first_screen_has_the_two_commands_and_the_demo_table():
    screen = "\n".join(README.splitlines()[:FIRST_SCREEN])
    assert re.search(r"^make demo\b", screen, flags=re.M) and re.search(r"^make test\b", screen, flags=re.M)
    assert "held-out (48 prompts): base vs warm start vs after RL" in screen
    assert re.search(r"│ pass_rate +│ [\d.]+% │ +[\d.]+% │ +[\d.]+% │", screen), "the demo's held-out table"


def test_every_readme_link_and_image_exists():
    targets = re.findall(r"\]\(([^)\s]+)\)", README)
    assert targets
    for target in targets:
        if re.match(r"[a-z]+:", target):
            continue
        path = ROOT / target.split("#")[0]
        assert path.exists(), f"README links to {target}, which does not exist"


def test_readme_shows_the_site_screenshots():
    shots = re.findall(r"!\[[^\]]*\]\((docs/img/site-[^)]+\.png)\)", README)
    assert len(shots) >= 2, "the README shows the site's start page and a results page"
    for shot in shots:
        assert (ROOT / shot).stat().st_size > 10_000, shot


def test_results_pages_show_generated_plots():
    """At least four plots on the results pages, each rendered by scripts/results_plots.py (not drawn by hand)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_plots", ROOT / "scripts" / "results_plots.py")
    plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plots)
    shown = set()
    for page in (ROOT / "docs" / "results").glob("*.md"):
        shown |= set(re.findall(r"\(\.\./img/results/([a-z_]+)\.png\)", page.read_text()))
    rendered = {fn.__name__ for fn in plots.PLOTS}
    assert len(shown) >= 4, shown
    assert shown <= rendered, f"plots on the results pages that scripts/results_plots.py does not render: {shown - rendered}"
    assert not plots.check(), plots.check()
