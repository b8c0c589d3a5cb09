"""Inverse-Variance Denoising: weight the real stream by how noisy the WM stream is.

Two streams estimate the same policy gradient: anchor groups graded by the real
environment (variance V_E) and groups graded by the world model (V_WM). Their
minimum-variance fusion weights each by the inverse of its variance. We model
V_WM = (1 + c*s^2) * V_E, where s^2 is the world model's disagreement with the
real scores on anchor groups, measured on the *calibrated* residual (after the
debiaser) so that bias the debiaser already removed is not counted as noise:

    s^2 = mean_i[((d_i - mean d) - (s_i - mean s))^2] / Var(s)

with d the calibrated WM score and s the real score; groups whose real scores
are all equal carry no information and are skipped. s^2 is smoothed by an
exponentially weighted mean with a half-life counted in groups, whose weights
sum to one from the first group on (a zero-started EMA divided by its mass):
when the scale freezes it is close to the plain mean of the warm-up groups. (An
EMA started at the first group's value gave that one group most of the weight
at the freeze; on AutoResearch a first s^2 of 0.03 against a level near 0.6
pinned w at `w_max` for the whole run.) The fusion then amounts to multiplying the
anchor advantages by w = clip(1 + c*s^2, 1, w_max). The scale c is set once,
after `warmup` groups, so that w = `target_weight` at that moment, and frozen:
from then on w follows how the disagreement moves, not the reward's units. A
disagreement below `min_disagreement` at the end of warm-up (a world model that
agrees with the real scores to within 1% of their variance, by default) defers
the freeze: a scale set from a near-zero disagreement would explode and pin w at
`w_max` on the first ordinary group; until then w stays 1.

Optionally, when the world model reports a variance per trajectory, WM-graded
trajectories are weighted relative to each other by the same model,
(1 + c*s^2) / (1 + c*s^2 * v_i / mean v): a confident prediction counts more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DenoiseConfig:
    enabled: bool = True
    half_life: float = 16.0
    warmup: int = 8
    target_weight: float = 2.0
    w_max: float = 4.0
    per_trajectory: bool = False
    min_disagreement: float = 0.01  # s^2 the scale may be frozen at, at the least (see the module docstring)

    def validate(self) -> None:
        if self.half_life <= 0:
            raise ValueError("estimator.denoise.half_life must be > 0 (groups)")
        if self.warmup < 1:
            raise ValueError("estimator.denoise.warmup must be >= 1 (groups)")
        if not 1.0 <= self.target_weight <= self.w_max:
            raise ValueError("estimator.denoise needs 1 <= target_weight <= w_max")
        if not self.min_disagreement > 0:
            raise ValueError("estimator.denoise.min_disagreement must be > 0")


def disagreement(calibrated: np.ndarray, real: np.ndarray) -> float | None:
    """s^2 for one anchor group, or None when the real scores carry no spread."""
    d, s = np.asarray(calibrated, float), np.asarray(real, float)
    if d.shape != s.shape:
        raise ValueError(f"denoiser: {d.shape} calibrated scores but {s.shape} real scores")
    if not (np.all(np.isfinite(d)) and np.all(np.isfinite(s))):
        bad = next(float(x) for x in np.concatenate([d, s]) if not np.isfinite(x))
        raise ValueError(f"denoiser: the score {bad!r} is not finite; pass finite scores (leave unknown grades out)")
    if len(s) < 2:
        return None
    var_s = float(s.var())
    if var_s <= 1e-12:
        return None
    resid = (d - d.mean()) - (s - s.mean())
    return float((resid**2).mean() / var_s)


class InverseVarianceDenoiser:
    """Tracks WM/real disagreement and turns it into the anchor weight."""

    def __init__(self, cfg: DenoiseConfig | None = None):
        self.cfg = cfg or DenoiseConfig()
        self.cfg.validate()
        self._alpha = 1.0 - 0.5 ** (1.0 / self.cfg.half_life)
        self._sum = 0.0  # decayed sum of alpha * s^2
        self._mass = 0.0  # decayed sum of alpha: the weights' total, 1 - (1 - alpha)^groups
        self.groups_seen = 0
        self.scale: float | None = None  # c; None until frozen after warm-up

    def observe(self, calibrated: np.ndarray, real: np.ndarray) -> float | None:
        """Feed one anchor group; returns its s^2 (None if skipped)."""
        s2 = disagreement(calibrated, real)
        if s2 is None:
            return None
        self._sum = (1 - self._alpha) * self._sum + self._alpha * s2
        self._mass = (1 - self._alpha) * self._mass + self._alpha
        self.groups_seen += 1
        if self.scale is None and self.groups_seen >= self.cfg.warmup and self.ema >= self.cfg.min_disagreement:
            self.scale = (self.cfg.target_weight - 1.0) / self.ema
        return s2

    @property
    def ema(self) -> float | None:
        """The smoothed s^2: the exponentially weighted mean of the groups seen (None before the first)."""
        return self._sum / self._mass if self._mass > 0 else None

    @property
    def weight(self) -> float:
        """Anchor-group advantage multiplier: exactly 1 until the scale is frozen."""
        if self.scale is None or self.ema is None:
            return 1.0
        return float(np.clip(1.0 + self.scale * self.ema, 1.0, self.cfg.w_max))

    def trajectory_weights(self, variances: np.ndarray) -> np.ndarray:
        """Relative weights of WM-graded trajectories from their predicted variances."""
        v = np.asarray(variances, float)
        if not self.cfg.per_trajectory or self.scale is None or len(v) == 0 or not np.all(np.isfinite(v)):
            return np.ones_like(v)
        mean_v = v.mean()
        if mean_v <= 0:
            return np.ones_like(v)
        k = self.scale * self.ema
        return np.clip((1.0 + k) / (1.0 + k * v / mean_v), 1.0 / self.cfg.w_max, self.cfg.w_max)

    def state_dict(self) -> dict:
        return {"sum": self._sum, "mass": self._mass, "groups_seen": self.groups_seen, "scale": self.scale}

    def load_state_dict(self, state: dict) -> None:
        self.groups_seen, self.scale = int(state["groups_seen"]), state["scale"]
        if "mass" in state:
            self._sum, self._mass = float(state["sum"]), float(state["mass"])
        else:  # a checkpoint from before the weighted mean: its EMA, at the mass its group count gives
            self._mass = 1.0 - (1.0 - self._alpha) ** self.groups_seen
            self._sum = (state["ema"] or 0.0) * self._mass
