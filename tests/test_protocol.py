"""The fair protocol of `wmrl bench speedup`: a validation split in every domain, one learning-rate grid for every
mode chosen on it, and the checks a reviewer reads beside the speed-up (real's plateau, evaluation episodes)."""

import json

import pytest
import yaml

from wmrl.bench import run_benchmark
from wmrl.bench.harness import plateau
from wmrl.bench.tuning import TUNING_SEED_BASE, choose, parse_grid
from wmrl.config import ConfigError, load_config
from wmrl.core.registry import DOMAINS
from wmrl.core.types import SPLITS


def _domain(name, overrides=()):
    cfg = load_config(name, list(overrides))
    return DOMAINS.get(cfg.domain.name)(cfg.domain)


@pytest.mark.parametrize("config", ["synthetic-program", "synthetic-control"])
def test_synthetic_validation_is_in_distribution_and_disjoint_from_the_other_splits(config):
    import numpy as np

    domain = _domain(config)
    payloads = {s: [np.asarray(t.payload) for t in domain.tasks(s)] for s in SPLITS}
    assert len(payloads["validation"]) == 16
    for other in ("train", "test_id", "test_ood"):
        assert not any(np.allclose(v, o) for v in payloads["validation"] for o in payloads[other])
    # the splits seeded before validation existed are unchanged by it (each split's stream is its own)
    assert [t.id for t in domain.tasks("test_id")] == [f"test_id-{i}" for i in range(16)]
    # in-distribution: validation's spread matches train's, unlike test_ood
    norm = {s: float(np.mean([np.linalg.norm(p) for p in payloads[s]])) for s in SPLITS}
    assert abs(norm["validation"] - norm["train"]) < abs(norm["test_ood"] - norm["train"])


def test_vla_validation_scenes_are_test_id_like_and_never_another_splits_scene():
    from wmrl.domains.vla.tasks import episode_seed, make_tasks

    seeds = {s: {t.seed for t in make_tasks(s, 50)} for s in SPLITS}
    for a in SPLITS:
        for b in SPLITS:
            assert a == b or not seeds[a] & seeds[b], (a, b)
    val = make_tasks("validation", 2)
    assert all(t.payload.variation is None for t in val)  # the default scene, as in test_id
    assert episode_seed("test_id", "lift", 0) % 3 == episode_seed("validation", "lift", 0) % 3
    assert max(seeds["validation"]) < 2**32


def test_autoresearch_validation_has_one_task_per_training_family_never_in_test_id():
    from wmrl.domains.autoresearch.suite import load_suite
    from wmrl.domains.autoresearch.tasks import split

    suite = load_suite()
    val, train, test_id = (split(suite, s) for s in ("validation", "train", "test_id"))
    assert sorted(t.family for t in val) == sorted({t.family for t in train})
    assert not {t.id for t in val} & {t.id for t in test_id}
    # each scores: its reference beats its baseline
    assert all(t.normalize(t.reference) > 0.5 for t in val)


def test_grid_parsing_and_the_choice_rule():
    assert parse_grid("0.1, 0.01,0.03") == [0.01, 0.03, 0.1]
    for bad in ("0.01", "0.01,0.01", "0.01,-1", "fast,slow", "0.01,nan"):
        with pytest.raises(ValueError, match="lrs="):
            parse_grid(bad)
    assert choose({0.01: [0.5, 0.7], 0.03: [0.8, 0.2], 0.1: [0.6, 0.59]}) == 0.01  # mean 0.6 beats 0.5 and 0.595
    assert choose({0.01: [0.5], 0.03: [0.5]}) == 0.01  # a tie goes to the smaller rate
    assert choose({0.01: [None, None], 0.03: [0.1, None]}) == 0.03  # a run that left no score is not a 0
    assert choose({0.01: [None]}) is None


def _run(history):
    return {"history": [{"step": s, "eval_test_id": v} for s, v in history]}


def test_plateau_tells_a_rising_curve_from_a_flat_one():
    rising = [_run([(0, 0.1), (30, 0.4), (40, 0.5 + d)]) for d in (0.0, 0.01, 0.02)]
    p = plateau(rising)
    assert p["gain_per_seed"] == pytest.approx([0.1, 0.11, 0.12]) and p["plateaued"] is False
    flat = [_run([(0, 0.1), (30, 0.5 + d), (40, 0.5)]) for d in (-0.02, 0.01, 0.03)]
    assert plateau(flat)["plateaued"] is True
    # the gain is read from the last evaluation at or before 75% of the run, not a later one
    assert plateau([_run([(0, 0.0), (20, 0.2), (35, 0.9), (40, 1.0)])] * 2)["gain_per_seed"] == pytest.approx([0.8] * 2)
    assert plateau([rising[0]])["plateaued"] is None  # one seed: cannot tell


def test_speedup_with_a_grid_tunes_each_mode_on_validation_then_runs_it_at_its_rate(tmp_path):
    out = tmp_path / "p.json"
    args = [f"out={out}", "seeds=2", "modes=real,wmrl", "lrs=0.003,0.3", "tune_seeds=2", "trainer.steps=3",
            "trainer.eval_every=0", "trainer.eval_samples=1", "trainer.groups_per_step=4", "domain.real_delay_s=0"]
    data = json.loads(run_benchmark("speedup", args).read_text())
    tuning = data["tuning"]
    assert tuning["grid"] == [0.003, 0.3] and tuning["seeds"] == [TUNING_SEED_BASE, TUNING_SEED_BASE + 1]
    work = tmp_path / "runs-p"
    for mode, t in tuning["modes"].items():
        means = t["validation_final_mean"]
        assert t["chosen_lr"] == choose({float(k): v for k, v in t["validation_final"].items()})
        assert means[f"{t['chosen_lr']:g}"] == max(means.values())
        # tuning runs saw validation only, at the rate of their folder
        for lr in ("0.003", "0.3"):
            run_dir = work / "tune" / mode / f"lr{lr}" / f"seed{TUNING_SEED_BASE}"
            cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
            assert cfg["engine"]["lr"] == float(lr) and cfg["trainer"]["eval_splits"] == ["validation"]
        # the final runs: fresh seeds, the chosen rate, evaluated on the test splits
        final = yaml.safe_load((work / mode / "seed0" / "config.yaml").read_text())
        assert final["engine"]["lr"] == t["chosen_lr"] and final["trainer"]["seed"] == 0
        assert "eval_test_id" in data["modes"][mode]["per_seed"][0]["final"]
        assert "eval_validation" not in data["modes"][mode]["per_seed"][0]["final"]
    assert data["reference_plateau"]["split"] == "test_id"
    assert data["evaluation_episodes"] == {"test_id": 16, "test_ood": 16}
    assert {"best_wmrl_variant", "best_wmrl_3x_sooner_not_below_real", "real_plateaued"} <= set(data["targets"])
    md = out.with_suffix(".md").read_text()
    assert "Learning rate chosen per mode on `validation`" in md and "| real | " in md
    assert "Episodes per evaluation: test_id 16, test_ood 16" in md
    with pytest.raises(ConfigError, match="engine.lr and lrs"):
        run_benchmark("speedup", [*args, "engine.lr=0.01"])
    with pytest.raises(ConfigError, match="lrs='0.01': give at least two"):
        run_benchmark("speedup", [f"out={out}", "lrs=0.01"])


def test_the_best_variant_is_the_fastest_that_reached_real_and_did_not_end_below_its_interval():
    from test_bench import rec

    from wmrl.bench.harness import summarize
    from wmrl.bench.speedup import targets

    runs = [rec("real", s, final=0.80 + 0.01 * s, wall=40.0) for s in range(5)]
    runs += [rec("wmrl", s, final=0.82 + 0.01 * s, wall=20.0) for s in range(5)]  # 2x sooner, ends above
    runs += [rec("wmrl-rho0.1", s, final=0.9 if s == 0 else 0.6, wall=5.0) for s in range(5)]  # 8x, ends below
    result = {"config": "synthetic-program", **summarize(runs)}
    t = targets(result)
    assert result["modes"]["wmrl-rho0.1"]["speedup_to_reference_final"] == pytest.approx(8.0)
    assert t["best_wmrl_variant"] == "wmrl" and t["best_wmrl_sooner"] == pytest.approx(2.0)
    assert t["best_wmrl_3x_sooner_not_below_real"] is False
    result["config"] = "autoresearch"  # another domain, another target
    assert "best_wmrl_4x_sooner_not_below_real" in targets(result)
