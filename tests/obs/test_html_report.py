"""`posttrain report`: the HTML report of a real async run's files, partial and crashed runs, --compare, --trace."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("plotly")

from posttrain.obs.html_report import ReportError, RunData, write_compare, write_html_report  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "async_run"


def external_resources(page: str) -> list[str]:
    """src/href attributes of the page's elements (a script's text, e.g. plotly's bundle, is not parsed)."""
    from html.parser import HTMLParser

    found = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend(v for k, v in attrs if k in ("src", "href") and v and not v.startswith("#"))

    P().feed(page)
    return found


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "posttrain.cli", "report", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def test_report_of_an_async_run_is_self_contained(tmp_path):
    out = write_html_report(FIXTURE, tmp_path / "r.html")
    page = out.read_text()
    assert external_resources(page) == []  # plotly inlined: the page opens offline
    for div in ("fig-reward", "fig-pass", "fig-eval", "fig-timing", "fig-async", "fig-timeline", "fig-explorer"):
        assert f'id="{div}"' in page, div
    data = json.loads(page.split('id="report-data">')[1].split("</script>")[0].replace("<\\/", "</"))
    pages = data["viewer"]
    assert [p["step"] for p in pages if not p["eval"]] == [1, 2, 3, 4, 5]
    s = pages[1]["samples"][0]
    assert len(s["token_text"]) == len(s["token_logprobs"]) == len(s["token_learner_logprobs"]) == s["tokens"]
    assert "advantage" in s


def test_partial_and_crashed_runs_give_a_partial_report(tmp_path):
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "config.yaml").write_text("run:\n  seed: 0\n")  # crashed before step 1: config only
    page = write_html_report(crashed).read_text()
    assert "no train steps in metrics.jsonl yet" in page
    half = tmp_path / "half"
    shutil.copytree(FIXTURE, half)
    (half / "summary.json").unlink()
    lines = (half / "metrics.jsonl").read_text().splitlines()
    (half / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])  # killed mid-write
    run = RunData.load(half)
    assert len(run.train) == 2 and any("no summary.json" in n for n in run.notes)
    assert 'id="fig-reward"' in write_html_report(half).read_text()


def test_bad_paths_are_clear_errors(tmp_path):
    with pytest.raises(ReportError, match="run directory not found"):
        RunData.load(tmp_path / "nope")
    with pytest.raises(ReportError, match="not a run directory"):
        RunData.load(tmp_path)
    with pytest.raises(ReportError, match="run directory not found: .*missing"):
        write_compare([FIXTURE, tmp_path / "missing"], tmp_path / "c.html")


def test_cli_report_compare_and_trace(tmp_path):
    r = cli("--compare", FIXTURE, tmp_path / "missing", "--out", tmp_path / "c.html")
    assert r.returncode == 2 and "run directory not found" in r.stderr and "Traceback" not in r.stderr
    other = tmp_path / "other"
    shutil.copytree(FIXTURE, other)
    r = cli("--compare", FIXTURE, other, "--out", tmp_path / "c.html")
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "c.html").read_text()
    assert "async_run vs other" in page and 'id="fig-cmp-0"' in page
    r = cli(other, "--trace", tmp_path / "t.json")
    assert r.returncode == 0, r.stderr
    t = json.loads((tmp_path / "t.json").read_text())
    spans = [e for e in t["traceEvents"] if e["ph"] == "X"]
    assert spans and all({"name", "ts", "dur", "pid", "tid"} <= e.keys() for e in spans)
    assert {"train", "sample", "reward", "sync", "eval"} <= {e["name"] for e in spans}
    assert (other / "report.html").exists()
    r = cli(other, "--out", tmp_path / "r.png")  # the PNG summary is still there
    assert r.returncode == 0 and (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    r = cli(tmp_path / "empty-dir-that-does-not-exist")
    assert r.returncode == 2 and "run directory not found" in r.stderr


def test_remedy_actions_are_marked_on_the_reward_chart(tmp_path):
    run_dir = tmp_path / "remedied"
    shutil.copytree(FIXTURE, run_dir)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "remedy", "step": 3, "remedy": "temperature", "detail": "1.0 -> 1.15"}) + "\n")
    page = write_html_report(run_dir).read_text()
    assert "remedy: temperature" in page
    assert "remedy:" not in write_html_report(FIXTURE, tmp_path / "plain.html").read_text()
