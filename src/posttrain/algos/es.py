"""Evolution strategies over model weights, as pure functions (no optimizer, no backward pass).

OpenAI-ES (Salimans et al. 2017, "Evolution Strategies as a Scalable Alternative to Reinforcement Learning",
arXiv:1703.03864) with antithetic sampling and centred-rank fitness shaping, as used for LLM fine-tuning by
Qiu et al. 2025 ("Evolution Strategies at Scale", arXiv:2509.24372) and the seed post on theorem proving with
GRPO vs ES. For n = population / 2 seeds s_i with noise eps_i = N(0, I) drawn from s_i:

    evaluate   f+_i = F(theta + sigma * eps_i),   f-_i = F(theta - sigma * eps_i)
    shape      u = centred_ranks([f+, f-])   in [-0.5, 0.5]
               w_i = u(f+_i) - u(f-_i)
    update     theta <- theta + lr / population * sum_i w_i * eps_i

The step follows Qiu et al.'s convention (sigma folded into lr, so their lr = 5e-4 with sigma = 1e-3 carries
over); OpenAI-ES divides by sigma as well, which with sigma = 1e-3 makes the same lr a 1000x larger step.

The noise is a pure function of (seed, parameter index), so an iteration is fully described by its seeds and
weights: about 12 bytes per antithetic pair. Replaying the list of (seeds, weights) on the base weights repeats
exactly the same float operations in the same order, so it reconstructs the trained weights bit for bit
(the seed post's "stateless checkpointing via seed histories").
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

_MIX = 1_000_003
_MAX_SEED = 2**62


@dataclass
class ESIteration:
    seeds: list[int]
    weights: list[float]  # float32-exact values (see shaped_weights)

    def to_bytes(self) -> bytes:
        """Compact binary form: int64 seeds then float32 weights (what a worker would ship or store)."""
        n = len(self.seeds)
        return struct.pack(f"<I{n}q{n}f", n, *self.seeds, *self.weights)


@dataclass
class ESHistory:
    """Everything needed to rebuild the weights: hyper-parameters + one ESIteration per update."""

    sigma: float
    lr: float
    population: int
    iterations: list[ESIteration] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "sigma": self.sigma,
            "lr": self.lr,
            "population": self.population,
            "iterations": [{"seeds": it.seeds, "weights": it.weights} for it in self.iterations],
        }

    @classmethod
    def from_dict(cls, d: dict) -> ESHistory:
        return cls(
            sigma=float(d["sigma"]),
            lr=float(d["lr"]),
            population=int(d["population"]),
            iterations=[
                ESIteration([int(s) for s in it["seeds"]], [float(w) for w in it["weights"]]) for it in d["iterations"]
            ],
        )

    def bytes_per_iteration(self) -> float:
        if not self.iterations:
            return 0.0
        return sum(len(it.to_bytes()) for it in self.iterations) / len(self.iterations)


def iteration_seeds(master_seed: int, iteration: int, n_pairs: int) -> list[int]:
    """The n antithetic-pair seeds of one iteration, a pure function of (master seed, iteration)."""
    rng = random.Random(master_seed * _MIX + iteration)
    return [rng.randrange(_MAX_SEED) for _ in range(n_pairs)]


def noise(shape: torch.Size | Sequence[int], seed: int, param_index: int) -> torch.Tensor:
    """eps for one parameter tensor: N(0, I) from a CPU generator seeded by (seed, parameter index)."""
    g = torch.Generator(device="cpu")
    g.manual_seed((seed * _MIX + param_index) % _MAX_SEED)
    return torch.randn(tuple(shape), generator=g, dtype=torch.float32)


def centred_ranks(fitness_N: Sequence[float]) -> torch.Tensor:
    """Centred ranks in [-0.5, 0.5]; ties share their average rank (so all-equal fitness gives all zeros)."""
    f = torch.tensor(list(fitness_N), dtype=torch.float64)
    n = f.numel()
    if n < 2:
        return torch.zeros(n, dtype=torch.float64)
    order = torch.argsort(f, stable=True)
    ranks = torch.empty(n, dtype=torch.float64)
    ranks[order] = torch.arange(n, dtype=torch.float64)
    for v in torch.unique(f):  # average ranks over ties
        tie = f == v
        ranks[tie] = ranks[tie].mean()
    return ranks / (n - 1) - 0.5


def shaped_weights(f_plus_n: Sequence[float], f_minus_n: Sequence[float]) -> list[float]:
    """w_i = u(f+_i) - u(f-_i) with u = centred ranks over all 2n evaluations, rounded to float32 so the
    stored history (JSON or binary) holds exactly the values the update used."""
    if len(f_plus_n) != len(f_minus_n):
        raise ValueError("antithetic fitness lists differ in length")
    n = len(f_plus_n)
    u = centred_ranks(list(f_plus_n) + list(f_minus_n))
    return (u[:n] - u[n:]).to(torch.float32).tolist()


@torch.no_grad()
def perturb_(params: Sequence[torch.Tensor], base: Sequence[torch.Tensor], seed: int, scale: float) -> None:
    """params <- base + scale * eps(seed)  (scale = +sigma or -sigma). Written from the base, never by adding
    and subtracting noise in place, so the base is never changed by rounding."""
    for j, (p, b) in enumerate(zip(params, base)):
        p.copy_(b + scale * noise(p.shape, seed, j).to(device=p.device, dtype=p.dtype))


@torch.no_grad()
def apply_update_(params: Sequence[torch.Tensor], it: ESIteration, sigma: float, lr: float, population: int) -> None:
    """theta <- theta + lr / population * sum_i w_i * eps_i, in a fixed order (bit-exact replays). `sigma` is
    recorded in the history but does not scale the step (see the module docstring)."""
    step = lr / population
    for j, p in enumerate(params):
        delta = torch.zeros(p.shape, dtype=torch.float32)
        for seed, w in zip(it.seeds, it.weights):
            if w != 0.0:
                delta.add_(noise(p.shape, seed, j), alpha=w)
        p.add_(delta.to(device=p.device, dtype=p.dtype), alpha=step)


@torch.no_grad()
def replay_(params: Sequence[torch.Tensor], history: ESHistory) -> None:
    """Rebuild trained weights from the base weights (in `params`) and a seed history, in place."""
    for it in history.iterations:
        apply_update_(params, it, history.sigma, history.lr, history.population)
