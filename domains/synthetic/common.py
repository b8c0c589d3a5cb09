"""What both synthetic domains share: the cost of real execution and its ledger, a seeded policy net, and
the knobs of a world model that bends the true reward.

"Expensive" has to be real wall time for the benchmarks to mean anything, so a
synthetic real environment sleeps `delay_s` per execution, running `capacity`
executions at once like a sandbox pool would. The optional ledger appends one
line per real execution the moment it completes, independently of the run
store, which is how tests prove that a crashed and resumed run executed nothing
twice.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from wmrl.core.wm_spec import WorldModelConfig


class ExecutionCost:
    def __init__(self, delay_s: float, capacity: int, ledger: str | None = None):
        self.delay_s = delay_s
        self.capacity = capacity
        self.ledger = Path(ledger) if ledger else None
        self.executions = 0

    @staticmethod
    def check(delay_s: float, capacity: int) -> None:
        """The domain config's check of these two keys."""
        if not delay_s >= 0:
            raise ValueError(f"domain.real_delay_s must be >= 0, got {delay_s!r}")
        if capacity < 1:
            raise ValueError(f"domain.real_capacity must be >= 1, got {capacity!r}")

    def pay(self, labels: list[str]) -> None:
        """Spend the wall time of executing `labels` and record them."""
        if not labels:
            return
        if self.delay_s:
            time.sleep(self.delay_s * math.ceil(len(labels) / self.capacity))
        self.executions += len(labels)
        if self.ledger is not None:
            with self.ledger.open("a") as fh:
                fh.write("".join(label + "\n" for label in labels))


def seeded_mlp(sizes: Sequence[int], seed: int, *, out_scale: float = 0.1) -> nn.Sequential:
    """A tanh MLP whose weights depend on `seed` alone (its own generator, not torch's global RNG).

    Layers are initialised as `nn.Linear` does by default, in order; the output
    layer is then shrunk by `out_scale` with a zero bias, so a policy starts
    near uniform: the mediocre agent that RL improves.
    """
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(n_in, n_out)] + ([nn.Tanh()] if i < len(sizes) - 2 else [])
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in layers:
            if isinstance(layer, nn.Linear):
                nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=g)
                bound = 1.0 / math.sqrt(layer.in_features)
                nn.init.uniform_(layer.bias, -bound, bound, generator=g)
        layers[-1].weight.mul_(out_scale)
        layers[-1].bias.zero_()
    return nn.Sequential(*layers)


@dataclass
class DistortionConfig(WorldModelConfig):
    """A world model that knows the true reward and bends it: r -> r**shape plus noise whose std is
    `noise` plus `noise_hetero` times how unusual the episode is (each domain says what unusual is)."""

    shape: float = 1.0
    noise: float = 0.02
    noise_hetero: float = 0.0

    def validate(self) -> None:
        if not self.shape > 0:
            raise ValueError(f"world_model.shape must be > 0, got {self.shape!r}")
        if self.noise < 0 or self.noise_hetero < 0:
            raise ValueError("world_model.noise and world_model.noise_hetero must be >= 0")
