"""The benchmark harness: it compares only like with like, and writes what it measured."""

import json

import pytest

from wmrl.bench import run_benchmark
from wmrl.bench.harness import IncomparableRuns, RunRecord, summarize, time_to_reach


def rec(mode, seed, steps=10, digest="t", final=0.5, wall=10.0):
    hist = [{"step": 0, "wall": 0.0, "eval_test_id": 0.1}, {"step": steps, "wall": wall, "eval_test_id": final}]
    return RunRecord(mode, seed, steps, digest, hist, 100, wall, wall / 2)


def test_refuses_ratios_across_different_seeds_tasks_or_update_counts():
    ok = [rec("real", 0), rec("real", 1), rec("wmrl", 0), rec("wmrl", 1)]
    summarize(ok)
    with pytest.raises(IncomparableRuns, match="seeds"):
        summarize([rec("real", 0), rec("real", 1), rec("wmrl", 0), rec("wmrl", 2)])
    with pytest.raises(IncomparableRuns):
        summarize([rec("real", 0), rec("wmrl", 0, steps=20)])
    with pytest.raises(IncomparableRuns):
        summarize([rec("real", 0), rec("wmrl", 0, digest="other")])
    with pytest.raises(IncomparableRuns):
        summarize([rec("real", 0), rec("real", 1, steps=11), rec("wmrl", 0), rec("wmrl", 1)])


def test_summary_medians_ratio_and_time_to_reach():
    runs = [rec("real", s, final=0.8, wall=40.0) for s in range(3)] + [rec("wmrl", s, final=0.8, wall=10.0) for s in range(3)]
    out = summarize(runs)
    assert out["modes"]["wmrl"]["wall_ratio_vs_reference"] == pytest.approx(4.0)
    assert out["modes"]["wmrl"]["time_to_reference_final_median"] == pytest.approx(10.0)
    assert time_to_reach(runs[0].history, 0.9) is None


def test_speedup_benchmark_writes_json_table_plot_and_targets(tmp_path):
    out = run_benchmark("speedup", [f"out={tmp_path / 'm.json'}", "seeds=1", "trainer.steps=2",
                                     "trainer.eval_samples=1", "trainer.groups_per_step=4", "domain.real_delay_s=0"])
    data = json.loads(out.read_text())
    assert set(data["modes"]) == {"real", "wm", "wmrl-none", "wmrl-denoise", "wmrl-debias", "wmrl", "wmrl-rho0.1"}
    m = data["modes"]
    assert 0 < m["wmrl-rho0.1"]["real_executions_median"] <= m["wmrl"]["real_executions_median"]
    assert m["wm"]["real_executions_median"] == 0 < m["wmrl"]["real_executions_median"] < m["real"]["real_executions_median"]
    # Amdahl's bound: no real executions at all -> everything but the real share remains
    share = m["real"]["real_wall_share_median"]
    assert m["wm"]["ideal_speedup"] == pytest.approx(1 / (1 - share))
    assert m["real"]["ideal_speedup"] == pytest.approx(1.0)
    assert set(data["targets"]) >= {"wm_ends_below_real", "ablation_order_matches_paper", "wmrl_reaches_real_final_4x_sooner"}
    assert "| wmrl |" in out.with_suffix(".md").read_text() and out.with_suffix(".png").exists()
    with pytest.raises(KeyError, match="speedup"):
        run_benchmark("nope")
    with pytest.raises(KeyError, match="modes: unknown"):
        run_benchmark("speedup", ["modes=real,fast"])


def test_wm_benchmark_measures_every_world_model_of_the_domain_on_the_same_runs(tmp_path):
    out = run_benchmark("wm", ["config=synthetic-control", f"out={tmp_path / 'w.json'}", "seeds=1", "warmup=8",
                               "trainer.steps=3", "trainer.groups_per_step=4", "trainer.group_size=4",
                               "trainer.eval_samples=1"])
    data = json.loads(out.read_text())
    assert set(data["summary"]) == {"perturbed-dynamics", "latent-dynamics"}
    for wm in data["summary"].values():
        assert set(wm) == {"stream", "test_id", "test_ood", "test_id_warm", "test_ood_warm"}
        assert wm["stream"]["mae"] is not None
    runs = data["per_seed"][0]["world_models"]
    assert runs["perturbed-dynamics"]["stream"]["n"] == runs["latent-dynamics"]["stream"]["n"] == 3 * 16 - 16
    assert "| latent-dynamics | stream |" in out.with_suffix(".md").read_text()
