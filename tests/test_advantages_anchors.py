"""GRPO advantages over partly graded groups, and anchor scheduling."""

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from wmrl.core.advantages import AdvantageConfig, group_advantages, signal_cosine
from wmrl.core.anchors import AdaptiveConfig, AnchorConfig, AnchorScheduler

grades = st.lists(st.one_of(st.none(), st.floats(0, 1)), min_size=0, max_size=16)


@given(grades, st.booleans())
def test_advantages_zero_mean_and_unknown_never_zero(rs, standardize):
    cfg = AdvantageConfig(standardize=standardize)
    adv = group_advantages(rs, cfg)
    assert len(adv) == len(rs)
    for r, a in zip(rs, adv):
        if r is None:
            assert a is None  # excluded, never scored
    graded = [a for a in adv if a is not None]
    if sum(r is not None for r in rs) < 2:
        assert graded == []
    else:
        assert abs(np.mean(graded)) < 1e-9


def test_standardize_switch_and_order():
    rs = [0.1, None, 0.5, 0.9]
    a = group_advantages(rs, AdvantageConfig(standardize=True))
    assert a[1] is None and a[0] < a[2] < a[3]
    assert np.std([a[0], a[2], a[3]]) == pytest.approx(1.0, rel=1e-4)
    c = group_advantages(rs, AdvantageConfig(standardize=False))
    assert [c[0], c[2], c[3]] == pytest.approx([-0.4, 0.0, 0.4])


def test_signal_cosine_weights_exclusions_and_missing_truth():
    oracle = [[-1.0, 1.0], [1.0, -1.0]]
    assert signal_cosine([[-2.0, 2.0], [1.0, -1.0]], [[1.0, 1.0], [2.0, 2.0]], oracle) == pytest.approx(1.0)
    assert signal_cosine([[1.0, -1.0], [-1.0, 1.0]], [[1.0] * 2] * 2, oracle) == pytest.approx(-1.0)
    # an excluded trajectory pushes nothing: half the true signal is missed
    half = signal_cosine([[-1.0, 1.0], [None, None]], [[1.0] * 2] * 2, oracle)
    assert half == pytest.approx(np.sqrt(0.5))
    # where the truth is unknown the trajectory is left out, whatever it pushes
    assert signal_cosine([[-1.0, 1.0], [5.0, 5.0]], [[1.0] * 2] * 2, [[-1.0, 1.0], [None, None]]) == pytest.approx(1.0)
    assert np.isnan(signal_cosine([[1.0]], [[1.0]], [[None]]))


def test_min_graded_skips_group():
    assert group_advantages([0.2, None, None], AdvantageConfig(min_graded=2)) == [None] * 3
    assert group_advantages([0.2, 0.4, None], AdvantageConfig(min_graded=3)) == [None] * 3
    with pytest.raises(ValueError, match="min_graded"):
        AdvantageConfig(min_graded=1).validate()


def test_anchor_fraction_floor_and_seeded_choice():
    s = AnchorScheduler(AnchorConfig(fraction=0.1, min_groups=1, seed=3))
    assert s.count(8) == 1  # round(0.8) = 1, and the floor
    assert s.count(40) == 4
    a, b = s.choose(5, 40), s.choose(5, 40)
    assert np.array_equal(a, b) and len(set(a.tolist())) == 4
    assert not np.array_equal(s.choose(5, 40), s.choose(6, 40))
    assert AnchorScheduler(AnchorConfig(fraction=0.0)).count(8) == 0


def test_capacity_binds_and_realized_fraction_falls():
    s = AnchorScheduler(AnchorConfig(fraction=0.5, max_in_flight=2))
    assert s.count(16) == 2  # wants 8, the pool runs 2 groups at once
    assert s.count(16) / 16 < 0.5
    assert AnchorScheduler(AnchorConfig(fraction=0.5)).count(16) == 8  # no cap
    full = AnchorScheduler(AnchorConfig(max_in_flight=2), fraction=1.0)
    assert full.count(16) == 16  # mode real grades everything, cap or not


@pytest.mark.parametrize("rho", [-0.1, 1.5])
def test_fraction_outside_unit_interval_is_an_error(rho):
    with pytest.raises(ValueError, match="fraction"):
        AnchorScheduler(AnchorConfig(fraction=rho))


def test_std_conventions_match_the_formulas_the_peers_use():
    rewards = [0.9, None, 0.2, 0.5, 0.5, 0.1]
    r = np.array([0.9, 0.2, 0.5, 0.5, 0.1])
    # the method's reference: population std (divide by n) plus our eps
    ours = group_advantages(rewards, AdvantageConfig())
    pop = (r - r.mean()) / (np.sqrt(((r - r.mean()) ** 2).sum() / len(r)) + 1e-6)
    assert [a for a in ours if a is not None] == pytest.approx(pop.tolist(), rel=1e-12)
    # TRL's GRPOTrainer: (r - mean) / (std + 1e-4) with torch's Bessel-corrected std (divide by n - 1)
    trl = group_advantages(rewards, AdvantageConfig(std="sample", eps=1e-4))
    t = torch.tensor(r, dtype=torch.float64)
    expected = ((t - t.mean()) / (t.std() + 1e-4)).tolist()
    assert [a for a in trl if a is not None] == pytest.approx(expected, rel=1e-12)
    assert ours[1] is None and trl[1] is None
    assert abs(trl[0]) < abs(ours[0])  # n - 1 makes the std larger, the advantages smaller
    with pytest.raises(ValueError, match="std must be one of population, sample"):
        AdvantageConfig(std="bessel").validate()


def _adaptive(**kw) -> AnchorScheduler:
    a = AdaptiveConfig(enabled=True, floor=0.125, ceiling=0.5, half_life=2.0, min_pairs=8)
    return AnchorScheduler(AnchorConfig(fraction=0.25, adaptive=dataclasses.replace(a, **kw)))


def test_adaptive_budget_moves_with_the_out_of_sample_error():
    s = _adaptive()
    assert s.fraction == 0.5 and np.isnan(s.unexplained)  # nothing measured: the ceiling
    s.observe(0.0, 1.0, 4)
    assert s.fraction == 0.5  # 4 of 8 pairs: still the ceiling
    s.observe(0.0, 1.0, 4)
    assert s.unexplained == 0.0 and s.fraction == 0.125  # an exact world model needs only the floor
    assert s.count(8) == 1
    s.observe(8.0, 2.0, 8)  # then it misses everything: the decayed sums (half-life 2 steps) pass 1 -> the ceiling
    keep = 0.5 ** 0.5
    assert s.unexplained == pytest.approx(8.0 / ((keep + 1.0) * keep + 2.0)) and s.fraction == 0.5 and s.count(8) == 4
    for _ in range(40):  # half of the variation missed for long enough: halfway between floor and ceiling
        s.observe(1.0, 2.0, 8)
    assert s.fraction == pytest.approx(0.125 + 0.5 * 0.375, abs=1e-6)
    again = _adaptive()
    again.load_state_dict(s.state_dict())
    assert again.fraction == s.fraction  # a resumed run draws the same budget
    fixed = AnchorScheduler(AnchorConfig(fraction=0.25, adaptive=AdaptiveConfig(enabled=True)), 1.0, adaptive=False)
    fixed.observe(9.0, 1.0, 100)
    assert fixed.fraction == 1.0  # a mode that fixes rho keeps it
    with pytest.raises(ValueError, match="floor <= ceiling"):
        AnchorConfig(adaptive=AdaptiveConfig(floor=0.6, ceiling=0.5)).validate()


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100), st.integers(0, 64)), max_size=60))
def test_adaptive_budget_stays_within_its_bounds(steps):
    s = _adaptive(min_pairs=0)
    for err, var, n in steps:
        s.observe(err, var, n)
        assert 0.125 <= s.fraction <= 0.5
        assert s.count(16) in range(2, 9)


def test_a_training_run_follows_its_budget_and_resumes_with_it(tmp_path):
    """synthetic-program with anchors.adaptive: each step's realized anchor fraction is the budget the step
    before set, within bounds, and a run resumed from a checkpoint draws the same budgets."""
    from wmrl.api import build_trainer
    from wmrl.config import load_config
    from wmrl.core.metrics import read_jsonl

    def cfg(run_dir, steps):
        return load_config("synthetic-program", [
            f"run_dir={run_dir}", f"trainer.steps={steps}", "trainer.checkpoint_every=3", "trainer.eval_every=0",
            "trainer.eval_samples=1", "trainer.groups_per_step=8", "tensorboard=false", "domain.real_delay_s=0",
            "anchors.adaptive.enabled=true", "anchors.adaptive.floor=0.125", "anchors.adaptive.ceiling=0.5",
            "anchors.adaptive.min_pairs=16"])

    for run_dir, stops in ((tmp_path / "a", (8,)), (tmp_path / "b", (3, 8))):
        for steps in stops:
            t = build_trainer(cfg(run_dir, steps))
            t.train()
            t.close()
    a, b = read_jsonl(tmp_path / "a" / "metrics.jsonl"), read_jsonl(tmp_path / "b" / "metrics.jsonl")
    budgets = [0.5] + [r["anchor_budget_next"] for r in a]
    assert all(0.125 <= x <= 0.5 for x in budgets)
    assert [r["anchor_fraction"] for r in a] == [round(8 * x) / 8 for x in budgets[:-1]]
    assert len(set(budgets)) > 1  # it moved
    assert [(r["anchor_fraction"], r["anchor_budget_next"], r["loss"]) for r in b] == [
        (r["anchor_fraction"], r["anchor_budget_next"], r["loss"]) for r in a]
