"""Anchor scheduling: which groups of a step are also graded by the real environment.

The anchor stream is what keeps a world-model run honest: it feeds the debiaser,
measures the world model's noise for the denoiser, and contributes real-reward
gradients. It is bought with real execution, so its size is a budget: a fraction
`fraction` of the step's groups, at least `min_groups` whenever the fraction is
positive (a step with no anchor learns nothing about drift), and at most
`max_in_flight` groups, set to what the sandbox pool can run at once, so
anchors never queue behind each other. (A RealEnv's `capacity` counts
executions, not groups; it sets how long a batch takes, not how many anchors.)
Selection is seeded by (seed, step), so a resumed run picks the same anchors.
The realized fraction is reported because it falls below `fraction` exactly when
the capacity binds, which is worth seeing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class AnchorConfig:
    fraction: float = 0.1
    min_groups: int = 1
    max_in_flight: int | None = None  # anchor groups per step at most; None: no cap
    seed: int = 0

    def validate(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"anchors.fraction must be in [0, 1], got {self.fraction}")
        if self.min_groups < 0:
            raise ValueError("anchors.min_groups must be >= 0")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("anchors.max_in_flight must be >= 1 (or null for no cap)")


class AnchorScheduler:
    def __init__(self, cfg: AnchorConfig, fraction: float | None = None):
        """`fraction` overrides cfg.fraction (modes fix it: real = 1, wm = 0)."""
        cfg.validate()
        self.cfg = cfg
        self.fraction = cfg.fraction if fraction is None else fraction
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"anchor fraction must be in [0, 1], got {self.fraction}")
        self.cap = cfg.max_in_flight

    def count(self, n_groups: int) -> int:
        if self.fraction <= 0 or n_groups == 0:
            return 0
        n = max(int(round(self.fraction * n_groups)), self.cfg.min_groups)
        if self.cap is not None and self.fraction < 1.0:
            n = min(n, self.cap)
        return min(n, n_groups)

    def choose(self, step: int, n_groups: int) -> np.ndarray:
        """Sorted indices of the anchor groups for `step`."""
        k = self.count(n_groups)
        rng = np.random.default_rng([self.cfg.seed, step])
        return np.sort(rng.choice(n_groups, size=k, replace=False)) if k else np.zeros(0, dtype=int)
