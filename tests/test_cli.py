"""The `wmrl` command end to end, in subprocesses: errors exit 2 with one line; a tiny run trains, evals, reports, resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TINY = ["trainer.steps=3", "trainer.groups_per_step=4", "trainer.eval_samples=1", "domain.real_delay_s=0"]
PLOTS = ("heldout_vs_wall.png", "diagnostics.png", "time_split.png", "estimated_vs_real.png")


def wmrl(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "wmrl.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def assert_one_error_line(proc: subprocess.CompletedProcess, cmd: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"wmrl {cmd}: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def metric_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------ configuration errors


def test_train_bad_override_exits_2_with_one_line(tmp_path):
    proc = wmrl("train", "synthetic-program", "trainer.steps=many", f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    line = assert_one_error_line(proc, "train")
    assert "trainer.steps" in line
    assert not (tmp_path / "run").exists()  # nothing was started


def test_train_override_without_config_name(tmp_path):
    # the first override must not be mistaken for the CONFIG positional
    proc = wmrl("train", "trainer.steps=many", cwd=tmp_path)
    line = assert_one_error_line(proc, "train")
    assert "trainer.steps" in line and "no config named" not in line


def test_train_malformed_yaml_one_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("trainer:\n  steps: [1, 2\n  seed: 3\n")
    line = assert_one_error_line(wmrl("train", str(path), cwd=tmp_path), "train")
    assert str(path) in line and "YAML" in line


def test_train_unknown_config_name(tmp_path):
    line = assert_one_error_line(wmrl("train", "no-such-config", cwd=tmp_path), "train")
    assert "synthetic-program" in line


def test_report_on_empty_dir_exits_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    line = assert_one_error_line(wmrl("report", str(empty), cwd=tmp_path), "report")
    assert str(empty) in line and "metrics.jsonl" in line
    assert not (empty / "report.md").exists()


def test_eval_on_empty_dir_exits_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    line = assert_one_error_line(wmrl("eval", str(empty), cwd=tmp_path), "eval")
    assert str(empty) in line and "config.yaml" in line


# ------------------------------------------------------------------ a tiny real run


# The tests below share one run folder and run in file order: train, eval, report, resume.
@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    base = tmp_path_factory.mktemp("cli")
    run_dir = base / "run"
    proc = wmrl("train", "synthetic-program", *TINY, f"run_dir={run_dir}", cwd=base, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir, proc


def test_train_end_to_end(run):
    run_dir, proc = run
    out = json_lines(proc.stdout)
    assert len(out) == 1, proc.stdout
    assert out[0]["run_dir"] == str(run_dir)
    assert out[0]["final"]["step"] == 3
    assert f"report: {run_dir / 'report.md'}" in proc.stdout
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "report.md", "store.sqlite", *PLOTS):
        assert (run_dir / name).is_file(), name
    assert metric_steps(run_dir) == [1, 2, 3]
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert (run_dir / "checkpoints" / "latest").is_file()
    report = (run_dir / "report.md").read_text()
    for png in PLOTS:
        assert f"({png})" in report
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["domain"] == "synthetic-program"
    # the saved config is the resolved one, overrides included
    from wmrl.config import load_config

    saved = load_config(str(run_dir / "config.yaml"))
    assert saved.trainer.steps == 3 and saved.domain.real_delay_s == 0.0 and saved.run_dir == str(run_dir)


def test_eval_prints_heldout_rewards(run):
    run_dir, _ = run
    proc = wmrl("eval", str(run_dir), cwd=run_dir.parent)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json_lines(proc.stdout)
    assert len(out) == 1, proc.stdout
    assert set(out[0]) == {"test_id", "test_ood"}
    assert all(isinstance(v, float) for v in out[0].values())


def test_export_errors_are_one_line(run, tmp_path):
    run_dir, _ = run
    proc = wmrl("export", str(run_dir), str(tmp_path / "out"), cwd=tmp_path)
    # found once the run is loaded, after DeepSpeed's import may have warned: the last line, no traceback
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("wmrl export: error: ProgramPolicy cannot export itself")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    line = assert_one_error_line(wmrl("export", str(fresh), str(tmp_path / "out2"), cwd=tmp_path), "export")
    assert "no checkpoint yet" in line


def test_eval_reuse_on_a_copied_run_returns_the_copys_trained_score(run, tmp_path):
    import shutil

    run_dir, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    proc = wmrl("eval", str(copy), "--reuse", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr[-4000:]
    final = json.loads((run_dir / "summary.json").read_text())["history"][-1]
    assert json_lines(proc.stdout)[0] == {s: final[f"eval_{s}"] for s in ("test_id", "test_ood")}
    assert not (elsewhere / "runs").exists() and not (run_dir.parent / "runs").exists()  # nothing written elsewhere
    assert (copy / "eval" / "reuse-step3.md").is_file()


def test_eval_draws_fresh_episodes_each_time_and_writes_a_per_task_table(run, tmp_path):
    import shutil
    import sqlite3

    run_dir, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    first = wmrl("eval", str(copy), "--split", "test_id", cwd=tmp_path)
    second = wmrl("eval", str(copy), "trainer.eval_samples=2", "--split", "test_id", cwd=tmp_path)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr[-2000:], second.stderr[-2000:])
    assert "| task | n | reward | ok |" in first.stdout
    reports = [Path(p.stdout.split("results: ")[-1].strip()) for p in (first, second)]
    k = int(reports[0].stem.removeprefix("cli"))  # the copied run may hold earlier evaluations
    assert reports == [copy / "eval" / f"cli{k}.md", copy / "eval" / f"cli{k + 1}.md"]
    one, two = (json.loads(r.with_suffix(".json").read_text()) for r in reports)
    assert one["step"] == two["step"] == 3 and one["episodes"] == f"fresh, tag cli{k}"
    rows1, rows2 = one["splits"]["test_id"]["tasks"], two["splits"]["test_id"]["tasks"]
    assert len(rows1) == len(rows2) > 1 and all(r["n"] == 1 for r in rows1) and all(r["n"] == 2 for r in rows2)
    with sqlite3.connect(copy / "store.sqlite") as db:
        keys = [k for (k,) in db.execute("SELECT key FROM executions")]
    assert sum(key.startswith(f"eval-cli{k}/3/test_id/") for key in keys) == len(rows1)
    assert sum(key.startswith(f"eval-cli{k + 1}/3/test_id/") for key in keys) == 2 * len(rows2)


def test_eval_argument_mistakes_are_one_line(run, tmp_path):
    run_dir, _ = run
    line = assert_one_error_line(wmrl("eval", str(run_dir), "--step", "2", cwd=tmp_path), "eval")
    assert "no checkpoint of step 2; it has steps [3]" in line
    line = assert_one_error_line(wmrl("eval", str(run_dir), "trainer.eval_samples=2", "--reuse", cwd=tmp_path),
                                 "eval")
    assert "--reuse reads back the run's own evaluation" in line
    line = assert_one_error_line(wmrl("eval", str(run_dir), "trainer.eval_sample=2", cwd=tmp_path), "eval")
    assert "eval_sample" in line


def test_report_rewrites_report(run):
    run_dir, _ = run
    for name in ("report.md", *PLOTS):
        (run_dir / name).unlink()
    proc = wmrl("report", str(run_dir), cwd=run_dir.parent)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"report: {run_dir / 'report.md'}" in proc.stdout
    assert (run_dir / "report.md").read_text().startswith("# wmrl run report: synthetic-program / mode wmrl")
    for png in PLOTS:
        assert (run_dir / png).is_file()


def test_resume_with_different_config_exits_2(run):
    run_dir, _ = run
    before = (run_dir / "config.yaml").read_text()
    steps = metric_steps(run_dir)
    proc = wmrl("train", "synthetic-program", *TINY, "world_model.hack=0.1", f"run_dir={run_dir}", cwd=run_dir.parent)
    line = assert_one_error_line(proc, "train")
    assert str(run_dir) in line and "different config" in line
    assert (run_dir / "config.yaml").read_text() == before  # the run's config is untouched
    assert metric_steps(run_dir) == steps


def test_resume_with_more_steps_continues(run):
    run_dir, _ = run
    first = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(first) == 3
    more = [o for o in TINY if not o.startswith("trainer.steps=")] + ["trainer.steps=5"]
    proc = wmrl("train", "synthetic-program", *more, f"run_dir={run_dir}", "--no-report", cwd=run_dir.parent)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json_lines(proc.stdout)[0]["final"]["step"] == 5
    assert metric_steps(run_dir) == [1, 2, 3, 4, 5]
    # resumed, not restarted: the first rows (with their wall-clock timings) are kept as they were
    assert (run_dir / "metrics.jsonl").read_text().splitlines()[:3] == first
    history = json.loads((run_dir / "summary.json").read_text())["history"]
    assert [h["step"] for h in history] == [0, 3, 5]
    assert (run_dir / "checkpoints" / "latest").read_text().strip().endswith("5")
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 5
