"""Online Debiasing: the map's math properties, its cadence and its effect on biased data."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.core.debias import DebiasConfig, IsotonicDebiaser, pool_adjacent_violators, within_group_residual

unit = st.floats(0.0, 1.0, allow_nan=False)
pairs = st.lists(st.tuples(unit, unit), min_size=1, max_size=200)


@given(pairs, st.lists(unit, min_size=1, max_size=50))
def test_identity_exactly_before_min_pairs(ps, scores):
    deb = IsotonicDebiaser(DebiasConfig(min_pairs=len(ps) + 1, window=10_000))
    deb.push([p for p, _ in ps], [r for _, r in ps])
    assert not deb.fitted
    assert np.array_equal(deb(scores), np.asarray(scores, float))


@given(pairs, st.lists(unit, min_size=2, max_size=50), st.integers(1, 20))
def test_map_is_monotone_and_never_reorders_a_group(ps, group, n_bins):
    deb = IsotonicDebiaser(DebiasConfig(n_bins=n_bins, min_pairs=1, refit_every=1))
    deb.push([p for p, _ in ps], [r for _, r in ps])
    assert deb.fitted
    grid = np.linspace(-0.5, 1.5, 401)
    assert np.all(np.diff(deb(grid)) >= -1e-12)
    g = np.asarray(group)
    mapped = deb(g)
    for i in range(len(g)):
        for j in range(len(g)):
            if g[i] < g[j]:
                assert mapped[i] <= mapped[j] + 1e-12  # ties allowed, reversals never


@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=60), st.data())
def test_pav_is_the_monotone_least_squares_fit(y, data):
    y = np.asarray(y)
    w = np.asarray(data.draw(st.lists(st.floats(0.1, 10), min_size=len(y), max_size=len(y))))
    fit = pool_adjacent_violators(y, w)
    assert np.all(np.diff(fit) >= -1e-9)
    assert np.isclose((fit * w).sum(), (y * w).sum())  # PAV preserves the weighted mean
    if np.all(np.diff(y) >= 0):
        assert np.allclose(fit, y)  # already monotone: untouched


def test_pav_known_answer():
    assert np.allclose(pool_adjacent_violators(np.array([1.0, 3.0, 2.0, 4.0]), np.ones(4)), [1, 2.5, 2.5, 4])
    assert np.allclose(pool_adjacent_violators(np.array([3.0, 1.0]), np.array([1.0, 3.0])), [1.5, 1.5])


def _biased_groups(rng, n_groups=40, g=8):
    """Real scores per group and a WM that squashes them non-affinely (r**3) plus noise."""
    real = [np.clip(rng.uniform(0.1, 0.9) + 0.15 * rng.normal(size=g), 0, 1) for _ in range(n_groups)]
    wm = [np.clip(r**3 + 0.02 * rng.normal(size=g), 0, 1) for r in real]
    return wm, real


def test_calibrated_within_group_residual_is_below_raw_out_of_sample():
    rng = np.random.default_rng(0)
    wm_fit, real_fit = _biased_groups(rng)
    deb = IsotonicDebiaser(DebiasConfig(min_pairs=32, n_bins=20))
    for w, r in zip(wm_fit, real_fit):
        deb.push(w, r)
    wm_new, real_new = _biased_groups(rng)  # held-out groups
    raw = within_group_residual(wm_new, real_new)
    cal = within_group_residual([deb(w) for w in wm_new], real_new)
    assert cal < 0.5 * raw


def test_refit_cadence_and_fifo_window_track_drift():
    deb = IsotonicDebiaser(DebiasConfig(n_bins=5, min_pairs=20, refit_every=10, window=40))
    x = np.linspace(0, 1, 20)
    deb.push(x, x)  # first fit at min_pairs
    before = deb([0.5])[0]
    assert before == pytest.approx(0.5, abs=0.05)
    deb.push(x[:9], np.zeros(9))  # 9 new pairs < refit_every: map unchanged
    assert deb([0.5])[0] == before
    for _ in range(4):  # the bias drifts to "real = 0.2 whatever the WM says"
        deb.push(x, np.full(20, 0.2))
    assert deb.n_pairs == 40  # FIFO window
    assert np.allclose(deb(x), 0.2)  # the old relation has left the window


def test_flat_beyond_the_outer_bins_and_clipped_input():
    deb = IsotonicDebiaser(DebiasConfig(n_bins=10, min_pairs=4, refit_every=1))
    deb.push([0.4, 0.45, 0.6, 0.65], [0.1, 0.2, 0.7, 0.8])
    lo, hi = deb([0.0, 0.3, 2.0])[[0, 1]], deb([0.9, 1.0, 2.0])
    assert lo[0] == lo[1] and np.all(hi == hi[0])


def test_state_dict_round_trip_is_exact():
    rng = np.random.default_rng(1)
    deb = IsotonicDebiaser(DebiasConfig(min_pairs=8, refit_every=4))
    deb.push(rng.uniform(size=30), rng.uniform(size=30))
    other = IsotonicDebiaser(DebiasConfig(min_pairs=8, refit_every=4))
    other.load_state_dict(deb.state_dict())
    s = rng.uniform(size=50)
    assert np.array_equal(deb(s), other(s))
    deb.push([0.3, 0.9, 0.1, 0.5], [0.9, 0.1, 0.4, 0.2])
    other.push([0.3, 0.9, 0.1, 0.5], [0.9, 0.1, 0.4, 0.2])
    assert np.array_equal(deb(s), other(s))


@pytest.mark.parametrize("kw", [{"n_bins": 0}, {"min_pairs": 0}, {"window": 4, "min_pairs": 8}])
def test_bad_config_is_an_error(kw):
    with pytest.raises(ValueError, match="estimator.debias"):
        IsotonicDebiaser(DebiasConfig(**kw))


def test_non_finite_pairs_and_scores_are_refused_with_the_value():
    from wmrl.core.debias import IsotonicDebiaser

    deb = IsotonicDebiaser(DebiasConfig(min_pairs=2, refit_every=1))
    deb.push([0.2, 0.8], [0.1, 0.9])
    state = deb.state_dict()
    for p, r in (([float("nan")], [0.5]), ([0.5], [float("inf")])):
        with pytest.raises(ValueError, match="is not finite"):
            deb.push(p, r)
    assert deb.state_dict() == state  # nothing of the bad batch got in
    with pytest.raises(ValueError, match="2 world-model scores but 1 real"):
        deb.push([0.1, 0.2], [0.3])
    with pytest.raises(ValueError, match="cannot calibrate the score nan"):
        deb([0.3, float("nan")])
