"""The HTML report in a real headless browser (Playwright + the system chromium): it loads without console errors,
the charts draw their data, the rollout viewer pages to a step, and the timeline shows an async run's lanes.

Skips with the reason when playwright or chromium is missing; `make setup` installs both (the dev extra and apt)."""

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("plotly")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from posttrain.obs.html_report import write_html_report  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "async_run"
CHROMIUM = next((p for p in (os.environ.get("POSTTRAIN_CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser")) if p), None)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (apt-get install chromium, or set POSTTRAIN_CHROMIUM)")
    report = write_html_report(FIXTURE, tmp_path_factory.mktemp("report") / "report.html")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
        pg.goto(report.as_uri())
        pg.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 7", timeout=20000)
        pg.errors = errors
        yield pg
        browser.close()


def test_loads_without_errors_and_charts_draw_data(page):
    assert page.errors == []
    charts = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].map(d => ({
        id: d.id, traces: (d._fullData || []).length,
        points: (d._fullData || []).reduce((n, t) => n + ((t.x || []).length), 0),
        drawn: d.querySelectorAll('.scatterlayer path, .barlayer path').length}))""")
    by_id = {c["id"]: c for c in charts}
    for fig in ("fig-reward", "fig-pass", "fig-eval", "fig-timing", "fig-async", "fig-timeline", "fig-explorer"):
        c = by_id[fig]
        assert c["traces"] > 0 and c["points"] > 0 and c["drawn"] > 0, c


def test_rollout_viewer_pages_to_a_step(page):
    page.select_option("#step-select", label="step 3 (2)")
    assert page.get_attribute("#viewer-body", "data-step") == "3"
    page.click("#next-step")
    assert page.get_attribute("#viewer-body", "data-step") == "4"
    assert page.locator("#sample-select option").count() == 2
    tokens = page.locator("#viewer-body .tok")
    assert tokens.count() > 0
    page.select_option("#color-mode", "logprob")  # colour by the sampler's log-prob: every token tinted
    assert "rgba" in tokens.first.evaluate("e => e.style.background")
    page.select_option("#sample-select", "1")
    assert "sampler log-prob" in tokens.first.get_attribute("title")


def test_timeline_shows_the_async_stages(page):
    lanes, stages = page.evaluate("""() => {
        const d = document.getElementById('fig-timeline');
        return [[...new Set(d._fullData.flatMap(t => [...t.y]))], d._fullData.map(t => t.name)]; }""")
    assert "trainer" in lanes and sum(lane.startswith("rollout-") for lane in lanes) >= 2
    assert {"sample", "reward", "train", "sync", "eval", "wait_rollouts"} <= set(stages)
    assert page.locator("#fig-timeline .bars path").count() > 10
