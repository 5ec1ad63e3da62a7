#!/bin/bash
# One device session (the machine has no network): install the carried wheels (.whl, see docs/scaling.md), then
#   1. bench/gpu.py: the table (sampler, trainer, GRPO step, TRL's step)
#   2. a real run on CUDA (tiny-random, count-a), then its checkpoint resumed on the CPU: the device paths end to end
# Usage there: bash bench/gpu_session.sh   (writes into $OUT when set, else bench/results)
set -u
OUT=${OUT:-bench/results}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
echo "== bench/gpu.py"
timeout 240 python3 bench/gpu.py 2>&1 | grep -v "Warning\|warn(" | tail -40
cp bench/results/gpu.md bench/results/gpu.json "$OUT"/ 2>/dev/null
echo "== posttrain train on cuda, then resume on cpu"
R=/tmp/gpu-runs
timeout 90 python3 -m posttrain.cli train model.name=tiny-random model.device=cuda task.name=count-a loop.steps=20 \
    loop.prompts_per_step=4 algorithm.num_generations=8 trainer.lr=3e-3 loop.save_every=10 loop.eval_prompts=8 \
    logging.tensorboard=false run.output_dir=$R run.name=cuda 2>&1 | grep -E "step +(1|5|10|15|20)/|eval|device|dtype|done|Error|error" | head -30
timeout 60 python3 -m posttrain.cli train --resume $R/cuda model.device=cpu loop.steps=24 2>&1 \
    | grep -E "resum|step +2[1-4]/|eval|done|Error|error" | head -20
python3 - <<'PY' | tee "$OUT/gpu_run.txt"
import json
recs = [json.loads(l) for l in open("/tmp/gpu-runs/cuda/metrics.jsonl") if '"kind": "train"' in l]
r = [x["reward/mean"] for x in recs]
print(f"cuda run: {len(recs)} train records, reward first 5 {sum(r[:5])/5:.3f}, steps 16-20 {sum(r[15:20])/5:.3f}, "
      f"after resume on cpu (21-24) {sum(r[20:24])/max(len(r[20:24]),1):.3f}")
PY
