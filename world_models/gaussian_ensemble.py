"""A deep ensemble of heteroscedastic MLPs: a learned predictor whose variance means something.

Why this shape. The per-trajectory denoiser weights a WM grade by the inverse of
its predicted variance, so the variance has to rise exactly where the model is
wrong. Two things make a model wrong: outcomes that are noisy in themselves
(aleatoric) and inputs unlike anything it was trained on (epistemic). Each member
therefore has a mean head and a log-variance head trained by Gaussian negative
log-likelihood -- the log-variance head learns the first -- and the members
differ by init seed and bootstrap resample, so their disagreement measures the
second (Lakshminarayanan et al., 2017). The predicted variance is their sum:
mean of member variances + variance of member means.

Why these choices. Targets are rewards in [0, 1], so the log-variance is softly
clamped to [min_var, max_var] (0.25 is the largest variance a [0, 1] variable
can have; the floor stops the NLL from collapsing the variance on training
points). Inputs are used as given -- no per-column standardisation, which would
blow up rare buckets of sparse hashed features. All members train at once as one
batched network with full-batch AdamW for a fixed number of epochs: no data
loader, no early stopping, hence fast and deterministic given the seed. The
bootstrap is applied as per-row multiplicity weights, which is the same loss as
resampling and keeps one shared input matrix.

A fit is ~100 ms and the trainer calls it every step; running it in the
background is the world-model runtime's business (`core/wm_runtime.py`,
`world_model.runtime.background_fit`), not this class's: fits here are
synchronous. It is a drop-in for `RidgeEnsemble` (same methods, same prior
before any fit, same FIFO window).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


Params = dict[str, torch.Tensor]


def _soft_clamp(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """Clamp with non-zero gradients at the bounds, so a saturated head can still recover."""
    x = hi - F.softplus(hi - x)
    return lo + F.softplus(x - lo)


class GaussianEnsemble:
    def __init__(self, members: int = 5, hidden: int = 32, epochs: int = 150, lr: float = 1e-2,
                 weight_decay: float = 1e-3, prior_mean: float = 0.5, prior_var: float = 0.08,
                 min_var: float = 1e-4, max_var: float = 0.25, beta: float = 0.5, prior_scale: float = 1.0,
                 window: int = 4096, seed: int = 0):
        if members < 2:
            raise ValueError("GaussianEnsemble needs members >= 2 (their disagreement is the epistemic variance)")
        if not 0 < min_var < max_var:
            raise ValueError("GaussianEnsemble needs 0 < min_var < max_var")
        self.members, self.hidden, self.epochs = members, hidden, epochs
        self.lr, self.weight_decay = lr, weight_decay
        self.prior_mean, self.prior_var = prior_mean, prior_var
        self.window, self.seed, self.beta, self.prior_scale = window, seed, beta, prior_scale
        self._log_var_bounds = (math.log(min_var), math.log(max_var))
        self._X: list[np.ndarray] = []
        self._y: list[float] = []
        self._params: Params | None = None
        self._fits = 0  # seeds each fit's bootstrap, so a sequence of fits is reproducible

    # ------------------------------------------------------------------ data
    @property
    def n(self) -> int:
        return len(self._y)

    def add(self, X: np.ndarray, y: np.ndarray) -> None:
        rows = np.atleast_2d(np.asarray(X, np.float32))
        self._X.extend(rows)
        self._y.extend(np.asarray(y, float).reshape(-1).tolist())
        self._X, self._y = self._X[-self.window :], self._y[-self.window :]

    # ------------------------------------------------------------------ fitting
    def fit(self) -> None:
        """Refit on the current window (from scratch); a no-op below two rows."""
        if self.n < 2:
            return
        self._fits += 1  # seeds this fit's bootstrap
        self._params = self._train(np.stack(self._X), np.asarray(self._y, np.float32), self._fits)

    def _init(self, dim: int) -> tuple[Params, Params]:
        """Trainable weights and the frozen random prior net, one seed per member."""
        M, H = self.members, self.hidden
        shapes = {"W1": (dim, H), "b1": (H,), "W2": (H, H), "b2": (H,), "W3": (H, 2), "b3": (2,),
                  "P1": (dim, H), "p1": (H,), "P2": (H, 1)}
        fan_in = {"W1": dim, "b1": dim, "W2": H, "b2": H, "W3": H, "b3": H, "P1": dim, "p1": dim, "P2": H}
        out: dict[str, list[torch.Tensor]] = {k: [] for k in shapes}
        for m in range(M):  # each member its own seed: diverse inits are half of the disagreement
            g = torch.Generator().manual_seed(self.seed * 1009 + m)
            for k, shape in shapes.items():
                bound = 1.0 / math.sqrt(fan_in[k])
                out[k].append((torch.rand(shape, generator=g) * 2 - 1) * bound)
        params = {k: torch.stack(v) for k, v in out.items()}
        params["W3"] *= 0.1  # start near the prior rather than at a random offset from it
        params["b3"].zero_()
        prior = {k: params.pop(k) for k in ("P1", "p1", "P2")}
        return params, prior

    def _prior_term(self, params: Params, X: torch.Tensor) -> torch.Tensor:
        """The frozen random prior's contribution to each member's mean, [members, rows].

        Randomised prior functions (Osband et al., 2018): training makes each member cancel
        its own prior on the data, and nowhere else, so off-data the members keep disagreeing
        where plain deep ensembles tend to collapse onto the same extrapolation.
        """
        if not self.prior_scale:
            return torch.zeros(self.members, len(X))
        hp = torch.tanh(torch.einsum("nd,mdh->mnh", X, params["P1"]) + params["p1"][:, None])
        return self.prior_scale * torch.bmm(hp, params["P2"])[..., 0]

    def _forward(self, params: Params, X: torch.Tensor, prior: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Member means and log-variances, each [members, rows]."""
        h = F.silu(torch.einsum("nd,mdh->mnh", X, params["W1"]) + params["b1"][:, None])
        h = F.silu(torch.bmm(h, params["W2"]) + params["b2"][:, None])
        out = torch.bmm(h, params["W3"]) + params["b3"][:, None]
        mean = self.prior_mean + prior + out[..., 0]
        log_var = _soft_clamp(math.log(self.prior_var) + out[..., 1], *self._log_var_bounds)
        return mean, log_var

    def _train(self, X: np.ndarray, y: np.ndarray, fit_index: int) -> Params:
        n = len(y)
        rng = np.random.default_rng([self.seed, fit_index])
        counts = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(self.members)])
        w = torch.as_tensor(counts / n, dtype=torch.float32)  # [members, rows], bootstrap multiplicities
        Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
        trained, prior = self._init(X.shape[1])
        trained = {k: v.requires_grad_() for k, v in trained.items()}
        params = {**trained, **prior}
        opt = torch.optim.AdamW(trained.values(), lr=self.lr, weight_decay=self.weight_decay, fused=True)
        prior_term = self._prior_term(prior, Xt)  # fixed: computed once, not every epoch
        for _ in range(self.epochs):
            mean, log_var = self._forward(params, Xt, prior_term)
            nll = 0.5 * (log_var + (yt - mean) ** 2 * torch.exp(-log_var))
            if self.beta:  # beta-NLL: stops a large variance from switching off the mean's gradient
                nll = nll * torch.exp(self.beta * log_var).detach()
            # summing members is safe: each member's parameters see only its own term
            loss = (w * nll).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"GaussianEnsemble fit diverged (loss {float(loss)}); lower lr")
        return {k: v.detach().clone() for k, v in params.items()}

    # ------------------------------------------------------------------ prediction
    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance per row (aleatoric + epistemic); the prior before any fit."""
        X = np.atleast_2d(np.asarray(X, np.float32))
        params = self._params  # one read: a concurrent swap cannot mix two models
        if params is None:
            return np.full(len(X), self.prior_mean), np.full(len(X), self.prior_var)
        with torch.no_grad():
            Xt = torch.as_tensor(X)
            mean, log_var = self._forward(params, Xt, self._prior_term(params, Xt))
        mean, var = mean.double(), log_var.double().exp()
        return mean.mean(0).numpy(), (var.mean(0) + mean.var(0, unbiased=False)).numpy()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Data window and the weights in use."""
        params = self._params
        return {
            "X": np.stack(self._X) if self._X else np.zeros((0, 0), np.float32),
            "y": np.asarray(self._y, float),
            "params": None if params is None else {k: v.numpy().copy() for k, v in params.items()},
            "fits": self._fits,
        }

    def load_state_dict(self, state: dict) -> None:
        self._X = [np.asarray(x, np.float32) for x in state["X"]]
        self._y = np.asarray(state["y"], float).tolist()
        p = state.get("params")
        self._params = None if p is None else {k: torch.as_tensor(np.asarray(v)) for k, v in p.items()}
        self._fits = int(state.get("fits", 0))
