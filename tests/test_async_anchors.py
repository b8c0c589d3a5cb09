"""Asynchronous anchors: the lag is exactly k, k = 0 is the synchronous loop, late groups train or only calibrate.

(A run killed with anchor batches in flight is in tests/test_durability.py.)
"""

from __future__ import annotations

import collections
import re
import signal

import pytest
import torch

from wmrl.api import build_trainer
from wmrl.config import load_config
from wmrl.core.errors import Interrupted
from wmrl.core.metrics import read_jsonl
from wmrl.core.store import RunStore

BASE = ["trainer.eval_every=3", "trainer.eval_samples=1", "trainer.checkpoint_every=3", "tensorboard=false",
        "domain.real_delay_s=0", "trainer.groups_per_step=4", "trainer.group_size=4", "anchors.fraction=0.5"]


def _cfg(run_dir, steps, *extra, config="synthetic-program"):
    return load_config(config, [f"run_dir={run_dir}", f"trainer.steps={steps}", *BASE, *extra])


def _train(cfg, observer=None):
    trainer = build_trainer(cfg)
    if observer is not None:
        trainer.observers.append(observer)
    try:
        trainer.train()
        weights = [p.detach().clone() for p in trainer.policy.module.parameters()]
        return weights, trainer.estimator.state_dict()
    finally:
        trainer.close()


def _stored(run_dir):
    with RunStore(run_dir / "store.sqlite") as store:
        executions = {r.key: (r.task_id, r.status, r.reward) for r in store.executions("run")}
        pairs = sorted((p.step, p.group_id, p.member, p.wm_mean, p.real) for p in store.anchor_pairs("run"))
    return executions, pairs


def _signal(row):
    return {k: v for k, v in row.items() if k not in {"wall", "real_wall", "eval_time"} and not k.startswith("time_")}


def test_with_no_lag_asynchronous_anchors_are_the_synchronous_loop_exactly(tmp_path):
    w_sync, est_sync = _train(_cfg(tmp_path / "sync", 6))
    w_async, est_async = _train(_cfg(tmp_path / "async", 6, "anchors.max_staleness=0"))
    assert all(torch.equal(a, b) for a, b in zip(w_sync, w_async))
    assert est_async == est_sync
    assert _stored(tmp_path / "async") == _stored(tmp_path / "sync")
    rows_sync = read_jsonl(tmp_path / "sync" / "metrics.jsonl")
    rows_async = read_jsonl(tmp_path / "async" / "metrics.jsonl")
    assert len(rows_async) == len(rows_sync) == 6
    for a, b in zip(rows_sync, rows_async):
        extra = {"anchor_staleness", "anchor_batches_in_flight"}  # what only the asynchronous loop reports
        assert {k: v for k, v in _signal(b).items() if k not in extra} == _signal(a)
        assert b["anchor_staleness"] == 0 and b["anchor_batches_in_flight"] == 0


def _anchor_steps(seen):
    """An observer recording, per step, the step each anchor group was sampled at and its weights."""

    def observe(step, groups, est):
        seen[step] = [(int(re.match(r"s(\d+)g", g.id).group(1)), g.train, ws)
                      for g, ws in zip(groups, est.weights) if g.anchor]
        return {}

    return observe


@pytest.mark.parametrize("k", [1, 2])
def test_a_late_anchor_group_is_used_exactly_k_steps_later_and_the_last_step_takes_all(tmp_path, k):
    seen: dict[int, list] = {}
    _train(_cfg(tmp_path / "run", 7, f"anchors.max_staleness={k}"), _anchor_steps(seen))
    for step in range(1, 8):
        ages = {step - s for s, _, _ in seen[step]}
        if step <= k:
            assert not ages  # nothing has had k steps to land
        elif step < 7:
            assert ages == {k}
        else:  # the last step takes what is still in flight: never older than k
            assert ages == set(range(k + 1))
        assert all(trained and any(w > 0 for w in ws) for _, trained, ws in seen[step])
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["anchor_staleness"] for r in rows] == [None] * k + [k] * (7 - k)
    # every sampled anchor was executed once and used once
    executions, pairs = _stored(tmp_path / "run")
    trained = sum(r["real_executions"] for r in rows)
    assert len([key for key in executions if key.startswith("s")]) == trained == 7 * 2 * 4
    assert len(pairs) == trained


def test_under_stale_use_calibrate_late_groups_only_calibrate_and_every_group_trains_at_its_own_step(tmp_path):
    seen: dict[int, list] = {}
    _train(_cfg(tmp_path / "run", 5, "anchors.max_staleness=1", "anchors.stale_use=calibrate"), _anchor_steps(seen))
    for step in range(2, 6):
        assert seen[step] and all(not trained and all(w == 0 for w in ws) for _, trained, ws in seen[step])
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert all(r["trained_trajectories"] == 4 * 4 for r in rows)  # all four groups of the step, anchors too
    assert rows[-1]["calibrated"] == 1.0  # the landed pairs fitted the debiaser
    assert len(_stored(tmp_path / "run")[1]) == 5 * 2 * 4


def test_a_run_stopped_with_anchors_in_flight_resumes_exactly_and_runs_each_once(tmp_path):
    """Each batch takes a while (real_delay_s): the one still queued at the stop is dropped by `close` and runs,
    once, after the resume; the one that had finished is played back from the store."""

    def cfg(run, *extra):
        return _cfg(tmp_path / run, 7, "anchors.max_staleness=2", "domain.real_delay_s=0.05",
                    f"domain.ledger={tmp_path / run}.ledger", *extra)

    straight = _train(cfg("a"))

    def stop_after_step_4(step, groups, est):
        if step == 4:
            signal.raise_signal(signal.SIGTERM)  # the loop stops after this step, at a checkpoint
        return {}

    trainer = build_trainer(cfg("b"))
    trainer.observers.append(stop_after_step_4)
    with pytest.raises(Interrupted):
        trainer.train()
    in_flight = [b.step for b in trainer.pipeline.pending]
    trainer.close()
    assert in_flight == [3, 4]
    for other in ("anchors.max_staleness=null", "anchors.max_staleness=1", "anchors.stale_use=calibrate"):
        with pytest.raises(ValueError, match="resume with the anchors.max_staleness it ran with"):
            build_trainer(cfg("b", other))
    resumed = _train(cfg("b"))
    assert all(torch.equal(a, b) for a, b in zip(straight[0], resumed[0]))
    assert resumed[1] == straight[1]
    assert _stored(tmp_path / "b") == _stored(tmp_path / "a")
    ran = [collections.Counter((tmp_path / f"{run}.ledger").read_text().splitlines()) for run in ("a", "b")]
    assert ran[1] == ran[0]  # the same executions, each paid for once


@pytest.mark.parametrize("extra, config, message", [
    (["anchors.max_staleness=1"], "synthetic-control", "needs a single-turn domain"),
    (["anchors.max_staleness=1", "anchors.stale_use=calibrate", "estimator.rectified=true"], "synthetic-program",
     "use stale_use=train"),
    (["anchors.max_staleness=1", "trainer.objective.ratio=token"], "synthetic-program", "no importance correction"),
    (["anchors.max_staleness=-1"], "synthetic-program", "anchors.max_staleness must be an integer >= 0"),
    (["anchors.max_staleness=1", "estimator.mode=wm"], "synthetic-program", "runs no anchors"),
    (["anchors.max_staleness=1", "anchors.stale_use=calibrate", "estimator.mode=real"], "synthetic-program",
     "trains on real grades only"),
    (["anchors.max_staleness=1", "estimator.rectified=true"], "synthetic-program", "a step mixes groups"),
    (["anchors.max_staleness=1", "anchors.stale_use=later"], "synthetic-program", "anchors.stale_use must be one of"),
])
def test_what_asynchronous_anchors_cannot_do_is_refused_with_the_fix(tmp_path, extra, config, message):
    with pytest.raises(ValueError, match=message):
        build_trainer(_cfg(tmp_path / "run", 2, *extra, config=config))


def test_held_out_evaluation_never_runs_beside_anchors_in_flight(tmp_path):
    trainer = build_trainer(_cfg(tmp_path / "run", 6, "anchors.max_staleness=2", "domain.real_delay_s=0.02"))
    held_out, seen = trainer.held_out, []

    def checked(split, **kwargs):
        seen.append([b.future.done() for b in trainer.pipeline.pending if b.future is not None])
        return held_out(split, **kwargs)

    trainer.held_out = checked
    try:
        trainer.train()
    finally:
        trainer.close()
    assert len(seen) == 3 * 2  # before, at step 3 and at step 6; two splits each
    assert any(seen) and all(all(done) for done in seen)  # batches were pending at step 3, none executing


def test_the_anchor_environment_opens_with_the_first_step_and_not_for_an_evaluation(tmp_path):
    trainer = build_trainer(_cfg(tmp_path / "run", 2, "anchors.max_staleness=1"))
    try:
        trainer.held_out("test_id")
        assert trainer.anchor_env is None  # what `wmrl eval` builds: one real environment, not two
        trainer.train()
        assert trainer.anchor_env is not None
    finally:
        trainer.close()
