"""The documentation site (mkdocs.yml + docs/) builds in strict mode, offline, and a broken link, a missing page
or a bad API reference fails that build. `make docs` runs the same build."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

for _mod in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
    pytest.importorskip(_mod, reason=f"{_mod} is not installed (make setup-dev installs the dev extra)")


def _build(project: Path, out: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `project`, with every proxy pointed at a closed port: a build that tried to
    fetch anything (fonts, a plugin's remote data) would fail or hang, so passing means it built offline."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env[var] = "http://127.0.0.1:9"
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(project / "mkdocs.yml"),
                           "-d", str(out)], cwd=project, env=env, capture_output=True, text=True, timeout=300)


def _copy_project(tmp_path: Path) -> Path:
    """docs/ and mkdocs.yml copied (to break them without touching the repo); src/ linked for the API reference."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copytree(ROOT / "docs", project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    (project / "src").symlink_to(ROOT / "src", target_is_directory=True)
    return project


def test_site_builds_in_strict_mode(tmp_path):
    r = _build(ROOT, tmp_path / "site")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    site = tmp_path / "site"
    for page in ["index.html", "getting-started.html", "reference/config.html", "api.html", "results/index.html",
                 "results/learning.html", "results/vs-trl.html", "architecture.html"]:
        assert (site / page).exists(), page
    api = (site / "api.html").read_text()
    assert 'id="posttrain.train"' in api, "the API reference did not render posttrain.train from its docstring"
    assert "fonts.googleapis.com" not in (site / "index.html").read_text(), "theme.font must stay false (offline)"


@pytest.mark.parametrize("breakage, expected", [
    ("link", "no-such-page.md"),
    ("nav", "no-such-nav-page.md"),
    ("api", "posttrain.no_such_module"),
])
def test_strict_build_fails_on_a_broken_site(tmp_path, breakage, expected):
    project = _copy_project(tmp_path)
    if breakage == "link":
        page = project / "docs" / "results" / "index.md"
        page.write_text(page.read_text() + "\nSee [a page that is not there](no-such-page.md).\n")
    elif breakage == "nav":
        cfg = project / "mkdocs.yml"
        cfg.write_text(cfg.read_text().replace("  - Home: index.md\n",
                                               "  - Home: index.md\n  - Gone: no-such-nav-page.md\n"))
    else:
        page = project / "docs" / "api.md"
        page.write_text(page.read_text() + "\n::: posttrain.no_such_module\n")
    r = _build(project, tmp_path / "site")
    assert r.returncode != 0, f"the strict build passed with a broken {breakage}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
    assert expected in r.stdout + r.stderr


def test_every_docs_link_stays_inside_the_repository():
    """No page links outside the repository by a relative path (../shared, another repo's files): such a link
    points nowhere once the site is built, and strict mode only sees links to .md files."""
    for page in (ROOT / "docs").rglob("*.md"):
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            resolved = (page.parent / target.split("#")[0]).resolve()
            assert resolved.is_relative_to(ROOT / "docs"), f"{page.relative_to(ROOT)} links outside docs/: {target}"
