"""World-model fidelity metrics on constructed data whose answers are known."""

import json

import numpy as np
import pytest

from wmrl.world_models.fidelity import as_arrays, fidelity, spearman, write_report


def _groups(n_groups: int, size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    gid = np.repeat([f"g{i}" for i in range(n_groups)], size)
    step = np.repeat(np.arange(n_groups) // 2, size)  # two groups per step
    real = rng.uniform(0, 1, size=n_groups * size)
    return gid, step, real


def test_spearman_known_values_and_ties():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # monotone but not linear: still 1 (ranks, not values)
    assert spearman([0.1, 0.2, 0.3, 0.4], [1, 8, 27, 1000]) == pytest.approx(1.0)
    # ties get average ranks: x ranks [0, 1.5, 1.5, 3] against y ranks [0, 1, 2, 3]
    rx, ry = np.array([0, 1.5, 1.5, 3]), np.arange(4.0)
    expected = np.corrcoef(rx, ry)[0, 1]
    assert spearman([1, 2, 2, 5], [1, 2, 3, 4]) == pytest.approx(expected)
    assert expected < 1.0
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_perfect_predictor():
    gid, step, real = _groups(20, 6)
    m = fidelity(gid, step, real, np.full(len(real), 0.01), real)
    assert m["n"] == len(real) and m["n_unknown"] == 0
    assert m["within_group_spearman"] == pytest.approx(1.0) and m["n_groups_ranked"] == 20
    assert m["spearman"] == pytest.approx(1.0)
    assert m["mae"] == pytest.approx(0.0) and m["bias"] == pytest.approx(0.0)
    assert all(c == 1.0 for c in m["coverage"].values())
    assert all(d["mae"] == pytest.approx(0.0) for d in m["drift"]) and len(m["drift"]) >= 2


def test_reversed_within_groups_and_bias_by_bucket():
    gid, step, real = _groups(20, 6, seed=1)
    wm = np.empty_like(real)
    for g in np.unique(gid):  # reverse the order inside each group, but keep the group's values
        sel = np.where(gid == g)[0]
        order = np.argsort(real[sel])
        wm[sel[order]] = real[sel[order[::-1]]]
    m = fidelity(gid, step, wm, [None] * len(real), real)
    assert m["within_group_spearman"] == pytest.approx(-1.0)
    assert m["nll"] is None and m["n_with_var"] == 0  # no variances given

    # a WM that adds +0.2 to low scores and -0.2 to high ones: the buckets show it, the overall bias hides it
    real = np.linspace(0.0, 1.0, 101)
    wm = real + np.where(real < 0.5, 0.2, -0.2)
    m = fidelity(np.zeros(101), np.zeros(101), wm, np.full(101, 0.01), real, buckets=2)
    low, high = m["by_real_bucket"]
    assert low["bias"] == pytest.approx(0.2) and high["bias"] == pytest.approx(-0.2)
    assert low["n"] + high["n"] == 101 and high["n"] == 51  # real = 1.0 falls in the last bucket
    assert abs(m["bias"]) < 0.01


def test_gaussian_coverage_and_nll_follow_the_variance():
    rng = np.random.default_rng(0)
    n = 20000
    real = rng.uniform(0.2, 0.8, size=n)
    sd = 0.1
    wm = real + rng.normal(0, sd, size=n)  # the WM's error really is N(0, sd^2)
    gid, step = np.arange(n) // 8, np.arange(n) // 800
    right = fidelity(gid, step, wm, np.full(n, sd ** 2), real)
    for level in ("0.5", "0.8", "0.9"):
        assert right["coverage"][level] == pytest.approx(float(level), abs=0.015)
    small = fidelity(gid, step, wm, np.full(n, (sd / 4) ** 2), real)  # overconfident
    assert small["coverage"]["0.8"] < 0.4
    assert small["nll"] > right["nll"] + 1.0
    # the right variance is the NLL's optimum among these
    big = fidelity(gid, step, wm, np.full(n, (sd * 4) ** 2), real)
    assert big["coverage"]["0.5"] > 0.95 and big["nll"] > right["nll"]
    assert all(d["coverage"]["0.8"] == pytest.approx(0.8, abs=0.05) for d in right["drift"])


def test_group_exclusions_and_unknowns():
    # g0: all-equal real scores (excluded); g1: constant WM (counted, excluded); g2: ranked perfectly
    gid = ["g0"] * 3 + ["g1"] * 3 + ["g2"] * 3 + ["g3"] * 2
    real = [0.5, 0.5, 0.5, 0.1, 0.5, 0.9, 0.1, 0.5, 0.9, 0.3, 0.7]
    wm = [0.9, 0.1, 0.4, 0.3, 0.3, 0.3, 0.2, 0.4, 0.6, None, float("nan")]  # g3 is unknown
    m = fidelity(gid, [0] * 11, wm, [0.01] * 11, real)
    assert m["n"] == 9 and m["n_unknown"] == 2
    assert m["n_groups_ranked"] == 1 and m["n_groups_constant_wm"] == 1
    assert m["within_group_spearman"] == pytest.approx(1.0)  # g0's disagreement does not count
    with pytest.raises(ValueError):
        fidelity(["a"], [0], [0.5], [0.1], [float("nan")])


def test_drift_windows_see_a_wm_that_degrades():
    rng = np.random.default_rng(3)
    steps = np.repeat(np.arange(40), 16)
    real = rng.uniform(0, 1, size=len(steps))
    noise = np.where(steps < 20, 0.02, 0.3)  # the WM falls behind the policy halfway
    wm = np.clip(real + noise * rng.normal(size=len(steps)), 0, 1)
    m = fidelity(np.repeat(np.arange(160), 4), steps, wm, np.full(len(steps), 0.02 ** 2), real, window=10)
    assert [d["step_lo"] for d in m["drift"]] == [0, 10, 20, 30]
    early, late = m["drift"][:2], m["drift"][2:]
    assert max(d["mae"] for d in early) < 0.05 < min(d["mae"] for d in late)
    assert min(d["within_group_spearman"] for d in early) > 0.9 > max(d["within_group_spearman"] for d in late)
    assert min(d["coverage"]["0.8"] for d in early) > 0.7 > max(d["coverage"]["0.8"] for d in late)


def test_records_and_report(tmp_path):
    from wmrl.core.store import AnchorPair

    pairs = [AnchorPair("run", s, f"s{s}g0", k, "t", 0.1 * k + 0.05, 0.01 if k else None, 0.1 * k)
             for s in range(4) for k in range(5)]
    cols = as_arrays(pairs)
    m = fidelity(**cols)
    assert m["n"] == 20 and m["bias"] == pytest.approx(0.05) and m["n_with_var"] == 16
    assert m["within_group_spearman"] == pytest.approx(1.0) and m["n_groups_ranked"] == 4
    json_path, png_path = write_report(m, tmp_path / "report")
    back = json.loads(json_path.read_text())
    assert back["n"] == 20 and back["coverage"].keys() == m["coverage"].keys()
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png_path.stat().st_size > 5000
    # NaN becomes null, so the JSON is valid for strict readers
    empty = fidelity([], [], [], [], [])
    assert empty["n"] == 0 and empty["mae"] is None
    p, _ = write_report(empty, tmp_path / "empty")
    assert json.loads(p.read_text())["spearman"] is None


def test_variance_error_correlation_says_whether_the_wm_knows_where_it_is_wrong():
    rng = np.random.default_rng(0)
    n = 2000
    sd = rng.uniform(0.01, 0.3, n)
    real = rng.uniform(0.3, 0.7, n)
    wm = real + sd * rng.normal(size=n)  # errors drawn with the stated sd
    honest = fidelity(np.arange(n), np.zeros(n), wm, sd**2, real)
    blind = fidelity(np.arange(n), np.zeros(n), wm, rng.permutation(sd) ** 2, real)
    assert honest["var_error_spearman"] > 0.3
    assert abs(blind["var_error_spearman"]) < 0.1


def test_success_auc_is_the_chance_a_success_outranks_a_failure():
    from wmrl.world_models.fidelity import success_auc

    assert success_auc([0.9, 0.8, 0.1, 0.2], [1, 1, 0, 0]) == 1.0
    assert success_auc([0.1, 0.8, 0.9, 0.2], [1, 1, 0, 0]) == 0.25  # of 4 (success, failure) pairs, 1 ordered
    assert success_auc([0.5, 0.5, 0.5], [1, 0, 0]) == 0.5  # ties count half
    assert success_auc([0.3, 0.4], [1, 1]) is None and success_auc([0.3, 0.4], [0.5, 1]) is None
    # the metric is in every section's core metrics
    assert fidelity(["a", "a", "b", "b"], [0, 0, 1, 1], [0.9, 0.1, 0.8, 0.2], [0.01] * 4, [1, 0, 1, 0])["success_auc"] == 1.0
