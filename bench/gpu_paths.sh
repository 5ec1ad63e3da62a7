#!/bin/bash
# The device paths on a GPU, end to end (bench/gpu_session.sh installs nothing here: run it first in the same call,
# or install the carried wheels the same way). Each line: a short tiny-random count-a run on CUDA with one feature
# on, its exit status and its first/last train reward. A path that puts a tensor on the wrong device fails its run.
set -u
OUT=${OUT:-/tmp}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
BASE="model.name=tiny-random model.device=cuda task.name=count-a loop.steps=12 loop.prompts_per_step=4 \
algorithm.num_generations=8 trainer.lr=3e-3 loop.save_every=0 loop.keep_checkpoints=0 loop.eval_prompts=8 \
logging.tensorboard=false logging.console=false run.output_dir=/tmp/paths"
run() {  # name, overrides...
    local name=$1; shift
    timeout 120 python3 -m posttrain.cli train $BASE run.name=$name "$@" > /tmp/paths-$name.log 2>&1
    local rc=$?
    python3 - "$name" "$rc" <<'PY' | tee -a "$OUT/gpu_paths.txt"
import json, sys
name, rc = sys.argv[1], sys.argv[2]
try:
    recs = [json.loads(l) for l in open(f"/tmp/paths/{name}/metrics.jsonl") if '"kind": "train"' in l]
    r = [x["reward/mean"] for x in recs]
    print(f"{name:12s} rc={rc} steps={len(r)} reward first3={sum(r[:3])/3:.3f} last3={sum(r[-3:])/3:.3f}")
except Exception as e:
    print(f"{name:12s} rc={rc} no metrics ({type(e).__name__})")
PY
    [ "$rc" = 0 ] || tail -5 /tmp/paths-$name.log
}
run plain
run fp32 model.dtype=float32
run async loop.mode=async loop.max_staleness=1
run lora lora.enabled=true trainer.lr=1e-2
run kl_ref algorithm.beta=0.05
run teacher algorithm.teacher.model=tiny-random algorithm.teacher.coef=0.1
run es algorithm.name=es loop.steps=4
run chunked trainer.logits_chunk_tokens=64
