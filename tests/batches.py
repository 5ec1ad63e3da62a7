"""A random training batch for trainer tests (importable from any test: pytest puts tests/ on sys.path)."""

import random

from posttrain.types import Batch, Sequence


def random_batch(vocab: int, n_groups=3, g=3, seed=0) -> Batch:
    """n_groups groups of g sequences sharing a prompt, completions of growing length, random advantages."""
    rng = random.Random(seed)
    seqs = []
    for gi in range(n_groups):
        prompt = [rng.randrange(4, vocab) for _ in range(6 + 3 * gi)]
        for j in range(g):
            n = 4 + 2 * j
            seqs.append(Sequence(prompt_ids=prompt, completion_ids=[rng.randrange(4, vocab) for _ in range(n)],
                                 loss_mask=[1] * n, sampler_logprobs=[-1.0] * n, advantage=rng.gauss(0, 1),
                                 group_id=gi))
    return Batch(seqs)
