"""Scorers that fail: NaN, exceptions, out-of-range rewards. The run goes on; nothing is scored 0."""

import math
import time

import numpy as np
import pytest

from wmrl.core.anchors import AnchorConfig
from wmrl.core.engine import EngineConfig
from wmrl.core.estimators import EstimatorConfig
from wmrl.core.metrics import read_jsonl
from wmrl.core.store import RunStore
from wmrl.core.trainer import Trainer, TrainerConfig
from wmrl.core.types import Transition
from wmrl.core.wm_runtime import RuntimeConfig
from wmrl.domains.synthetic.program import DistortedConfig, ProgramConfig, ProgramDomain, ProgramEnv, ProgramWorldModel


class NaNWorldModel(ProgramWorldModel):
    """Returns NaN for every third episode of a batch."""

    def step(self, actions):
        out = super().step(actions)
        return [Transition(None, float("nan"), True) if (tr is not None and i % 3 == 0) else tr for i, tr in enumerate(out)]


class RaisingWorldModel(ProgramWorldModel):
    """Raises throughout every other training step (a WM server that comes and goes).

    Each step calls the WM twice: grading the anchors, then simulating the other groups.
    """

    calls = 0

    def step(self, actions):
        RaisingWorldModel.calls += 1
        if (RaisingWorldModel.calls - 1) // 2 % 2 == 0:
            raise ConnectionError("world-model server went away")
        return super().step(actions)


class HangingWorldModel(ProgramWorldModel):
    """Every 4th call to step hangs for far longer than the trainer's deadline."""

    calls = 0

    def step(self, actions):
        HangingWorldModel.calls += 1
        if HangingWorldModel.calls % 4 == 0:
            time.sleep(1.5)
        return super().step(actions)


class FlakyEnv(ProgramEnv):
    """Sandbox infrastructure failure on every 5th execution; an out-of-range reward on every 7th."""

    def step_each(self, actions):
        for arrived in super().step_each(actions):
            yield [(i, Transition(None, None, True, info={"status": "infra"}) if i % 5 == 0
                    else Transition(None, 3.5, True, info={"status": "ok"}) if i % 7 == 0 else tr)
                   for i, tr in arrived]


def _run(tmp_path, wm_cls=ProgramWorldModel, env_cls=ProgramEnv, mode="wmrl", steps=6, wm_timeout_s=0.0):
    class Dom(ProgramDomain):
        def make_world_model(self, cfg):
            return wm_cls(self.world, cfg)

        def make_real_env(self):
            return env_cls(self.world)

    wm = DistortedConfig(type="program-distorted", runtime=RuntimeConfig(timeout_s=wm_timeout_s))
    t = Trainer(Dom(ProgramConfig()), trainer=TrainerConfig(steps=steps, eval_every=0, eval_samples=1),
                estimator=EstimatorConfig(mode=mode), anchors=AnchorConfig(fraction=0.25), engine=EngineConfig(),
                world_model=wm, run_dir=tmp_path, tensorboard=False)
    history = t.train()
    t.close()
    return history, read_jsonl(tmp_path / "metrics.jsonl")


def test_nan_from_the_world_model_is_an_unknown_grade_counted_in_metrics(tmp_path):
    history, rows = _run(tmp_path, wm_cls=NaNWorldModel)
    assert len(rows) == 6
    assert all(r["unknown_wm"] > 0 for r in rows)
    # WM-group unknowns are excluded from the loss; anchors with a NaN WM grade still train on the real one
    assert all(0 < r["excluded"] < r["unknown_wm"] for r in rows)
    assert all(math.isfinite(r["loss"]) for r in rows)
    with RunStore(tmp_path / "store.sqlite") as store:
        pairs = store.anchor_pairs()
    assert pairs and all(math.isfinite(p.wm_mean) for p in pairs)  # NaN never became a pair


def test_a_raising_world_model_does_not_stop_the_run(tmp_path):
    history, rows = _run(tmp_path, wm_cls=RaisingWorldModel)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert max(r["unknown_wm"] for r in rows) == 64  # a whole step's WM grades lost, anchors included
    assert min(r["unknown_wm"] for r in rows) == 0  # and the steps in between were fine
    assert np.isfinite(history[-1]["eval_test_id"])


def test_real_infrastructure_failures_and_bad_rewards_are_unknown_never_zero(tmp_path):
    history, rows = _run(tmp_path, env_cls=FlakyEnv, mode="real", steps=3)
    assert all(r["unknown_real"] > 0 for r in rows)
    with RunStore(tmp_path / "store.sqlite") as store:
        recs = store.get_executions([f"s1g{g}m{m}" for g in range(8) for m in range(8)])
    assert len(recs) == 64  # every execution stored, failures included
    infra = [r for r in recs.values() if r.status == "infra"]
    assert infra and all(r.reward is None for r in infra)
    assert all(r.reward is None or 0.0 <= r.reward <= 1.0 for r in recs.values())


def test_a_hanging_world_model_costs_unknown_grades_not_the_run(tmp_path):
    history, rows = _run(tmp_path, wm_cls=HangingWorldModel, wm_timeout_s=0.3, steps=8)
    assert len(rows) == 8 and all(math.isfinite(r["loss"]) for r in rows)
    # without the deadline every hang would only be slow and every grade known
    assert sum(r["unknown_wm"] for r in rows) > 0  # the overrun calls, and those made while it was still busy
    assert any(r["unknown_wm"] == 0 for r in rows)  # and it serves again once free


def test_a_failing_step_observer_is_counted_not_fatal(tmp_path):
    t = Trainer(ProgramDomain(ProgramConfig()), trainer=TrainerConfig(steps=4, eval_every=0, eval_samples=1),
                estimator=EstimatorConfig(mode="wmrl"), anchors=AnchorConfig(fraction=0.25), engine=EngineConfig(),
                run_dir=tmp_path, tensorboard=False)

    def flaky(step, groups, est):
        if step % 2:
            raise RuntimeError("diagnostic bug")
        return {"groups_seen": float(len(groups))}

    t.observers.append(flaky)
    t.train()
    t.close()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["observer_errors"] for r in rows] == [1.0, 0.0, 1.0, 0.0]
    assert [r.get("groups_seen") for r in rows] == [None, 8.0, None, 8.0]
    assert all(0.0 < r["reward_oracle"] < 1.0 for r in rows)  # the default oracle observer ran beside it
