"""The judge-rewarded built-in task, the audit and the training gate, end to end on tiny-random (policy and judge)."""

import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.tasks.load import load_task
from posttrain.rewards.judges import PointwiseJudge
from posttrain.loop.components import build
from posttrain.loop.judge_audit import JudgeAuditError, JudgeAuditFailed, audit, gate

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.name=tiny-random", "task.options.judge_model=tiny-random", "judge.audit_prompts=2",
        "judge.audit_samples=2", "judge.audit_injections=2", "model.threads=1"]


def test_task_is_rewarded_only_by_the_judge():
    task = load_task("json-extract-judged", {"judge_model": "tiny-random", "n_train": 4, "n_eval": 2})
    weights = {c.name: c.weight for c in task.rubric.components}
    assert weights == {"judge": 1.0, "json_parse": 0.0, "json_exact": 0.0}
    assert task.rubric.pass_component == "json_parse"
    assert isinstance(task.judges["judge"], PointwiseJudge) and not task.judges["judge"].yes_means_pass
    with pytest.raises(ValueError, match="group"):
        load_task("json-extract-judged", {"group": "tournament"})


def test_audit_report_and_gate(tmp_path):
    cfg = load_config(None, TINY + ["task.name=json-extract-judged", f"judge.cache={tmp_path / 'c.sqlite'}",
                                    "task.options.group=pairwise"])
    rep = audit(cfg, build(cfg, log=lambda s: None), log=lambda s: None)
    assert rep.n_policy == 4 and rep.confusion.n == rep.n_policy + rep.n_swapped - rep.failed
    assert [i.name for i in rep.injections] and "agreement" in rep.to_text()
    assert rep.to_dict()["confusion"]["tp"] == rep.confusion.tp
    assert gate(cfg, None) is None  # judge.min_agreement unset: no audit
    strict = load_config(None, TINY + ["task.name=json-extract-judged", "judge.min_agreement=1.0",
                                       f"judge.cache={tmp_path / 'c.sqlite'}"])
    if rep.agreement < 1.0:
        with pytest.raises(JudgeAuditFailed, match="min_agreement"):
            gate(strict, build(strict, log=lambda s: None), log=lambda s: None)
    kappa = load_config(None, TINY + ["task.name=json-extract-judged", "judge.min_kappa=1.0",
                                      f"judge.cache={tmp_path / 'c.sqlite'}"])
    if not rep.kappa >= 1.0:
        with pytest.raises(JudgeAuditFailed, match="min_kappa"):
            gate(kappa, build(kappa, log=lambda s: None), log=lambda s: None)


def test_audit_needs_a_verifier_and_a_judge():
    cfg = load_config(None, ["model.name=tiny-random", "task.name=count-a"])
    with pytest.raises(JudgeAuditError, match="judge"):
        audit(cfg, build(cfg, log=lambda s: None), log=lambda s: None)


@pytest.mark.slow
def test_train_two_steps_with_the_judge_reward(tmp_path):
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", "task.name=json-extract-judged", "loop.steps=2",
                        *TINY, "loop.eval_prompts=2", "logging.tensorboard=false", "loop.save_every=0",
                        f"judge.cache={tmp_path / 'c.sqlite'}", f"run.output_dir={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    import json

    recs = [json.loads(x) for x in next(tmp_path.glob("*/metrics.jsonl")).read_text().splitlines()]
    train = [x for x in recs if x["kind"] == "train"]
    assert len(train) == 2 and all(x["judge/lookups"] > 0 for x in train)
    assert "judge/cache_hit" in train[0] and "judge/latency" in train[0]
    assert any("eval/judge/lookups" in x for x in recs if x["kind"] == "eval")


def test_cli_judge_audit_prints_the_report_and_fails_clearly(tmp_path):
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "judge", "audit", "task.name=json-extract-judged", *TINY,
                        f"judge.cache={tmp_path / 'c.sqlite'}", "--json"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    rep = json.loads(r.stdout)
    assert {"agreement", "kappa", "confusion", "injections", "position_flips"} <= set(rep)
    bad = subprocess.run([sys.executable, "-m", "posttrain.cli", "judge", "audit", "task.name=count-a",
                          "model.name=tiny-random"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "judge" in bad.stderr
