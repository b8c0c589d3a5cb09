"""Inverse-Variance Denoising: the anchor weight's bounds, warm-up, frozen scale, skips."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wmrl.core.denoise import DenoiseConfig, InverseVarianceDenoiser, disagreement

group = st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=2, max_size=10)


@given(st.lists(group, min_size=0, max_size=40), st.integers(1, 10), st.floats(1.0, 3.0), st.floats(3.0, 8.0))
def test_weight_is_one_before_warmup_and_always_within_bounds(groups, warmup, target, w_max):
    den = InverseVarianceDenoiser(DenoiseConfig(warmup=warmup, target_weight=target, w_max=w_max))
    for g in groups:
        d, s = np.array([a for a, _ in g]), np.array([b for _, b in g])
        den.observe(d, s)
        if den.groups_seen < warmup:
            assert den.weight == 1.0
        assert 1.0 <= den.weight <= w_max


def test_scale_is_set_once_at_warmup_then_frozen():
    rng = np.random.default_rng(0)
    den = InverseVarianceDenoiser(DenoiseConfig(warmup=5, target_weight=2.0, w_max=10.0, half_life=4))
    s = rng.uniform(size=8)
    for _ in range(4):
        den.observe(s + 0.1 * rng.normal(size=8), s)
        assert den.weight == 1.0 and den.scale is None
    den.observe(s + 0.1 * rng.normal(size=8), s)
    assert den.weight == pytest.approx(2.0)  # exactly the target at the moment c is frozen
    c = den.scale
    for _ in range(20):  # the WM gets much noisier: w rises, c does not move
        den.observe(s + 0.5 * rng.normal(size=8), s)
    assert den.scale == c
    assert den.weight > 3.0


def test_groups_with_equal_real_scores_are_skipped():
    den = InverseVarianceDenoiser(DenoiseConfig(warmup=1))
    assert den.observe(np.array([0.1, 0.9, 0.5]), np.array([0.5, 0.5, 0.5])) is None
    assert den.groups_seen == 0 and den.ema is None


def test_disagreement_is_zero_for_a_shifted_copy_and_scale_free():
    s = np.array([0.1, 0.4, 0.8, 0.3])
    assert disagreement(s + 0.2, s) == pytest.approx(0.0)  # offsets cancel within a group
    noisy = s + np.array([0.05, -0.05, 0.02, 0.0])
    assert disagreement(noisy, s) == pytest.approx(disagreement(10 * noisy, 10 * s))


def test_ema_is_a_weighted_mean_with_the_half_life():
    den = InverseVarianceDenoiser(DenoiseConfig(half_life=2.0, warmup=100))
    s = np.array([0.0, 1.0])
    den.observe(np.array([0.0, 1.0]), s)  # s2 = 0
    assert den.ema == 0.0
    den.observe(np.array([1.0, 0.0]), s)  # s2 = 4
    older = 0.5 ** (1 / 2.0)  # one group older, half-life 2 groups
    assert den.ema == pytest.approx((older * 0.0 + 1.0 * 4.0) / (older + 1.0))


@pytest.mark.parametrize("warmup", [4, 8])  # 4: configs/autoresearch.yaml
@pytest.mark.parametrize("first", [0.03, 3.0])
def test_the_frozen_scale_comes_from_the_warm_up_groups_not_the_first_one(first, warmup):
    """AutoResearch: a first group far from the level (0.03 or 3 against ~0.6) once set the scale almost alone,
    pinning w at w_max or sinking it towards 1 for the rest of the run although the disagreement held steady."""
    rng = np.random.default_rng(1)
    cfg = DenoiseConfig(half_life=16, warmup=warmup, target_weight=2.0, w_max=4.0)
    den = InverseVarianceDenoiser(cfg)
    real = np.array([0.0, 1.0, 0.0, 1.0])  # Var = 0.25; a residual e*(1, -1, -1, 1) gives s2 = 4 e^2
    levels = [first] + list(rng.uniform(0.4, 0.8, size=59))  # steady around 0.6 after the first group
    for s2 in levels:
        den.observe(real + np.sqrt(s2 / 4) * np.array([1, -1, -1, 1]), real)
    assert den.scale is not None
    assert 1.5 < den.weight < 2.6  # near the target: the disagreement did not move


def test_a_checkpoint_of_the_old_ema_loads_to_the_same_smoothed_value():
    den = InverseVarianceDenoiser(DenoiseConfig(half_life=4.0, warmup=2))
    den.load_state_dict({"ema": 0.5, "groups_seen": 10, "scale": 2.0})
    assert den.ema == pytest.approx(0.5) and den.weight == pytest.approx(2.0)
    state = den.state_dict()
    fresh = InverseVarianceDenoiser(DenoiseConfig(half_life=4.0, warmup=2))
    fresh.load_state_dict(state)
    assert fresh.ema == den.ema and fresh.scale == den.scale


def test_per_trajectory_weights_follow_predicted_variance():
    den = InverseVarianceDenoiser(DenoiseConfig(warmup=1, per_trajectory=True, w_max=10))
    s = np.array([0.1, 0.5, 0.9])
    v = np.array([0.01, 0.04, 0.09, 0.04])
    assert np.all(den.trajectory_weights(v) == 1.0)  # before the scale is frozen
    den.observe(s + np.array([0.1, -0.1, 0.0]), s)
    w = den.trajectory_weights(v)
    assert w[0] > w[1] > w[2]  # more confident, more weight
    assert w[1] == pytest.approx(w[3])
    off = InverseVarianceDenoiser(DenoiseConfig(warmup=1, per_trajectory=False))
    off.observe(s + np.array([0.1, -0.1, 0.0]), s)
    assert np.all(off.trajectory_weights(v) == 1.0)


@pytest.mark.parametrize("kw", [{"half_life": 0}, {"warmup": 0}, {"target_weight": 5.0, "w_max": 4.0}, {"target_weight": 0.5}])
def test_bad_config_is_an_error(kw):
    with pytest.raises(ValueError, match="estimator.denoise"):
        InverseVarianceDenoiser(DenoiseConfig(**kw))


def test_non_finite_scores_are_refused_with_the_value():
    den = InverseVarianceDenoiser(DenoiseConfig(warmup=1))
    with pytest.raises(ValueError, match="the score nan is not finite"):
        den.observe(np.array([0.1, float("nan")]), np.array([0.2, 0.9]))
    assert den.ema is None and den.groups_seen == 0


def test_a_near_zero_disagreement_at_warm_up_defers_the_freeze_instead_of_exploding_the_scale():
    den = InverseVarianceDenoiser(DenoiseConfig(warmup=2, target_weight=2.0, w_max=4.0))
    real = np.array([0.1, 0.5, 0.9, 0.3])
    for _ in range(4):  # a near-perfect WM: s^2 ~ 1e-8
        den.observe(real + 1e-5 * np.array([1, -1, 1, -1]), real)
    assert den.scale is None and den.weight == 1.0  # deferred, not (target - 1) / 1e-8
    shifted = real + 0.3 * np.array([1, -1, 1, -1])
    for _ in range(40):
        den.observe(shifted, real)
    assert den.scale is not None and 1.0 < den.weight <= 4.0
