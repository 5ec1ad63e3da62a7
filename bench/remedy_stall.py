"""Diagnostics and remedies on the stall tasks, wired into the current sync loop from outside (a subclass).

This is a stand-in until the loop rewrite calls `Diagnostics` and `Remedies` itself: it shows the wiring (what
to call after each step, where events go, how overrides reach the sampler and the trainer) and measures the
remedy. For each seed it trains the `partial_credit` stall task twice, remedies off and on, and reports the
held-out headline pass rate and when each diagnostic fired.

    python bench/remedy_stall.py [--task partial_credit] [--steps 30] [--seeds 0 1 2] [--out bench/results]

Writes bench/results/remedy_stall.{json,md}; each run dir holds metrics.jsonl with the diagnostic and remedy
records (`posttrain diagnose RUN_DIR`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import replace
from pathlib import Path

from posttrain.config import load_config
from posttrain.loop.credit import apply_overlong_penalty
from posttrain.loop.rl_loop import RLLoop
from posttrain.obs.diagnose_run import RunDiagnosis, render
from posttrain.obs.diagnostics import Diagnostics
from posttrain.obs.remedies import Overrides, Remedies, with_format_hint
from posttrain.types import Group

ROOT = Path(__file__).resolve().parents[1]


class DiagnosedLoop(RLLoop):
    """RLLoop + diagnostics after every step and eval + remedies applied to the next step's sampling."""

    def __init__(self, cfg, **kw):
        super().__init__(cfg, **kw)
        self.diag = Diagnostics(cfg.diagnostics)
        self.remedies = Remedies.from_config(cfg)
        self.ov = Overrides()
        self._hinted: dict[int, dict] = {}  # kept alive: the env caches rendered prompts by id(row)

    def _row(self, i: int) -> dict:
        row = self.c.task.train_rows[i]
        if not self.ov.format_hint or "format_hint" not in row:
            return row
        if i not in self._hinted:
            self._hinted[i] = with_format_hint(row)
        return self._hinted[i]

    async def _sample_groups(self, row_indices, timer):
        c = self.c
        G = self.ov.num_generations or self.cfg.algorithm.num_generations
        params = replace(c.train_params, temperature=self.ov.temperature or c.train_params.temperature,
                         stop=list(c.train_params.stop) + list(self.ov.extra_stop))
        rows = [self._row(i) for i in row_indices]
        with timer("sample"):
            trajs = list(await asyncio.gather(*(c.env.rollout(r, c.sampler, params) for r in rows for _ in range(G))))
        with timer("reward"):
            await c.env.score(trajs)
        groups = [Group(task_index=idx, trajectories_G=trajs[i * G:(i + 1) * G]) for i, idx in enumerate(row_indices)]
        algo = self.cfg.algorithm if self.ov.overlong_buffer_frac is None else \
            self.cfg.algorithm.model_copy(update={"overlong_buffer_frac": self.ov.overlong_buffer_frac})
        self._overlong_pen.append(apply_overlong_penalty(groups, algo, c.train_params.max_tokens))
        return groups

    async def _train_step(self, step):
        # The trainer scores tokens at the sampling temperature: keep them equal.
        self.c.trainer.temperature = self.ov.temperature or self.cfg.sampling.temperature
        m = await super()._train_step(step)
        self._observe({"kind": "train", "step": step + 1, **m})
        return m

    async def _eval(self, step, label):
        m = await super()._eval(step, label)
        self._observe({"kind": "eval", "step": step, **m})
        return m

    def _observe(self, record):
        events = self.diag.observe(record)
        for e in events:
            self.logger.log(e.to_record())
            self.say(e.line())
        self.ov = self.remedies.update(record["step"], record, events)
        for ch in self.ov.changes:
            self.logger.log(ch.to_record())
            self.say(ch.line())


def run_one(task: str, steps: int, seed: int, remedies: bool, out: Path, extra: list[str]) -> dict:
    name = f"{task}-s{seed}-{'remedies' if remedies else 'plain'}"
    cfg = load_config(None, [f"task.name={ROOT}/examples/stall_tasks.py:{task}", f"loop.steps={steps}",
                             f"run.seed={seed}", f"run.name={name}", f"run.output_dir={out}", "loop.save_every=0",
                             "logging.tensorboard=false", f"diagnostics.remedies.enabled={str(remedies).lower()}",
                             *extra])
    loop = DiagnosedLoop(cfg)
    res = loop.run()
    summary = json.loads((res.run_dir / "summary.json").read_text())
    summary["diagnostics"] = loop.diag.summary()
    (res.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(render(RunDiagnosis.of(res.run_dir, loop.diag)), flush=True)
    return {"run": name, "seed": seed, "remedies": remedies, "before": res.before.get("eval/pass_rate"),
            "after": res.after.get("eval/pass_rate"), "reward_after": res.after.get("eval/reward/mean"),
            "diagnostics": [(d["name"], d["start_step"], d["end_step"]) for d in summary["diagnostics"]],
            "run_dir": str(res.run_dir)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="partial_credit")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--modes", nargs="+", default=["plain", "remedies"])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "remedy_runs"))
    ap.add_argument("extra", nargs="*", help="config overrides for every run")
    a = ap.parse_args()
    rows = []
    for seed in a.seeds:
        for mode in a.modes:
            rows.append(run_one(a.task, a.steps, seed, mode == "remedies", Path(a.out), a.extra))
            print(json.dumps(rows[-1]), flush=True)
    res = ROOT / "bench" / "results"
    (res / f"remedy_{a.task}.json").write_text(json.dumps(rows, indent=2))
    lines = ["| seed | remedies | held-out pass before | after | diagnostics (name: start-end step) |",
             "|---|---|---:|---:|---|"]
    for r in rows:
        diags = ", ".join(f"{n}: {s}-{e if e is not None else ''}" for n, s, e in r["diagnostics"]) or "none"
        lines.append(f"| {r['seed']} | {'on' if r['remedies'] else 'off'} | {r['before']:.1%} | {r['after']:.1%} | "
                     f"{diags} |")
    (res / f"remedy_{a.task}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
