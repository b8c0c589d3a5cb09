"""Recalibrating a learned world model's variance on outcomes it had not seen yet.

An ensemble's spread is a ranking of confidence, not a calibrated variance: on
code outcomes (many exact failures at 0, a long tail of scores) bootstrap ridge
or NLL members are typically over- or under-confident by a constant factor.
Each step's anchors arrive *before* the model is fitted on them, so their
standardised residuals z = (real - mean) / sd are honest out-of-sample draws.
The calibrator keeps a window of |z| and scales every variance so that the
central interval at `level` covers that share of the window. A single factor
keeps the ordering of the variances -- the part the denoiser's per-trajectory
weights use -- and fixes their scale, which is what interval coverage needs.
"""

from __future__ import annotations

from collections import deque
from statistics import NormalDist

import numpy as np


class VarianceCalibrator:
    def __init__(self, level: float = 0.8, window: int = 512, min_points: int = 16,
                 bounds: tuple[float, float] = (1e-2, 1e2)):
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        self.level, self.min_points, self.bounds = level, min_points, bounds
        self._z = NormalDist().inv_cdf(0.5 + level / 2)
        self._abs_z: deque[float] = deque(maxlen=window)

    @property
    def scale(self) -> float:
        """The variance multiplier; 1 until `min_points` out-of-sample residuals were seen."""
        if len(self._abs_z) < self.min_points:
            return 1.0
        q = float(np.quantile(np.asarray(self._abs_z), self.level))
        return float(np.clip((q / self._z) ** 2, *self.bounds))

    def observe(self, mean: np.ndarray, var: np.ndarray, real: np.ndarray) -> None:
        """Record residuals of predictions made *before* the model was fitted on `real`."""
        sd = np.sqrt(np.maximum(np.asarray(var, float), 1e-12))
        z = np.abs(np.asarray(real, float) - np.asarray(mean, float)) / sd
        self._abs_z.extend(z[np.isfinite(z)].tolist())

    def apply(self, var: np.ndarray) -> np.ndarray:
        return np.asarray(var, float) * self.scale

    def state_dict(self) -> dict:
        return {"abs_z": list(self._abs_z)}

    def load_state_dict(self, state: dict) -> None:
        self._abs_z.clear()
        self._abs_z.extend(state.get("abs_z", []))
