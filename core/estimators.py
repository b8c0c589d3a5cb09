"""Reward estimators: the modes `real`, `wm` and `wmrl` behind one interface.

All baselines and ablations come from one config key (`estimator.mode` plus the
`debias`/`denoise` switches), so a comparison is a change of one value, never a
second code path. The `wmrl` estimator follows the method's order inside a step:

1. push the step's anchor pairs (WM score, real score) into the debiaser;
2. measure each anchor group's disagreement on the *calibrated* residual;
3. calibrate every WM score with the (possibly refit) map;
4. form group advantages -- anchor groups from real rewards, weighted by the
   denoiser's anchor weight; WM groups from calibrated WM scores.

`rectified` (off by default, an extension beyond the paper) replaces step 4's
anchor handling by a control variate: every group contributes its calibrated WM
advantage, and anchor groups add (A_real - A_wm) / rho. Its expectation over the
anchor draw is the all-real gradient whatever the map's errors, at the price of
variance when rho is small.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from wmrl.core.advantages import AdvantageConfig, group_advantages
from wmrl.core.debias import DebiasConfig, IsotonicDebiaser, within_group_residual
from wmrl.core.denoise import DenoiseConfig, InverseVarianceDenoiser
from wmrl.core.interfaces import RewardEstimator
from wmrl.core.registry import ESTIMATORS
from wmrl.core.types import Estimate, Group


@dataclass
class EstimatorConfig:
    mode: str = "wmrl"
    rectified: bool = False
    debias: DebiasConfig = field(default_factory=DebiasConfig)
    denoise: DenoiseConfig = field(default_factory=DenoiseConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)


def _real(group: Group) -> list[float | None]:
    return [t.real.reward if t.real is not None else None for t in group.trajectories]


def _wm(group: Group) -> list[float | None]:
    return [t.wm.mean if t.wm is not None else None for t in group.trajectories]


def _count_unknown(groups: Sequence[Group], which) -> int:
    return sum(r is None for g in groups for r in which(g))


class _Base(RewardEstimator):
    def __init__(self, cfg: EstimatorConfig, anchor_fraction: float):
        cfg.advantage.validate()
        self.cfg = cfg
        self.anchor_fraction = anchor_fraction

    def _finish(self, groups, rewards, advantages, weights, diag) -> Estimate:
        # weight 0 where no advantage: excluded trajectories never enter the loss
        weights = [
            [w if a is not None else 0.0 for w, a in zip(ws, adv)] for ws, adv in zip(weights, advantages)
        ]
        n = max(len(groups), 1)
        used = [r for rs in rewards for r in rs if r is not None]
        true = [r for g in groups for r in _real(g) if r is not None]
        diag.setdefault("anchor_fraction", sum(g.anchor for g in groups) / n)
        diag.setdefault("calibrated", 0.0)
        diag.setdefault("bias_reduction", float("nan"))
        diag.setdefault("anchor_weight", 1.0)
        diag["reward_estimated"] = float(np.mean(used)) if used else float("nan")
        diag["reward_real_anchors"] = float(np.mean(true)) if true else float("nan")
        diag["unknown_real"] = float(_count_unknown([g for g in groups if g.anchor], _real))
        diag["unknown_wm"] = float(_count_unknown(groups, _wm)) if self.uses_world_model else 0.0
        diag["excluded"] = float(sum(a is None for adv in advantages for a in adv))
        return Estimate(rewards, advantages, weights, diag)

    def _single_source(self, groups: Sequence[Group], grades) -> Estimate:
        """Plain GRPO on one scorer's grades, every trajectory weighted 1."""
        rewards = [grades(g) for g in groups]
        adv = [group_advantages(r, self.cfg.advantage) for r in rewards]
        return self._finish(groups, rewards, adv, [[1.0] * len(r) for r in rewards], {})


@ESTIMATORS.register("real")
class RealEstimator(_Base):
    """Standard GRPO on real execution: every group is graded by the RealEnv."""

    uses_world_model = False

    def __init__(self, cfg: EstimatorConfig, anchor_fraction: float = 1.0):
        super().__init__(cfg, 1.0)

    def estimate(self, groups: Sequence[Group]) -> Estimate:
        return self._single_source(groups, _real)


@ESTIMATORS.register("wm")
class WorldModelEstimator(_Base):
    """Pure world model, no anchors and no corrections (the lower baseline)."""

    def __init__(self, cfg: EstimatorConfig, anchor_fraction: float = 0.0):
        super().__init__(cfg, 0.0)

    def estimate(self, groups: Sequence[Group]) -> Estimate:
        return self._single_source(groups, _wm)


@ESTIMATORS.register("wmrl")
class WMRLEstimator(_Base):
    """World-model grades corrected by Online Debiasing and Inverse-Variance Denoising."""

    def __init__(self, cfg: EstimatorConfig, anchor_fraction: float = 0.1):
        if not 0.0 < anchor_fraction <= 1.0:
            raise ValueError("mode wmrl needs anchors.fraction in (0, 1]; use mode wm for no anchors")
        super().__init__(cfg, anchor_fraction)
        self.debiaser = IsotonicDebiaser(cfg.debias)
        self.denoiser = InverseVarianceDenoiser(cfg.denoise)

    def _calibrate(self, scores: list[float | None]) -> list[float | None]:
        if not self.cfg.debias.enabled:
            return list(scores)
        known = [s for s in scores if s is not None]
        mapped = iter(self.debiaser(known).tolist())
        return [next(mapped) if s is not None else None for s in scores]

    def estimate(self, groups: Sequence[Group]) -> Estimate:
        diag: dict[str, float] = {}
        anchors = [g for g in groups if g.anchor]
        paired = []  # per anchor group: (wm, real) arrays over members graded by both
        for g in anchors:
            both = [(w, r) for w, r in zip(_wm(g), _real(g)) if w is not None and r is not None]
            if both:
                paired.append((np.array([w for w, _ in both]), np.array([r for _, r in both])))

        # bias diagnostic out of sample: the map as it stood before this step's pairs
        if paired and self.cfg.debias.enabled:
            before = within_group_residual([w for w, _ in paired], [r for _, r in paired])
            after = within_group_residual([self.debiaser(w) for w, _ in paired], [r for _, r in paired])
            if np.isfinite(before) and before > 0:
                diag["bias_reduction"] = 1.0 - after / before

        # 1. pairs into the debiaser
        if self.cfg.debias.enabled:
            for w, r in paired:
                self.debiaser.push(w, r)
        # 2. disagreement on the calibrated residual
        if self.cfg.denoise.enabled:
            for w, r in paired:
                cal = self.debiaser(w) if self.cfg.debias.enabled else w
                self.denoiser.observe(cal, r)
        anchor_w = self.denoiser.weight if self.cfg.denoise.enabled else 1.0

        # 3. calibrate all WM scores; 4. advantages
        rewards, advantages, weights = [], [], []
        realized = len(anchors) / max(len(groups), 1)
        for g in groups:
            wm_cal = self._calibrate(_wm(g))
            if g.anchor and not self.cfg.rectified:
                r = _real(g)
                rewards.append(r)
                advantages.append(group_advantages(r, self.cfg.advantage))
                weights.append([anchor_w] * len(r))
                continue
            a_wm = group_advantages(wm_cal, self.cfg.advantage)
            if g.anchor:  # rectified: control-variate correction from the real grade
                a_real = group_advantages(_real(g), self.cfg.advantage)
                a_wm = [
                    None if aw is None or ar is None else aw + (ar - aw) / realized
                    for aw, ar in zip(a_wm, a_real)
                ]
            rewards.append(wm_cal)
            advantages.append(a_wm)
            weights.append(self._wm_weights(g))
        diag["calibrated"] = float(self.cfg.debias.enabled and self.debiaser.fitted)
        diag["anchor_weight"] = anchor_w
        diag["disagreement_ema"] = self.denoiser.ema if self.denoiser.ema is not None else float("nan")
        diag["anchor_pairs_seen"] = float(self.debiaser.n_pairs)
        return self._finish(groups, rewards, advantages, weights, diag)

    def _wm_weights(self, g: Group) -> list[float]:
        if not (self.cfg.denoise.enabled and self.cfg.denoise.per_trajectory):
            return [1.0] * len(g.trajectories)
        var = [t.wm.var if t.wm is not None and t.wm.var is not None else np.nan for t in g.trajectories]
        return self.denoiser.trajectory_weights(np.array(var)).tolist()

    def state_dict(self) -> dict:
        return {"debias": self.debiaser.state_dict(), "denoise": self.denoiser.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.debiaser.load_state_dict(state["debias"])
        self.denoiser.load_state_dict(state["denoise"])


def build_estimator(cfg: EstimatorConfig, anchor_fraction: float) -> RewardEstimator:
    """The estimator for `cfg.mode` (an unknown mode lists the registered ones)."""
    return ESTIMATORS.get(cfg.mode)(cfg, anchor_fraction)
