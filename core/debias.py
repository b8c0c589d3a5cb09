"""Online Debiasing: a monotone map from world-model score to real score.

Why monotone and non-affine: GRPO standardizes rewards within each group, which
cancels any affine map, so only the map's *shape* matters; and a monotone map
never reorders the trajectories of a group, so calibration cannot invent
preferences the world model did not express. The map is the isotonic regression
of real on predicted scores, computed on equal-width buckets of the prediction
(robust with few pairs, cheap to refit) by pool-adjacent-violators weighted by
bucket counts, interpolated linearly between bucket means and flat beyond them.

The bias drifts as the policy moves, so pairs live in a FIFO window and the map
is refit every `refit_every` new pairs. Before `min_pairs` pairs exist the map is
exactly the identity: too few pairs give a map noisier than the bias it removes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np


@dataclass
class DebiasConfig:
    enabled: bool = True
    n_bins: int = 10
    min_pairs: int = 32
    refit_every: int = 16
    window: int = 1024
    #: steps: half-life of the running sums behind `bias_reduction_smoothed` (a diagnostic only)
    report_half_life: float = 8.0

    def validate(self) -> None:
        if not self.report_half_life > 0:
            raise ValueError("estimator.debias.report_half_life must be > 0 (steps)")
        if self.n_bins < 1:
            raise ValueError("estimator.debias.n_bins must be >= 1")
        if self.min_pairs < 1 or self.refit_every < 1:
            raise ValueError("estimator.debias.min_pairs and refit_every must be >= 1")
        if self.window < self.min_pairs:
            raise ValueError("estimator.debias.window must be >= min_pairs, or the map never leaves identity")


def pool_adjacent_violators(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-decreasing fit of `y` (weights `w`)."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for yi, wi in zip(y.astype(float), w.astype(float)):
        blocks.append([yi, wi, 1])
        # merge backwards while the last two blocks violate monotonicity
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            wt = w1 + w2
            blocks.append([(m1 * w1 + m2 * w2) / wt, wt, n1 + n2])
    return np.concatenate([np.full(int(n), m) for m, _, n in blocks])


class IsotonicDebiaser:
    """Bucketed isotonic calibration of world-model scores, refit online."""

    def __init__(self, cfg: DebiasConfig | None = None):
        self.cfg = cfg or DebiasConfig()
        self.cfg.validate()
        self._pairs: deque[tuple[float, float]] = deque(maxlen=self.cfg.window)
        self._since_fit = 0
        self._knots_x: np.ndarray | None = None  # None = identity
        self._knots_y: np.ndarray | None = None

    @property
    def n_pairs(self) -> int:
        return len(self._pairs)

    @property
    def fitted(self) -> bool:
        return self._knots_x is not None

    def push(self, predicted: Iterable[float], real: Iterable[float]) -> None:
        """Add anchor pairs (WM score, real score); refit on the configured cadence.

        Every value must be a finite number: one NaN would poison the map for the
        rest of the run, so it is refused (an unknown grade is left out, not NaN).
        """
        pairs = [(float(p), float(r)) for p, r in _zip_same(predicted, real)]
        for p, r in pairs:
            if not (np.isfinite(p) and np.isfinite(r)):
                raise ValueError(f"debiaser.push: the pair (world model {p!r}, real {r!r}) is not finite; pass "
                                 "finite scores and leave unknown grades out")
        for p, r in pairs:
            self._pairs.append((float(np.clip(p, 0.0, 1.0)), r))
            self._since_fit += 1
        if len(self._pairs) >= self.cfg.min_pairs and (not self.fitted or self._since_fit >= self.cfg.refit_every):
            self._fit()

    def _fit(self) -> None:
        pairs = np.asarray(self._pairs)
        x, y = pairs[:, 0], pairs[:, 1]
        bins = np.minimum((x * self.cfg.n_bins).astype(int), self.cfg.n_bins - 1)
        populated = np.unique(bins)
        counts = np.array([(bins == b).sum() for b in populated], dtype=float)
        mean_x = np.array([x[bins == b].mean() for b in populated])
        mean_y = np.array([y[bins == b].mean() for b in populated])
        self._knots_x = mean_x
        self._knots_y = pool_adjacent_violators(mean_y, counts)
        self._since_fit = 0

    def __call__(self, scores: Sequence[float] | np.ndarray) -> np.ndarray:
        """Calibrate scores; the identity until the map is fitted."""
        s = np.asarray(scores, dtype=float)
        if not np.all(np.isfinite(s)):
            bad = float(s[~np.isfinite(s)][0])
            raise ValueError(f"debiaser: cannot calibrate the score {bad!r}; pass finite world-model scores")
        if not self.fitted:
            return s.copy()
        return np.interp(np.clip(s, 0.0, 1.0), self._knots_x, self._knots_y)

    def state_dict(self) -> dict:
        return {
            "pairs": list(self._pairs),
            "since_fit": self._since_fit,
            "knots_x": None if self._knots_x is None else self._knots_x.tolist(),
            "knots_y": None if self._knots_y is None else self._knots_y.tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        self._pairs = deque((tuple(p) for p in state["pairs"]), maxlen=self.cfg.window)
        self._since_fit = int(state["since_fit"])
        self._knots_x = None if state["knots_x"] is None else np.asarray(state["knots_x"])
        self._knots_y = None if state["knots_y"] is None else np.asarray(state["knots_y"])


def _zip_same(a: Iterable, b: Iterable):
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"{len(a)} world-model scores but {len(b)} real scores: pairs need one of each")
    return zip(a, b)


def within_group_sums(predicted: Sequence[np.ndarray], real: Sequence[np.ndarray]) -> tuple[float, float, int]:
    """Sums over groups of two or more: squared within-group centred residuals between the scorers, squared
    within-group deviations of `real`, and the number of members.

    Centring removes each group's offset, which GRPO cancels anyway; what is left
    is the part of the disagreement that changes advantages, and the part of the
    real rewards that advantages are made of.
    """
    residual, deviation, n = 0.0, 0.0, 0
    for p, r in zip(predicted, real):
        p, r = np.asarray(p, float), np.asarray(r, float)
        if len(p) < 2:
            continue
        d = (p - p.mean()) - (r - r.mean())
        residual += float((d**2).sum())
        deviation += float(((r - r.mean()) ** 2).sum())
        n += len(p)
    return residual, deviation, n


def within_group_residual(predicted: Sequence[np.ndarray], real: Sequence[np.ndarray]) -> float:
    """Mean within-group centred squared residual between two scorers (see `within_group_sums`)."""
    residual, _, n = within_group_sums(predicted, real)
    return residual / n if n else float("nan")
