"""The benchmark harness: it compares only like with like, and writes what it measured."""

import json
import shutil

import numpy as np
import pytest
import yaml

from wmrl.bench import run_benchmark
from wmrl.bench.harness import (IncomparableRuns, RunRecord, bootstrap_interval, same_config, summarize,
                                time_to_reach)
from wmrl.config import ConfigError, load_config, to_yaml


def rec(mode, seed, steps=10, digest="t", final=0.5, wall=10.0, execs=100):
    hist = [{"step": 0, "wall": 0.0, "real_executions": 0, "eval_test_id": 0.1},
            {"step": steps, "wall": wall, "real_executions": execs, "eval_test_id": final}]
    return RunRecord(mode, seed, steps, digest, hist, execs, wall, wall / 2)


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
    from wmrl.bench.speedup import targets

    t = targets(out)
    assert t["wmrl_reaches_real_final_4x_sooner"] and t["modes_4x_sooner"] == ["wmrl"]
    assert time_to_reach(runs[0].history, 0.9) is None


def test_bootstrap_intervals_cover_the_seeds_mean_and_a_seed_that_never_got_there_is_unbounded():
    iv = bootstrap_interval([0.2, 0.4, 0.6, 0.8, 1.0])
    assert 0.2 <= iv[0] < 0.6 < iv[1] <= 1.0
    assert bootstrap_interval([0.5]) is None and bootstrap_interval([0.3, 0.3]) == [0.3, 0.3]
    times = bootstrap_interval([10.0, 20.0, None], stat=np.median)
    assert times[0] == 10.0 and times[1] is None  # resamples with two misses never reach it
    out = summarize([rec("real", s, final=f) for s, f in enumerate([0.2, 0.5, 0.8])])["modes"]["real"]
    assert out["final_test_id_interval"][0] < 0.5 < out["final_test_id_interval"][1]
    assert out["time_to_reference_final_interval"] is not None


def test_held_out_columns_are_summarised_before_and_after_with_each_seeds_change():
    runs = []
    for seed, (before, after) in enumerate([(0.2, 0.1), (0.3, 0.5), (0.1, 0.4)]):
        r = rec("wmrl", seed)
        r.history[0].update(eval_test_ood=before, eval_test_ood_ok=0.5, eval_test_ood_parsed=1.0)
        r.history[-1].update(eval_test_ood=after, eval_test_ood_ok=0.75, eval_test_ood_parsed=float("nan"))
        runs.append(r)
    held = summarize(runs)["modes"]["wmrl"]["held_out"]
    assert held["test_ood"]["before"] == pytest.approx(0.2) and held["test_ood"]["after"] == pytest.approx(0.4)
    assert held["test_ood"]["change_per_seed"] == pytest.approx([-0.1, 0.2, 0.3])
    assert held["test_ood"]["change_interval"] == pytest.approx([-0.1, 0.3])  # one fall in three: no fall shown
    assert held["test_ood_ok"]["after"] == 0.75 and held["test_ood_parsed"]["change_per_seed"] == [None] * 3
    assert held["test_id"]["change_per_seed"] == pytest.approx([0.4] * 3)
    from wmrl.bench.speedup import held_out_lines

    lines = held_out_lines(summarize(runs)["modes"])
    assert ("| wmrl | 0.100 → 0.500 (+0.400; [+0.400, +0.400]) | 0.200 → 0.400 (-0.100; [-0.100, +0.300]) | "
            "0.500 → 0.750 (+0.250; [+0.250, +0.250]) |") in "\n".join(lines)


def test_vla_targets_count_simulator_episodes_and_wall_clock_to_real_final():
    from wmrl.bench.speedup import targets

    runs = [rec("real", s, final=0.6, wall=40.0, execs=480) for s in range(3)]
    runs += [rec("wmrl", s, final=0.6, wall=15.0, execs=120) for s in range(3)]
    out = {"config": "vla", **summarize(runs)}
    w = out["modes"]["wmrl"]
    assert w["real_executions_to_reference_final_median"] == 120 and w["fewer_real_executions_to_reference_final"] == 4.0
    t = targets(out)
    assert t["wmrl_3x_fewer_sim_episodes_to_real_final"] and t["wmrl_2x_less_wall_to_real_final"]
    slow = [rec("real", s, final=0.6, wall=40.0, execs=480) for s in range(3)]
    slow += [rec("wmrl", s, final=0.6, wall=25.0, execs=200) for s in range(3)]
    t = targets({"config": "vla", **summarize(slow)})
    assert not t["wmrl_3x_fewer_sim_episodes_to_real_final"] and not t["wmrl_2x_less_wall_to_real_final"]


def test_speedup_benchmark_writes_json_table_plot_and_targets(tmp_path):
    out = run_benchmark("speedup", [f"out={tmp_path / 'm.json'}", "seeds=1", "trainer.steps=2",
                                     "trainer.eval_samples=1", "trainer.groups_per_step=4", "domain.real_delay_s=0"])
    data = json.loads(out.read_text())
    assert set(data["modes"]) == {"real", "wm", "wmrl-none", "wmrl-denoise", "wmrl-debias", "wmrl", "wmrl-rho0.1",
                                  "wmrl-adaptive", "wmrl-async", "wmrl-async-calibrate"}
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
    with pytest.raises(ConfigError, match="modes: unknown"):
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


def test_estimators_benchmark_scores_every_variant_on_the_same_groups(tmp_path):
    out = run_benchmark("estimators", [f"out={tmp_path / 'e.json'}", "seeds=1", "trainer.steps=4",
                                       "trainer.groups_per_step=4", "domain.real_delay_s=0"])
    data = json.loads(out.read_text())
    v = data["variants"]
    assert set(v) == {"wm", "wmrl-none", "wmrl-denoise", "wmrl-debias", "wmrl", "wmrl-rectified", "wmrl-rectified-tuned"}
    assert all(len(x["curve"]) == 4 for x in v.values())
    # the same groups, but only the WMRL variants use the anchors' real grades: a truer signal
    assert v["wm"]["cosine_median"] < v["wmrl-none"]["cosine_median"]
    assert v["wmrl-none"]["vs_none_median_diff"] == 0.0
    assert sorted(data["order_measured"]) == sorted(["wmrl-none", "wmrl-denoise", "wmrl-debias", "wmrl"])
    assert "| wmrl-denoise |" in out.with_suffix(".md").read_text() and out.with_suffix(".png").exists()
    with pytest.raises(ConfigError, match="free true reward"):
        run_benchmark("estimators", ["config=autoresearch"])


def test_results_section_is_rendered_from_the_json_between_the_markers(tmp_path):
    from wmrl.bench.speedup import targets

    result = {"benchmark": "speedup", "config": "synthetic-program", "profile": "full", "overrides": [],
              **summarize([rec("real", s, final=0.75 + 0.05 * s, wall=40.0) for s in range(3)]
                          + [rec("wmrl", s, final=0.7 + 0.05 * s, wall=10.0) for s in range(3)])}
    result["targets"] = targets(result)
    (tmp_path / "speedup-synthetic-program-full.json").write_text(json.dumps(result))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:start -->\nstale\n<!-- results:end -->\noutro\n")
    run_benchmark("results", [f"dir={tmp_path}", f"readme={readme}"])
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "stale" not in text
    row = next(line for line in text.splitlines() if line.startswith("| synthetic-program | 3 |"))
    # wmrl's median 0.75 is within real's spread (0.1) of real's 0.80; no wm mode, no ladder: not measured
    assert "| 0.800 (0.100) | 0.750 (0.100) |" in row and "| 4.00x |" in row and row.endswith("| no | yes | — | — | no | — |")
    assert "Not measured yet:" in text and "`speedup-autoresearch-full.json`" in text
    readme.write_text("no markers\n")
    with pytest.raises(KeyError, match="markers"):
        run_benchmark("results", [f"dir={tmp_path}", f"readme={readme}"])


def test_the_trl_row_measures_wmrl_against_trl_and_names_trls_settings(tmp_path):
    from wmrl.bench.speedup import against, table, targets
    from wmrl.bench.trl_grpo import trl_settings

    runs = [rec("real", s, final=0.5, wall=40.0) for s in range(3)] + [rec("trl", s, final=0.6, wall=60.0) for s in range(3)]
    runs += [rec("wmrl", s, final=0.6 + 0.01 * s, wall=12.0, execs=25) for s in range(3)]
    result = {"benchmark": "speedup", "config": "autoresearch", "profile": "full", "overrides": [], **summarize(runs)}
    against(result, runs, "trl")
    result["trl"] = trl_settings(load_config("autoresearch", ["estimator.mode=real"]))
    result["targets"] = t = targets(result)
    w = result["modes"]["wmrl"]
    assert w["vs_trl"]["speedup_to_reference_final"] == pytest.approx(5.0)  # 60 s against 12 s to TRL's 0.6
    assert w["vs_trl"]["fewer_real_executions_to_reference_final"] == pytest.approx(4.0)
    assert w["speedup_to_reference_final"] == pytest.approx(40.0 / 12.0)  # and still against real's 0.5
    assert t["wmrl_reaches_trl_final_4x_sooner"] and t["wmrl_final_within_one_spread_of_trl"]
    text = table(result)
    assert f"TRL {result['trl']['version']} `GRPOTrainer`: num_generations=4" in text and "loss_type=dapo" in text
    assert "Against TRL's final: wmrl reached it on 3/3 seeds, 5.00x sooner, 4.00x fewer real executions" in text
    (tmp_path / "speedup-autoresearch-trl-full.json").write_text(json.dumps(result))
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:start -->\n<!-- results:end -->\n")
    run_benchmark("results", [f"dir={tmp_path}", f"readme={readme}"])
    row = next(line for line in readme.read_text().splitlines() if line.startswith("| autoresearch, against TRL"))
    assert "| 0.600 (0.000) | 0.610 (0.020) |" in row and "| 5.00x | 5.00x |" in row and "| yes | yes |" in row


def test_resume_keeps_finished_runs_of_the_same_config_and_reruns_the_rest(tmp_path):
    args = [f"out={tmp_path / 'm.json'}", "seeds=1", "modes=real,wmrl", "trainer.steps=2", "trainer.eval_samples=1",
            "trainer.groups_per_step=4", "trainer.checkpoint_every=1", "domain.real_delay_s=0"]
    first = json.loads(run_benchmark("speedup", args).read_text())
    walls = {m: v["per_seed"][0]["wall"] for m, v in first["modes"].items()}
    run_dir = tmp_path / "runs-m" / "wmrl" / "seed0"
    (run_dir / "marker").write_text("left by the first invocation")
    kept = json.loads(run_benchmark("speedup", [*args, "resume=true"]).read_text())
    assert {m: v["per_seed"][0]["wall"] for m, v in kept["modes"].items()} == walls  # taken, not retrained
    assert kept["modes"]["wmrl"]["per_seed"][0]["history"] == first["modes"]["wmrl"]["per_seed"][0]["history"]
    assert (run_dir / "marker").exists()
    # a run cut short (its last checkpoint before the end) is started over, never resumed part-way
    (run_dir / "checkpoints" / "latest").write_text("step000001")
    again = json.loads(run_benchmark("speedup", [*args, "resume=true", "modes=wmrl"]).read_text())
    assert not (run_dir / "marker").exists() and again["modes"]["wmrl"]["per_seed"][0]["final"]["step"] == 2
    # killed before its first checkpoint, with executions in its store: started over too
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "marker").write_text("left by a run killed at step 0")
    run_benchmark("speedup", [*args, "resume=true", "modes=wmrl"])
    assert not (run_dir / "marker").exists()
    # another config is another run: retrained, not mixed in
    changed = json.loads(run_benchmark("speedup", [*args, "resume=true", "engine.lr=0.01"]).read_text())
    assert changed["modes"]["real"]["per_seed"][0]["wall"] != walls["real"]
    # so is the same config over another build of what it names without pinning (`Domain.provenance`)
    real_dir = tmp_path / "runs-m" / "real" / "seed0"
    (real_dir / "marker").write_text("trained on another build")
    (real_dir / "provenance.json").write_text('{"agent": "agent-0123"}')
    run_benchmark("speedup", [*args, "resume=true", "engine.lr=0.01", "modes=real"])
    assert not (real_dir / "marker").exists() and (real_dir / "provenance.json").read_text() == "{}"
    with pytest.raises(ConfigError, match="option .resume.: Value .maybe. is not a valid bool"):
        run_benchmark("speedup", [*args, "resume=maybe"])


def test_a_finished_run_survives_an_option_added_since_at_its_default_and_nothing_else(tmp_path):
    text = to_yaml(load_config("synthetic-program", []))
    before = yaml.safe_load(text)
    del before["anchors"]["stale_use"]  # written by a version without the option
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(before))
    assert same_config(saved, text, "synthetic-program") and saved.read_text() == text  # brought up to date
    saved.write_text(yaml.safe_dump(before))
    assert not same_config(saved, to_yaml(load_config("synthetic-program", ["anchors.stale_use=calibrate"])),
                           "synthetic-program")  # the new option away from its default: another run
    assert not same_config(saved, to_yaml(load_config("synthetic-program", ["engine.lr=0.5"])), "synthetic-program")


def test_benchmark_options_are_typed_checked_and_listed_by_help(capsys):
    from wmrl.cli import main

    with pytest.raises(ConfigError, match="benchmark option 'seeds': Value 'many'"):
        run_benchmark("speedup", ["seeds=many"])
    with pytest.raises(ConfigError, match="profile='medium': choose quick or full"):
        run_benchmark("wm", ["profile=medium"])
    with pytest.raises(ConfigError, match="unknown option 'trainer.steps'; this benchmark's options are: commit_rounds, n, out"):
        run_benchmark("sandbox", ["trainer.steps=3"])  # a benchmark that trains nothing takes no run-config keys
    with pytest.raises(ConfigError, match="write key=value"):
        run_benchmark("results", ["readme"])
    assert main(["bench", "estimators", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("wmrl bench estimators [option=value ...] [run-config key=value ...]")
    assert "  driver=wmrl  (str) the mode whose run collects the groups" in out and "every estimator" in out
    assert main(["bench", "hostile", "repeats=0"]) == 2
    assert "repeats and n must be >= 1" in capsys.readouterr().err
