"""A stand-in for `python -m posttrain.cli train` in the search tests: no torch, milliseconds per trial.

It takes the same arguments (key=value overrides, run.output_dir, run.name, run.seed), writes a run directory
with metrics.jsonl and summary.json, and misbehaves on request: task.options.mode=crash exits 1 with a
traceback, task.options.mode=hang sleeps past any test timeout, task.options.mode=crash0 crashes on seed 0 and
hangs on any other seed.
"""

import json
import math
import sys
import time
from pathlib import Path

args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
run = Path(args["run.output_dir"]) / args["run.name"]
run.mkdir(parents=True)
(run / "config.yaml").write_text("fake: true\n")
mode = json.loads(args.get("task.options.mode", '"ok"'))
if mode == "crash0":
    mode = "crash" if args["run.seed"] == "0" else "hang"
if mode == "crash":
    print("Traceback (most recent call last):\nRuntimeError: boom (fake trial crashed)", file=sys.stderr)
    sys.exit(1)
if mode == "hang":
    time.sleep(120)
lr, seed = float(args.get("trainer.lr", 2e-5)), int(args["run.seed"])
value = round(1.0 - abs(math.log10(lr) + 4.5) / 2 + 0.01 * seed, 4)  # best at lr = 10^-4.5
with open(run / "metrics.jsonl", "w") as f:
    f.write(json.dumps({"kind": "eval", "step": 1, "eval/pass_rate": value}) + "\n")
(run / "summary.json").write_text(json.dumps({"before": {}, "after": {"eval/pass_rate": value}, "steps": 2}))
