"""scripts/results_plots.py renders every results plot from bench/results/*.json (into a temp dir here)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_results_plots_render_from_the_json(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (dev extra)")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "results_plots.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    made = sorted(p.name for p in tmp_path.glob("*.png"))
    committed = sorted(p.name for p in (ROOT / "docs" / "img" / "results").glob("*.png"))
    assert len(made) >= 4 and made == committed, (made, committed)
