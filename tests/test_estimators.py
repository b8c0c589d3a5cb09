"""The estimator modes and the order of operations inside one WMRL step."""

import numpy as np
import pytest

from wmrl.core.estimators import EstimatorConfig, build_estimator
from wmrl.core.types import Group, Outcome, Prediction, Task, Trajectory


def group(gid, real, wm, anchor):
    trajs = []
    for r, w in zip(real, wm):
        t = Trajectory(task=Task(gid))
        t.real = None if r is ... else Outcome(r, "ok" if r is not None else "infra")
        t.wm = Prediction(w) if w is not None else Prediction(None, error="unparsable")
        trajs.append(t)
    return Group(gid, Task(gid), trajs, anchor=anchor)


def test_real_mode_uses_real_grades_and_excludes_unknown():
    est = build_estimator(EstimatorConfig(mode="real"), 0.1)
    assert est.anchor_fraction == 1.0 and not est.uses_world_model
    e = est.estimate([group("a", [0.2, None, 0.8], [0.9, 0.9, 0.1], True)])
    assert e.rewards[0] == [0.2, None, 0.8]
    assert e.advantages[0][1] is None and e.weights[0][1] == 0.0
    assert e.advantages[0][0] < 0 < e.advantages[0][2]


def test_wm_mode_never_turns_an_unknown_grade_into_zero():
    est = build_estimator(EstimatorConfig(mode="wm"), 0.5)
    assert est.anchor_fraction == 0.0
    e = est.estimate([group("a", [...] * 3, [0.3, None, 0.5], False)])
    assert e.rewards[0][1] is None and e.advantages[0][1] is None
    assert e.diagnostics["unknown_wm"] == 1.0
    assert sum(a for a in e.advantages[0] if a is not None) == pytest.approx(0.0)


def _step(rng, n_groups=8, g=8, anchors=(0, 1), distort=lambda r: r**3, noise=0.0):
    out = []
    for i in range(n_groups):
        real = np.clip(rng.uniform(0.2, 0.8) + 0.2 * rng.normal(size=g), 0, 1)
        wm = np.clip(distort(real) + noise * rng.normal(size=g), 0, 1)
        out.append(group(f"g{i}", real.tolist(), wm.tolist(), i in anchors))
    return out


def test_wmrl_order_pairs_first_then_calibrate_all_scores_in_the_same_step():
    cfg = EstimatorConfig(mode="wmrl")
    cfg.debias.min_pairs = 16  # exactly this step's two anchor groups of 8
    est = build_estimator(cfg, 0.25)
    groups = _step(np.random.default_rng(0))
    e = est.estimate(groups)
    assert e.diagnostics["calibrated"] == 1.0
    raw = [t.wm.mean for t in groups[5].trajectories]
    assert e.rewards[5] == pytest.approx(est.debiaser(raw).tolist())  # WM groups: calibrated
    assert e.rewards[0] == [t.real.reward for t in groups[0].trajectories]  # anchors: real
    assert e.diagnostics["anchor_fraction"] == 0.25


def test_anchor_weight_multiplies_anchor_groups_only():
    cfg = EstimatorConfig(mode="wmrl")
    cfg.denoise.warmup = 2
    est = build_estimator(cfg, 0.25)
    e = est.estimate(_step(np.random.default_rng(1), noise=0.2))
    w = e.diagnostics["anchor_weight"]
    assert w == pytest.approx(cfg.denoise.target_weight)
    assert all(x == w for x in e.weights[0]) and all(x == 1.0 for x in e.weights[4])


def test_disagreement_is_measured_after_calibration():
    """A WM that is a monotone distortion of the truth is not noisy once calibrated."""
    def run(debias):
        cfg = EstimatorConfig(mode="wmrl")
        cfg.debias.enabled = debias
        cfg.debias.min_pairs = 16
        cfg.debias.n_bins = 20
        cfg.denoise.warmup = 100  # keep the EMA raw
        est = build_estimator(cfg, 0.25)
        rng = np.random.default_rng(2)
        for _ in range(10):
            est.estimate(_step(rng, distort=lambda r: r**4))
        return est.denoiser.ema

    assert run(debias=True) < 0.5 * run(debias=False)


def test_bias_reduction_diagnostic_is_positive_on_biased_data():
    cfg = EstimatorConfig(mode="wmrl")
    cfg.debias.min_pairs = 16
    est = build_estimator(cfg, 0.25)
    rng = np.random.default_rng(3)
    est.estimate(_step(rng))
    e = est.estimate(_step(rng))
    assert e.diagnostics["bias_reduction"] > 0.3


def test_rectified_is_unbiased_over_the_anchor_draw():
    """Averaged over which group is the anchor, the rectified advantage is the all-real one."""
    rng = np.random.default_rng(4)
    base = _step(rng, n_groups=4, anchors=(), distort=lambda r: 1 - r, noise=0.1)  # a reordering WM
    cfg = EstimatorConfig(mode="wmrl", rectified=True)
    cfg.denoise.enabled = False
    real_cfg = EstimatorConfig(mode="real")
    all_real = build_estimator(real_cfg, 1.0).estimate(base).advantages
    mean = np.zeros((4, 8))
    for k in range(4):
        for i, g in enumerate(base):
            g.anchor = i == k
        est = build_estimator(cfg, 0.25)  # fresh: the same (identity) map for every draw
        mean += np.array(est.estimate(base).advantages, dtype=float) / 4
    assert np.allclose(mean, np.array(all_real, dtype=float))


def test_unknown_mode_and_wmrl_without_anchors_are_errors():
    with pytest.raises(KeyError, match="real, wm, wmrl"):
        build_estimator(EstimatorConfig(mode="grpo"), 0.1)
    with pytest.raises(ValueError, match="anchors.fraction"):
        build_estimator(EstimatorConfig(mode="wmrl"), 0.0)


def test_state_dict_round_trip():
    cfg = EstimatorConfig(mode="wmrl")
    cfg.debias.min_pairs = 16
    cfg.denoise.warmup = 1
    a, b = build_estimator(cfg, 0.25), build_estimator(cfg, 0.25)
    rng = np.random.default_rng(5)
    for _ in range(3):
        a.estimate(_step(rng, noise=0.1))
    b.load_state_dict(a.state_dict())
    step = _step(np.random.default_rng(9), noise=0.1)
    ea, eb = a.estimate(step), b.estimate(step)
    assert ea.advantages == eb.advantages and ea.weights == eb.weights
