#!/bin/bash
# The CUDA-graph decode on a GPU (sampling.cuda_graphs): bench/gpu.py with --graphs, a token-level comparison of the
# two decode loops on the tiny model, and a short run with the fast path on. Needs the wheels bench/gpu_session.sh
# names (carried in .whl) installed first.
set -u
OUT=${OUT:-bench/results}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
echo "== bench/gpu.py --graphs"
timeout 260 python3 bench/gpu.py --graphs --no-trl 2>&1 | grep -E "^\||^bench|Error|error" | tail -16
cp bench/results/gpu.md "$OUT/gpu_graphs.md" 2>/dev/null; cp bench/results/gpu.json "$OUT/gpu_graphs.json" 2>/dev/null
echo "== eager vs graph decode, tiny model on cuda (fp32 and bf16)"
timeout 90 python3 - <<'PY' 2>&1 | grep -v -i warn | tail -8
import time, torch
from posttrain.models import stop_token_ids
from posttrain.models.tiny import tiny_random_model
from posttrain.sampling import HFSampler
from posttrain.types import SampleParams
for dtype in (torch.float32, torch.bfloat16):
    model, tok = tiny_random_model(seed=0)
    model = model.to("cuda", dtype).eval()
    e = HFSampler(model, tok, stop_token_ids(model, tok), seed=7)
    g = HFSampler(model, tok, stop_token_ids(model, tok), seed=7, graphs=True)
    prompts = [tok.encode("hello there"), tok.encode("hi"), tok.encode("abc abc")]
    p = SampleParams(max_tokens=40, temperature=1.0)
    t0 = time.perf_counter(); g.sample_sync(prompts, p, n=4); t1 = time.perf_counter()
    g.generator.manual_seed(7)
    a, b = e.sample_sync(prompts, p, n=4), g.sample_sync(prompts, p, n=4)
    same = sum(x.token_ids == y.token_ids for ga, gb in zip(a, b) for x, y in zip(ga, gb))
    dl = max((abs(u - v) for ga, gb in zip(a, b) for x, y in zip(ga, gb) if x.token_ids == y.token_ids
             for u, v in zip(x.logprobs, y.logprobs)), default=float("nan"))
    print(f"{dtype}: identical completions {same}/12, max logprob diff on those {dl:.2e}, first call (compile) {t1 - t0:.1f}s")
PY
echo "== a run with the fast path on"
timeout 60 python3 -m posttrain.cli train model.name=tiny-random model.device=cuda sampling.cuda_graphs=true \
    task.name=count-a loop.steps=20 loop.prompts_per_step=4 algorithm.num_generations=8 trainer.lr=3e-3 \
    loop.save_every=0 loop.keep_checkpoints=0 loop.eval_prompts=8 logging.tensorboard=false \
    run.output_dir=/tmp/g run.name=graphs 2>&1 | grep -E "step +(1|10|20)/|eval \(|done in|Error|error" | head
