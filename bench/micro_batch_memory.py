"""Peak memory of one training forward/backward on the default model for one group of 4 long sequences
(multi-turn episodes), with the group whole (--budget 0) or split at trainer.micro_batch_tokens.

    python bench/micro_batch_memory.py --budget 4096 --completion 2500
    python bench/micro_batch_memory.py --budget 0 --completion 2500     # one 10,000-token micro-batch

Prints the process's peak resident memory. Run one setting per process: the peak never goes down.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from posttrain.algos import LOSSES, LossParams
from posttrain.models.load import load_model
from posttrain.training import Trainer
from posttrain.types import Batch, Sequence


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=int, default=4096, help="micro_batch_tokens (0: the whole group at once)")
    ap.add_argument("--completion", type=int, default=2500, help="tokens of the longest of the 4 sequences")
    ap.add_argument("--prompt", type=int, default=600)
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = load_model(a.model)
    g = torch.Generator().manual_seed(0)
    vocab = len(tok)
    prompt = torch.randint(0, vocab, (a.prompt,), generator=g).tolist()
    seqs = []
    for k in range(4):  # 2500, 2400, 2300, 2200 tokens: episodes of one group differ in length
        n = a.completion - 100 * k
        seqs.append(Sequence(prompt_ids=prompt, completion_ids=torch.randint(0, vocab, (n,), generator=g).tolist(),
                             loss_mask=[1] * n, sampler_logprobs=[-1.0] * n, advantage=1.5 - k, group_id=0))
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    tr = Trainer(model, pad_id=tok.pad_token_id, micro_batch_tokens=a.budget or 10**9)
    t = time.perf_counter()
    m = tr.forward_backward(Batch(sequences=seqs), LOSSES["ppo_clip"], LossParams()).metrics
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(f"budget {a.budget or 'none (whole group)'}, 4 sequences of {a.completion - 300}-{a.completion} tokens "
          f"+ a {a.prompt}-token prompt: peak RSS {peak:.1f} GB (model loaded: {loaded:.1f} GB), "
          f"loss {m['train/loss']:+.4f}, {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
