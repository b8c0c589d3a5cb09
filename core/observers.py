"""Step observers: diagnostics that see every step's groups and estimate, and never change training.

An observer is a callable `(step, groups, estimate) -> dict`; the trainer calls
each after the update, outside the step's wall-clock, and logs what it returns
with the step's metrics. One that raises is counted (`observer_errors`), not
fatal. The trainer installs `OracleObserver` by default: where the domain's
true reward is free (the synthetic domains), it measures how well the update's
signal agrees with the update the truth would make, which is what the
benchmarks score estimators by.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from wmrl.core.advantages import AdvantageConfig, group_advantages, signal_cosine
from wmrl.core.domain import Domain
from wmrl.core.types import Estimate, Group

#: called after each step with (step, groups, estimate); what it returns is logged with the step's metrics
StepObserver = Callable[[int, list[Group], Estimate], dict]


class OracleObserver:
    """`reward_oracle` (the true mean reward) and `advantage_cosine_oracle` (NaN where the truth is not free)."""

    def __init__(self, domain: Domain, advantage: AdvantageConfig):
        self.domain, self.advantage = domain, advantage

    def __call__(self, step: int, groups: list[Group], est: Estimate) -> dict:
        oracle = [[self.domain.oracle_reward(t) for t in g.trajectories] for g in groups]
        vals = [v for vs in oracle for v in vs if v is not None]
        if not vals:
            return {"reward_oracle": float("nan"), "advantage_cosine_oracle": float("nan")}
        ref = [group_advantages(vs, self.advantage) for vs in oracle]
        return {"reward_oracle": float(np.mean(vals)),
                "advantage_cosine_oracle": signal_cosine(est.advantages, est.weights, ref)}
