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

With `adaptive.enabled` the fraction is not fixed: it moves between a floor and
a ceiling with what the anchor stream measures, the share of the real rewards'
within-group variation that the calibrated world model fails to predict out of
sample (`unexplained`, from the map as it stood before each step's pairs, so a
step's anchors never grade the map they fitted). An exact world model needs
only the floor (enough to watch for drift); one no better than a constant per
group gets the ceiling. The running sums decay with a half-life in steps, so the
budget follows a world model that improves or drifts. Before `min_pairs`
anchor pairs the budget stays at the ceiling. The sums are checkpointed, and
the budget of step t depends only on steps before it, so a resumed run draws
the same anchors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from wmrl.core.async_anchors import STALE_USES


@dataclass
class AdaptiveConfig:
    enabled: bool = False
    floor: float = 0.1
    ceiling: float = 0.5
    half_life: float = 4.0  # steps
    min_pairs: int = 16  # anchor pairs measured before the budget leaves the ceiling

    def validate(self) -> None:
        if not 0.0 < self.floor <= self.ceiling <= 1.0:
            raise ValueError(f"anchors.adaptive needs 0 < floor <= ceiling <= 1, got floor={self.floor!r}, "
                             f"ceiling={self.ceiling!r}")
        if not (math.isfinite(self.half_life) and self.half_life > 0):
            raise ValueError(f"anchors.adaptive.half_life must be > 0 (steps), got {self.half_life!r}")
        if self.min_pairs < 0:
            raise ValueError("anchors.adaptive.min_pairs must be >= 0")


@dataclass
class AnchorConfig:
    fraction: float = 0.1
    min_groups: int = 1
    max_in_flight: int | None = None  # anchor groups per step at most; None: no cap
    seed: int = 0
    #: the fraction moved by the world model's out-of-sample error instead of fixed (see the module docstring)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    #: asynchronous anchors (`core/async_anchors.py`): a step's anchors are consumed this many steps later;
    #: null: synchronous (each step waits for its own)
    max_staleness: int | None = None
    #: what a late anchor group is for: train (off-policy, clipped ratio) | calibrate (pairs only)
    stale_use: str = "train"

    def validate(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"anchors.fraction must be in [0, 1], got {self.fraction}")
        if self.min_groups < 0:
            raise ValueError("anchors.min_groups must be >= 0")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("anchors.max_in_flight must be >= 1 (or null for no cap)")
        if self.max_staleness is not None and not (isinstance(self.max_staleness, int) and self.max_staleness >= 0):
            raise ValueError(f"anchors.max_staleness must be an integer >= 0 (steps), or null for synchronous "
                             f"anchors; got {self.max_staleness!r}")
        if self.stale_use not in STALE_USES:
            raise ValueError(f"anchors.stale_use must be one of {', '.join(STALE_USES)}, got {self.stale_use!r}")
        self.adaptive.validate()


class AnchorScheduler:
    def __init__(self, cfg: AnchorConfig, fraction: float | None = None, *, adaptive: bool = True):
        """`fraction` overrides cfg.fraction (modes fix it: real = 1, wm = 0); `adaptive=False` (a mode that
        fixes it) keeps it fixed whatever `cfg.adaptive` says."""
        cfg.validate()
        self.cfg = cfg
        self.fixed = cfg.fraction if fraction is None else fraction
        if not 0.0 <= self.fixed <= 1.0:
            raise ValueError(f"anchor fraction must be in [0, 1], got {self.fixed}")
        self.cap = cfg.max_in_flight
        self.adaptive = adaptive and cfg.adaptive.enabled
        self._sums = [0.0, 0.0, 0]  # decayed sum of squared out-of-sample residuals, of squared deviations; pairs

    @property
    def unexplained(self) -> float:
        """The running share of the real rewards' within-group variation the world model missed (NaN: none yet)."""
        err, var, _ = self._sums
        return err / var if var > 0 else float("nan")

    @property
    def fraction(self) -> float:
        """The anchor fraction of the next step."""
        if not self.adaptive:
            return self.fixed
        a = self.cfg.adaptive
        u = self.unexplained
        if self._sums[2] < a.min_pairs or not math.isfinite(u):
            return a.ceiling
        return a.floor + (a.ceiling - a.floor) * min(u, 1.0)

    def observe(self, sq_residual: float, sq_deviation: float, pairs: int) -> None:
        """One step's anchors: the world model's squared within-group residuals out of sample, the real
        rewards' squared within-group deviations, and how many pairs they sum over."""
        if not self.adaptive or pairs <= 0:
            return
        keep = 0.5 ** (1.0 / self.cfg.adaptive.half_life)
        err, var, n = self._sums
        self._sums = [keep * err + sq_residual, keep * var + sq_deviation, n + int(pairs)]

    def state_dict(self) -> dict:
        return {"sums": list(self._sums)}

    def load_state_dict(self, state: dict) -> None:
        self._sums = list(state["sums"])

    def count(self, n_groups: int) -> int:
        fraction = self.fraction
        if fraction <= 0 or n_groups == 0:
            return 0
        n = max(int(round(fraction * n_groups)), self.cfg.min_groups)
        if self.cap is not None and fraction < 1.0:
            n = min(n, self.cap)
        return min(n, n_groups)

    def choose(self, step: int, n_groups: int) -> np.ndarray:
        """Sorted indices of the anchor groups for `step`."""
        k = self.count(n_groups)
        rng = np.random.default_rng([self.cfg.seed, step])
        return np.sort(rng.choice(n_groups, size=k, replace=False)) if k else np.zeros(0, dtype=int)
