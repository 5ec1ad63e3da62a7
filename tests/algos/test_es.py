import pytest
import torch

from posttrain.algos.es import (ESHistory, ESIteration, apply_update_, centred_ranks, iteration_seeds, noise, perturb_,
                                replay_, shaped_weights)


def test_centred_ranks_and_ties():
    assert centred_ranks([3.0, 1.0, 2.0]).tolist() == pytest.approx([0.5, -0.5, 0.0])
    assert centred_ranks([1.0, 1.0, 1.0, 1.0]).tolist() == [0.0] * 4
    # ties share the average rank
    assert centred_ranks([0.0, 1.0, 1.0]).tolist() == pytest.approx([-0.5, 0.25, 0.25])


def test_shaped_weights_are_antithetic_rank_differences():
    w = shaped_weights([1.0, 0.0], [0.0, 1.0])  # centred ranks of [1, 0, 0, 1] with ties: [1/3, -1/3, -1/3, 1/3]
    assert w == pytest.approx([2 / 3, -2 / 3])
    assert shaped_weights([0.5, 0.5], [0.5, 0.5]) == [0.0, 0.0]
    with pytest.raises(ValueError):
        shaped_weights([1.0], [1.0, 2.0])


def test_noise_is_a_pure_function_of_seed_and_param_index():
    assert torch.equal(noise((3, 4), 7, 0), noise((3, 4), 7, 0))
    assert not torch.equal(noise((3, 4), 7, 0), noise((3, 4), 7, 1))
    assert iteration_seeds(0, 5, 4) == iteration_seeds(0, 5, 4) != iteration_seeds(0, 6, 4)


def test_update_moves_along_fitness_weighted_noise():
    p = [torch.zeros(1000)]
    it = ESIteration(seeds=[11], weights=[1.0])
    apply_update_(p, it, sigma=0.1, lr=0.2, population=2)
    assert torch.allclose(p[0], 0.2 / 2 * noise((1000,), 11, 0))


def test_perturb_writes_from_base_and_leaves_base_untouched():
    base = [torch.randn(5, 5)]
    p = [base[0].clone()]
    perturb_(p, base, seed=3, scale=0.5)
    assert torch.allclose(p[0], base[0] + 0.5 * noise((5, 5), 3, 0))
    perturb_(p, base, seed=3, scale=0.0)
    assert torch.equal(p[0], base[0])


def test_history_roundtrip_and_size():
    h = ESHistory(sigma=1e-3, lr=1e-3, population=8,
                  iterations=[ESIteration(iteration_seeds(0, i, 4), shaped_weights([1, 2, 3, 4], [4, 3, 2, 1]))
                              for i in range(3)])
    h2 = ESHistory.from_dict(h.to_dict())
    assert h2.to_dict() == h.to_dict()
    assert h.bytes_per_iteration() == 4 + 4 * 8 + 4 * 4
    params = [torch.randn(4, 4), torch.randn(3)]
    a, b = [t.clone() for t in params], [t.clone() for t in params]
    replay_(a, h)
    replay_(b, h2)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
