"""Screenshots of the documentation site for the README, taken with the system Chromium through Playwright
(Playwright cannot download its own browser here):

    python scripts/site_screenshots.py     # builds the site into build/site, writes docs/img/site-*.png
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "build" / "site"
SHOTS = {"site-home.png": "index.html", "site-results.png": "results/vs-trl.html"}


def main() -> int:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(SITE)], cwd=ROOT, env=env,
                   check=True)
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 860}, device_scale_factor=1)
        for name, rel in SHOTS.items():
            page.goto((SITE / rel).as_uri())
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(ROOT / "docs" / "img" / name))
            print("docs/img/" + name)
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
