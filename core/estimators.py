"""Reward estimators: the modes `real`, `wm`, `wmrl` and `fused` behind one interface.

All baselines and ablations come from one config key (`estimator.mode` plus the
`debias`/`denoise` switches), so a comparison is a change of one value, never a
second code path. The `wmrl` estimator follows the method's order inside a step:

1. push the step's anchor pairs (WM score, real score) into the debiaser;
2. measure each anchor group's disagreement on the *calibrated* residual;
3. calibrate every WM score with the (possibly refit) map;
4. form group advantages -- anchor groups from real rewards, weighted by the
   denoiser's anchor weight; WM groups from calibrated WM scores.

`rectified` (off by default, an extension beyond the paper) replaces step 4's
anchor handling by a control variate (prediction-powered inference): every
trajectory contributes lambda * A_wm, and the trajectories of anchor groups add
(T - lambda * A_wm) / rho, where T is the all-real advantage (0 where the real
grade is unknown or the group has too few real grades: the all-real update
leaves those out) and rho the realized anchor fraction, each group's inclusion
probability. Its expectation over the anchor draw is T for every trajectory,
whatever the map's errors and whatever lambda, provided that neither depends on
this step's draw: so the WM scores are calibrated with the map as it stood
before this step's pairs, lambda comes from earlier steps' anchors, every
trajectory keeps its weight whatever the draw (the loss's normaliser is then
fixed too), and a missing advantage enters as 0 rather than dropping out.
lambda = 1 is the plain difference estimator; `tune_lambda` estimates the
variance-minimising lambda = sum(T * A_wm) / sum(A_wm^2) (PPI++), smoothed over
steps with half-life `lambda_half_life` and clipped to [0, 1]. Proof and
tests: docs/method.md, tests/test_estimators.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from wmrl.core.advantages import AdvantageConfig, group_advantages
from wmrl.core.debias import DebiasConfig, IsotonicDebiaser, within_group_sums
from wmrl.core.denoise import DenoiseConfig, InverseVarianceDenoiser
from wmrl.core.interfaces import RewardEstimator
from wmrl.core.registry import ESTIMATORS
from wmrl.core.types import Estimate, Group
from wmrl.core.validation import validate_config


@dataclass
class EstimatorConfig:
    mode: str = "wmrl"
    rectified: bool = False
    tune_lambda: bool = False  # rectified only: PPI++'s power-tuned lambda instead of 1
    lambda_half_life: float = 4.0  # steps, for the tuned lambda's running sums
    #: mode fused: the share of the world model's dense score a failed real episode gets (success stays 1)
    fusion_weight: float = 0.5
    debias: DebiasConfig = field(default_factory=DebiasConfig)
    denoise: DenoiseConfig = field(default_factory=DenoiseConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)

    def validate(self) -> None:
        if self.mode not in ESTIMATORS:
            raise ValueError(f"estimator.mode: unknown mode {self.mode!r}; choose one of {', '.join(ESTIMATORS.names())}")
        if not self.lambda_half_life > 0:
            raise ValueError(f"estimator.lambda_half_life must be > 0 (steps), got {self.lambda_half_life!r}")
        if not 0.0 <= self.fusion_weight <= 1.0:
            raise ValueError(f"estimator.fusion_weight must be in [0, 1], got {self.fusion_weight!r}")


@dataclass(frozen=True)
class ModePlan:
    """What a mode means for the loop: the anchor fraction rho it runs at, and whether a WM grades anything."""

    anchor_fraction: float
    uses_world_model: bool


def plan_mode(cfg: EstimatorConfig, configured_fraction: float) -> ModePlan:
    """Resolve `estimator.mode` against `anchors.fraction`, the one place a mode fixes or requires rho."""
    cls = ESTIMATORS.get(cfg.mode)
    rho = configured_fraction if cls.fixed_anchor_fraction is None else cls.fixed_anchor_fraction
    if cls.needs_anchors and not 0.0 < rho <= 1.0:
        raise ValueError(f"anchors.fraction is {rho:g} in mode {cfg.mode}: it needs an anchor stream, "
                         "anchors.fraction in (0, 1]; use estimator.mode=wm for none")
    return ModePlan(rho, cls.uses_world_model)


def _real(group: Group) -> list[float | None]:
    return [t.real.reward if t.real is not None else None for t in group.trajectories]


def _wm(group: Group) -> list[float | None]:
    return [t.wm.mean if t.wm is not None else None for t in group.trajectories]


def _count_unknown(groups: Sequence[Group], which) -> int:
    return sum(r is None for g in groups for r in which(g))


class _Base(RewardEstimator):
    def __init__(self, cfg: EstimatorConfig, plan: ModePlan):
        self.cfg = cfg
        self.anchor_fraction = plan.anchor_fraction

    def _finish(self, groups, rewards, advantages, weights, diag) -> Estimate:
        # weight 0 where no advantage (excluded) or the group only calibrates: neither enters the loss
        weights = [
            [w if a is not None and g.train else 0.0 for w, a in zip(ws, adv)]
            for g, ws, adv in zip(groups, weights, advantages)
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
    fixed_anchor_fraction = 1.0

    def estimate(self, groups: Sequence[Group]) -> Estimate:
        return self._single_source(groups, _real)


@ESTIMATORS.register("wm")
class WorldModelEstimator(_Base):
    """Pure world model, no anchors and no corrections (the lower baseline)."""

    fixed_anchor_fraction = 0.0

    def estimate(self, groups: Sequence[Group]) -> Estimate:
        return self._single_source(groups, _wm)


@ESTIMATORS.register("fused")
class FusedEstimator(_Base):
    """Every group real, the sparse real grade fused with the world model's dense score of the same episode.

    reward = real + (1 - real) * fusion_weight * score, with score in [0, 1]: a
    success keeps its 1, a failure gets partial credit for how far it got (the
    seed method's VLA track: a progress model on real frames). A missing score
    leaves the real grade alone; an unknown real grade stays unknown.
    """

    fixed_anchor_fraction = 1.0

    def estimate(self, groups: Sequence[Group]) -> Estimate:
        beta = self.cfg.fusion_weight

        def fused(group: Group) -> list[float | None]:
            out: list[float | None] = []
            for real, score in zip(_real(group), _wm(group)):
                if real is None or score is None:
                    out.append(real)
                else:
                    out.append(real + (1.0 - real) * beta * min(max(score, 0.0), 1.0))
            return out

        return self._single_source(groups, fused)


@ESTIMATORS.register("wmrl")
class WMRLEstimator(_Base):
    """World-model grades corrected by Online Debiasing and Inverse-Variance Denoising."""

    needs_anchors = True

    def __init__(self, cfg: EstimatorConfig, plan: ModePlan):
        super().__init__(cfg, plan)
        self.debiaser = IsotonicDebiaser(cfg.debias)
        self.denoiser = InverseVarianceDenoiser(cfg.denoise)
        self._power = [0.0, 0.0]  # running sum(T * A_wm), sum(A_wm^2) over earlier steps' anchors
        self._bias = [0.0, 0.0]  # decayed squared within-group residuals out of sample: raw, calibrated

    @property
    def rectified_lambda(self) -> float:
        num, den = self._power
        if not (self.cfg.tune_lambda and den > 0):
            return 1.0
        return float(np.clip(num / den, 0.0, 1.0))

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

        # out of sample, the map as it stood before this step's pairs: how much the map removes, and what the
        # calibrated scores still miss of the real rewards' within-group variation (the anchor budget's input)
        if paired:
            real = [r for _, r in paired]
            calibrated = [self.debiaser(w) if self.cfg.debias.enabled else w for w, _ in paired]
            residual, deviation, n = within_group_sums(calibrated, real)
            diag.update(anchor_oos_sq_residual=residual, anchor_sq_deviation=deviation, anchor_oos_pairs=float(n))
            raw, _, _ = within_group_sums([w for w, _ in paired], real)
            if self.cfg.debias.enabled and raw > 0:
                diag["bias_reduction"] = 1.0 - residual / raw
            # the same over decayed sums: one step's 8 pairs make the per-step ratio swing far both ways
            keep = 0.5 ** (1.0 / self.cfg.debias.report_half_life)
            self._bias = [keep * self._bias[0] + raw, keep * self._bias[1] + residual]
        if self.cfg.debias.enabled and self._bias[0] > 0:
            diag["bias_reduction_smoothed"] = 1.0 - self._bias[1] / self._bias[0]

        # rectified: the map as it stood before this step's pairs, so the draw cannot move it
        out_of_sample = [self._calibrate(_wm(g)) for g in groups] if self.cfg.rectified else None
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
        if self.cfg.rectified:
            rewards, advantages, weights = self._rectified(groups, out_of_sample, diag)
        else:
            rewards, advantages, weights = self._mixed(groups, anchor_w)
        diag["calibrated"] = float(self.cfg.debias.enabled and self.debiaser.fitted)
        diag["anchor_weight"] = anchor_w
        diag["disagreement_ema"] = self.denoiser.ema if self.denoiser.ema is not None else float("nan")
        diag["anchor_pairs_seen"] = float(self.debiaser.n_pairs)
        return self._finish(groups, rewards, advantages, weights, diag)

    def _mixed(self, groups: Sequence[Group], anchor_w: float):
        """Anchor groups from real rewards (weighted by the denoiser), the others from calibrated WM scores."""
        rewards, advantages, weights = [], [], []
        for g in groups:
            r = _real(g) if g.anchor else self._calibrate(_wm(g))
            rewards.append(r)
            advantages.append(group_advantages(r, self.cfg.advantage))
            weights.append([anchor_w] * len(r) if g.anchor else self._wm_weights(g))
        return rewards, advantages, weights

    def _rectified(self, groups: Sequence[Group], calibrated: list[list[float | None]], diag: dict):
        """lambda * A_wm + [anchor] (T - lambda * A_wm) / rho, every trajectory kept (see the module docstring)."""
        rho = sum(g.anchor for g in groups) / max(len(groups), 1)
        lam = self.rectified_lambda
        advantages, num, den = [], 0.0, 0.0
        for g, cal in zip(groups, calibrated):
            a_wm = [0.0 if a is None else a for a in group_advantages(cal, self.cfg.advantage)]
            if not g.anchor:
                advantages.append([lam * a for a in a_wm])
                continue
            target = [0.0 if a is None else a for a in group_advantages(_real(g), self.cfg.advantage)]
            advantages.append([lam * a + (t - lam * a) / rho for a, t in zip(a_wm, target)])
            num += sum(t * a for a, t in zip(a_wm, target))
            den += sum(a * a for a in a_wm)
        if any(g.anchor for g in groups):  # the next step's lambda: this step's draw never sets its own
            keep = 0.5 ** (1.0 / self.cfg.lambda_half_life)
            self._power = [keep * self._power[0] + num, keep * self._power[1] + den]
        diag["rectified_lambda"] = lam
        return list(calibrated), advantages, [self._wm_weights(g) for g in groups]

    def _wm_weights(self, g: Group) -> list[float]:
        if not (self.cfg.denoise.enabled and self.cfg.denoise.per_trajectory):
            return [1.0] * len(g.trajectories)
        var = [t.wm.var if t.wm is not None and t.wm.var is not None else np.nan for t in g.trajectories]
        return self.denoiser.trajectory_weights(np.array(var)).tolist()

    def state_dict(self) -> dict:
        return {"debias": self.debiaser.state_dict(), "denoise": self.denoiser.state_dict(), "power": list(self._power),
                "bias": list(self._bias)}

    def load_state_dict(self, state: dict) -> None:
        self.debiaser.load_state_dict(state["debias"])
        self.denoiser.load_state_dict(state["denoise"])
        self._power = list(state.get("power", [0.0, 0.0]))  # checkpoints from before lambda tuning: no history
        self._bias = list(state.get("bias", [0.0, 0.0]))  # nor from before the smoothed diagnostic


def build_estimator(cfg: EstimatorConfig, configured_fraction: float) -> RewardEstimator:
    """The estimator for `cfg.mode` at the anchor fraction the mode resolves to (see `plan_mode`)."""
    validate_config(cfg)
    return ESTIMATORS.get(cfg.mode)(cfg, plan_mode(cfg, configured_fraction))
