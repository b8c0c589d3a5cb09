"""Group-relative advantages (GRPO) over groups whose grades may be missing.

A trajectory whose grade is unknown (sandbox infrastructure failure, an
unparsable world-model reply) is excluded, never scored 0: zero is a confident
claim that the attempt was bad, and would push the policy away from it. Groups
with fewer than `min_graded` graded trajectories carry no relative signal and
are skipped. Standardizing by the group's standard deviation is a switch: on,
it is GRPO; off, only centring (scale-aware, "Dr. GRPO" style). The standard
deviation is the population one by default (divide by n, as the method's
reference does); `std: sample` divides by n - 1, as TRL's GRPOTrainer does
(torch's default `std`), and TRL adds eps = 1e-4 where we add 1e-6.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


#: how the group standard deviation is taken: "population" divides by n, "sample" by n - 1 (Bessel)
STD_CONVENTIONS = {"population": 0, "sample": 1}


@dataclass
class AdvantageConfig:
    standardize: bool = True
    min_graded: int = 2
    eps: float = 1e-6
    std: str = "population"  # or "sample" (TRL's convention)

    def validate(self) -> None:
        if self.min_graded < 2:
            raise ValueError("estimator.advantage.min_graded must be >= 2: one trajectory has no group baseline")
        if self.std not in STD_CONVENTIONS:
            raise ValueError(f"estimator.advantage.std must be one of {', '.join(STD_CONVENTIONS)}, got {self.std!r}")
        if not self.eps >= 0:
            raise ValueError(f"estimator.advantage.eps must be >= 0, got {self.eps!r}")


def group_advantages(rewards: Sequence[float | None], cfg: AdvantageConfig) -> list[float | None]:
    """Advantages for one group; None where the grade is unknown or the group is skipped."""
    graded = [i for i, r in enumerate(rewards) if r is not None]
    out: list[float | None] = [None] * len(rewards)
    if len(graded) < cfg.min_graded:
        return out
    r = np.array([rewards[i] for i in graded], dtype=float)
    a = r - r.mean()
    if cfg.standardize:
        a = a / (r.std(ddof=STD_CONVENTIONS[cfg.std]) + cfg.eps)
    for i, ai in zip(graded, a):
        out[i] = float(ai)
    return out


def signal_cosine(
    advantages: Sequence[Sequence[float | None]],
    weights: Sequence[Sequence[float]],
    oracle_advantages: Sequence[Sequence[float | None]],
) -> float:
    """Cosine between what the update pushes on each trajectory (weight x advantage, 0 where
    excluded) and the advantages the true rewards would give.

    A diagnostic for domains whose true reward is free (synthetic): it says how far the
    estimated gradient signal points where real execution on every trajectory would, which
    is what the corrections are meant to improve. Trajectories without a true advantage
    are left out; NaN when nothing is left.
    """
    est, ref = [], []
    for advs, ws, oracle in zip(advantages, weights, oracle_advantages):
        for a, w, o in zip(advs, ws, oracle):
            if o is not None:
                est.append(0.0 if a is None else w * a)
                ref.append(o)
    e, r = np.array(est), np.array(ref)
    norm = float(np.linalg.norm(e) * np.linalg.norm(r))
    return float(e @ r / norm) if norm > 0 else float("nan")
