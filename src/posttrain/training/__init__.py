"""The Trainer: forward_backward, optim_step, save_state/load_state; micro-batching with prefix sharing."""

from posttrain.training.trainer import Trainer, atomic_torch_save

__all__ = ["Trainer", "atomic_torch_save"]
