"""The policy-gradient surrogate the engine minimises, from an estimator's output.

PPO's clipped ratio objective over every graded trajectory, each weighted by
the estimator's weight (the denoiser's anchor weight, per-trajectory inverse
variance) and normalised by the total weight, so the weights fuse the streams
as a weighted mean instead of rescaling the step. A trajectory counts once
however many turns it has; excluded trajectories (no advantage) never enter.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import torch

from wmrl.core.interfaces import Policy
from wmrl.core.types import Estimate, Group


class SurrogateBatch:
    """The flattened turns of one step's graded trajectories."""

    def __init__(self, groups: Sequence[Group], est: Estimate):
        self.observations, self.actions, old, adv, wt = [], [], [], [], []
        total_w = 0.0
        self.trajectories = 0
        for g, advs, ws in zip(groups, est.advantages, est.weights):
            for traj, a, w in zip(g.trajectories, advs, ws):
                if a is None or w <= 0 or traj.turns == 0:
                    continue
                total_w += w
                self.trajectories += 1
                for t in range(traj.turns):
                    self.observations.append(traj.observations[t])
                    self.actions.append(traj.actions[t])
                    old.append(traj.log_probs[t])
                    adv.append(a)
                    wt.append(w / traj.turns)
        self.old_log_probs = torch.tensor(old, dtype=torch.float32)
        self.advantages = torch.tensor(adv, dtype=torch.float32)
        self.weights = torch.tensor(wt, dtype=torch.float32) / (total_w or 1.0)

    def __len__(self) -> int:
        return len(self.actions)

    def loss(self, policy: Policy, clip_eps: float, rows: slice = slice(None)) -> torch.Tensor:
        """The surrogate over turns `rows` (all by default); the shares of a partition add up to the whole."""
        new = policy.log_prob(self.observations[rows], self.actions[rows])
        ratio = torch.exp(new - self.old_log_probs[rows])
        clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
        adv = self.advantages[rows]
        return -(self.weights[rows] * torch.minimum(ratio * adv, clipped * adv)).sum()

    def micro_batches(self, policy: Policy, clip_eps: float, size: int) -> list[Callable[[], torch.Tensor]]:
        """The loss as shares of at most `size` turns each (0: one share), computed only when called.

        One `log_prob` call per share bounds the memory of an update by `size`
        turns: the engine backpropagates a share before it computes the next.
        """
        n = len(self)
        size = size or n
        return [partial(self.loss, policy, clip_eps, slice(i, min(i + size, n))) for i in range(0, n, size)]
