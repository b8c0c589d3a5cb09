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


def test_fused_mode_gives_failures_partial_credit_from_the_score_and_keeps_successes_and_unknowns():
    est = build_estimator(EstimatorConfig(mode="fused", fusion_weight=0.5), 0.1)
    assert est.anchor_fraction == 1.0 and est.uses_world_model
    e = est.estimate([group("a", [1.0, 0.0, 0.0, None, 0.0], [0.2, 0.8, 1.7, 0.9, None], True)])
    # success stays 1; a failure gets 0.5 x its score (clipped to [0, 1]); no score: the real grade alone
    assert e.rewards[0] == [1.0, 0.4, 0.5, None, 0.0]
    assert e.advantages[0][3] is None and e.advantages[0][1] > e.advantages[0][4]
    with pytest.raises(ValueError, match="fusion_weight"):
        build_estimator(EstimatorConfig(mode="fused", fusion_weight=1.5), 0.1)


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


def test_the_smoothed_bias_reduction_pools_the_steps_out_of_sample_residuals():
    """1 - (decayed sum of calibrated residuals) / (decayed sum of raw ones), each step's from the map before it;
    steady where the per-step ratio swings with a few noisy pairs."""
    from wmrl.core.debias import within_group_sums

    cfg = EstimatorConfig(mode="wmrl")
    cfg.debias.min_pairs, cfg.debias.report_half_life = 16, 2.0
    est, shadow = build_estimator(cfg, 0.25), build_estimator(cfg, 0.25)
    rng = np.random.default_rng(5)
    keep, sums, per_step = 0.5 ** 0.5, [0.0, 0.0], []
    for _ in range(12):
        groups = _step(rng, noise=0.15)
        anchors = [g for g in groups if g.anchor]
        wm = [np.array([t.wm.mean for t in g.trajectories]) for g in anchors]
        real = [np.array([t.real.reward for t in g.trajectories]) for g in anchors]
        raw, _, _ = within_group_sums(wm, real)
        cal, _, _ = within_group_sums([shadow.debiaser(w) for w in wm], real)  # the map before this step's pairs
        shadow.estimate(groups)
        sums = [keep * sums[0] + raw, keep * sums[1] + cal]
        d = est.estimate(groups).diagnostics
        per_step.append(d["bias_reduction"])
        assert d["bias_reduction_smoothed"] == pytest.approx(1.0 - sums[1] / sums[0])
    assert d["bias_reduction_smoothed"] > 0  # the map helps on distorted scores
    assert np.std(per_step[4:]) > 0  # (the per-step one moves; the test above pins its value)
    state = est.state_dict()
    again = build_estimator(cfg, 0.25)
    again.load_state_dict(state)
    assert again.state_dict() == state


def _hostile_step():
    """Four groups of four: unknown real grades, an unknown WM grade, and a group with one real grade."""
    return [
        group("a", [0.9, 0.1, None, 0.5], [0.2, 0.8, 0.6, 0.4], False),  # a reordering WM, one real unknown
        group("b", [0.3, None, None, None], [0.5, 0.1, 0.9, 0.3], False),  # < 2 real grades: real skips it
        group("c", [0.0, 1.0, 0.4, 0.6], [0.7, None, 0.2, 0.9], False),  # one WM grade unknown
        group("d", [0.2, 0.4, 0.6, 0.8], [0.9, 0.7, 0.5, 0.3], False),
    ]


def _trained_estimator(cfg, power=None):
    """An estimator whose map is fitted and reorders nothing in particular: the map's errors are arbitrary."""
    est = build_estimator(cfg, 0.5)
    rng = np.random.default_rng(7)
    x = rng.uniform(0, 1, 64)
    est.debiaser.push(x, np.clip(1.0 - x + 0.2 * rng.normal(size=64), 0, 1))
    if power is not None:
        est._power = list(power)
    return est


@pytest.mark.parametrize("standardize", [True, False], ids=["grpo", "centred"])
@pytest.mark.parametrize("tuned", [False, True], ids=["lambda1", "tuned"])
def test_rectified_is_unbiased_over_every_anchor_draw_even_with_unknown_grades(standardize, tuned):
    """Enumerate all C(4, 2) anchor draws: the mean rectified advantage is the all-real one, 0 where real leaves
    a trajectory out, and the loss's normaliser (the sum of weights) is the same on every draw."""
    import copy
    import itertools

    cfg = EstimatorConfig(mode="wmrl", rectified=True, tune_lambda=tuned)
    cfg.debias.min_pairs = 16
    cfg.advantage.standardize = standardize
    real_cfg = EstimatorConfig(mode="real")
    real_cfg.advantage.standardize = standardize
    target = build_estimator(real_cfg, 1.0).estimate(_hostile_step()).advantages
    target = np.array([[0.0 if a is None else a for a in row] for row in target])
    base = _trained_estimator(cfg, power=(0.3, 1.0))  # a tuned lambda of 0.3 from earlier steps
    assert base.debiaser.fitted and base.rectified_lambda == (0.3 if tuned else 1.0)
    draws = list(itertools.combinations(range(4), 2))
    mean, totals = np.zeros((4, 4)), set()
    for draw in draws:
        groups = _hostile_step()
        for i in draw:
            groups[i].anchor = True
        e = copy.deepcopy(base).estimate(groups)
        assert all(a is not None for row in e.advantages for a in row)
        mean += np.array(e.advantages) / len(draws)
        totals.add(round(sum(w for row in e.weights for w in row), 12))
    assert np.allclose(mean, target, atol=1e-12), (mean, target)
    assert len(totals) == 1


def test_the_tuned_lambda_comes_from_earlier_steps_and_shrinks_for_a_reordering_world_model():
    cfg = EstimatorConfig(mode="wmrl", rectified=True, tune_lambda=True)
    cfg.denoise.enabled = False
    est = build_estimator(cfg, 0.25)
    rng = np.random.default_rng(11)
    lams = []
    for _ in range(6):
        e = est.estimate(_step(rng, distort=lambda r: 1 - r, noise=0.05))  # the WM reverses the order
        lams.append(e.diagnostics["rectified_lambda"])
    assert lams[0] == 1.0  # no history: the plain difference estimator
    assert all(lam < 0.05 for lam in lams[1:])  # against a reversed WM the control variate is switched off
    good = build_estimator(cfg, 0.25)
    for _ in range(3):
        e = good.estimate(_step(rng, distort=lambda r: r, noise=0.02))
    assert e.diagnostics["rectified_lambda"] > 0.9  # a faithful WM keeps it


def test_estimator_config_rejects_a_non_positive_lambda_half_life():
    with pytest.raises(ValueError, match="lambda_half_life"):
        build_estimator(EstimatorConfig(mode="wmrl", rectified=True, lambda_half_life=0.0), 0.25)


def test_unknown_mode_and_wmrl_without_anchors_are_errors():
    with pytest.raises(ValueError, match="real, wm, wmrl"):
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
