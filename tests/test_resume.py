"""Checkpoints restore a run exactly; a killed run loses no anchor pair and executes nothing twice."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import torch

from wmrl.api import build_trainer
from wmrl.config import load_config
from wmrl.core.metrics import read_jsonl


def _cfg(run_dir, steps, **extra):
    over = [f"run_dir={run_dir}", f"trainer.steps={steps}", "trainer.checkpoint_every=3", "trainer.eval_every=3",
            "trainer.eval_samples=1", "tensorboard=false", "domain.real_delay_s=0"]
    return load_config("synthetic-program", over + [f"{k}={v}" for k, v in extra.items()])


def _weights(trainer):
    return [p.detach().clone() for p in trainer.policy.module.parameters()]


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    straight = build_trainer(_cfg(tmp_path / "a", 7))
    straight.train()
    w_straight, est_straight = _weights(straight), straight.estimator.state_dict()
    straight.close()

    first = build_trainer(_cfg(tmp_path / "b", 3))
    first.train()
    first.close()
    resumed = build_trainer(_cfg(tmp_path / "b", 7))
    assert resumed.step == 3
    resumed.train()
    for a, b in zip(w_straight, _weights(resumed)):
        assert torch.equal(a, b)
    assert resumed.estimator.state_dict() == est_straight
    rows_a = read_jsonl(tmp_path / "a" / "metrics.jsonl")
    rows_b = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in rows_b] == list(range(1, 8))
    for ra, rb in zip(rows_a, rows_b):  # same learning signal step by step (timings aside)
        for k in ("reward_estimated", "anchor_weight", "bias_reduction", "loss", "eval_test_id"):
            assert ra.get(k) == rb.get(k), (k, ra["step"])
    resumed.close()


def _store_counts(db):
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as c:
            return c.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def _pairs(db):
    with sqlite3.connect(db) as c:
        return set(c.execute("SELECT run_id, step, group_id, member, wm_mean, real FROM anchor_pairs").fetchall())


def test_killed_run_resumes_without_losing_pairs_or_executing_twice(tmp_path):
    run_dir, ledger = tmp_path / "run", tmp_path / "ledger.txt"
    cmd = [sys.executable, "-m", "wmrl.cli", "train", "synthetic-program", f"run_dir={run_dir}", "trainer.steps=16",
           "trainer.checkpoint_every=4", "trainer.eval_every=8", "trainer.eval_samples=1", "tensorboard=false",
           "domain.real_delay_s=0.05", f"domain.ledger={ledger}", "--no-progress", "--no-report"]
    # a fresh process group: drop the rendezvous variables this test process set for itself
    dist_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    env = {**{k: v for k, v in os.environ.items() if k not in dist_vars}, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    db = run_dir / "store.sqlite"
    # kill just after a commit lands past step 6's anchors (a checkpoint is at step 4)
    deadline = time.time() + 240
    seen = 0
    while time.time() < deadline:
        n = _store_counts(db)
        if n > seen:
            seen = n
            metrics = read_jsonl(run_dir / "metrics.jsonl")
            if metrics and metrics[-1]["step"] >= 6:
                break
        time.sleep(0.005)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _pairs(db)
    killed_at = read_jsonl(run_dir / "metrics.jsonl")[-1]["step"]
    assert 6 <= killed_at < 16 and before

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    after = _pairs(db)
    assert before <= after  # no anchor pair lost
    executed = ledger.read_text().splitlines()
    assert len(executed) == _store_counts(db)  # every real execution happened once and is stored
    steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    assert steps == list(range(1, 17))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["real_executions"] == len(executed)
    assert np.isfinite(summary["history"][-1]["eval_test_id"])
