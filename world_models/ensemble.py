"""A bootstrap ensemble of ridge regressors: a fast learned predictor with uncertainty.

Each member is fit on a bootstrap resample of the data seen so far; their
disagreement is the epistemic part of the variance (large far from the data),
the members' residual variance the aleatoric part. Closed-form ridge fits in
milliseconds, so the model can be refit every training step from the anchor
stream without blocking it. The neural heteroscedastic ensemble of the
world-models issue replaces this where a better model pays for itself.
"""

from __future__ import annotations

import numpy as np


class RidgeEnsemble:
    def __init__(self, members: int = 8, l2: float = 1.0, prior_mean: float = 0.5, prior_var: float = 0.08,
                 window: int = 4096, seed: int = 0):
        self.members, self.l2 = members, l2
        self.prior_mean, self.prior_var = prior_mean, prior_var
        self.window = window
        self.rng = np.random.default_rng(seed)
        self._X: list[np.ndarray] = []
        self._y: list[float] = []
        self._weights: np.ndarray | None = None  # [members, dim + 1]
        self._noise = prior_var

    @property
    def n(self) -> int:
        return len(self._y)

    def add(self, X: np.ndarray, y: np.ndarray) -> None:
        self._X.extend(np.atleast_2d(X))
        self._y.extend(np.asarray(y, float).tolist())
        self._X, self._y = self._X[-self.window :], self._y[-self.window :]

    def fit(self) -> None:
        if self.n < 2:
            return
        X = np.hstack([np.asarray(self._X), np.ones((self.n, 1))])
        y = np.asarray(self._y) - self.prior_mean  # shrink toward the prior, not toward 0
        reg = self.l2 * np.eye(X.shape[1])
        reg[-1, -1] = 1e-6
        ws, resid = [], []
        for _ in range(self.members):
            idx = self.rng.integers(0, self.n, self.n)
            w = np.linalg.solve(X[idx].T @ X[idx] + reg, X[idx].T @ y[idx])
            ws.append(w)
            resid.append(np.mean((X @ w - y) ** 2))
        self._weights = np.asarray(ws)
        self._noise = float(np.mean(resid))

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance per row; the prior before any fit."""
        X = np.atleast_2d(X)
        if self._weights is None:
            return np.full(len(X), self.prior_mean), np.full(len(X), self.prior_var)
        Xb = np.hstack([X, np.ones((len(X), 1))])
        preds = Xb @ self._weights.T + self.prior_mean  # [n, members]
        return preds.mean(1), preds.var(1) + self._noise

    def state_dict(self) -> dict:
        return {"X": np.asarray(self._X), "y": np.asarray(self._y)}

    def load_state_dict(self, state: dict) -> None:
        self._X = [np.asarray(x) for x in state["X"]]
        self._y = np.asarray(state["y"], float).tolist()
        self.fit()
