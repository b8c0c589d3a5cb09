"""Replaying a run's store: `wmrl eval-wm` measures a WM only on outcomes it was not fitted on; warm start."""

import json

import numpy as np
import pytest

import wmrl
from wmrl.cli import main
from wmrl.core.interfaces import WorldModel
from wmrl.core.replay import read_trajectories
from wmrl.core.types import Transition
from wmrl.config import ConfigError, load_config
from wmrl.api import build_trainer
from wmrl.wm_eval import evaluate_world_model


class Memorizer(WorldModel):
    """Knows the real reward of every (task, action) it was fitted on, and nothing else (0.5)."""

    def __init__(self):
        self.seen: dict = {}

    def _key(self, task, action):
        return task.id, np.asarray(action).tobytes()

    def reset(self, tasks):
        self.tasks = list(tasks)
        return [None] * len(tasks)

    def step(self, actions):
        return [None if a is None else Transition(None, self.seen.get(self._key(t, a), 0.5), True, reward_var=0.01)
                for t, a in zip(self.tasks, actions)]

    def fit(self, anchors):
        for traj in anchors:
            self.seen[self._key(traj.task, traj.actions[-1])] = traj.real.reward


@wmrl.register_world_model("test-memorizer", domains=["synthetic-program"])
def _memorizer(domain, cfg):
    return Memorizer()


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    wmrl.train("synthetic-program", ["estimator.mode=real", "trainer.steps=4", "trainer.groups_per_step=4",
                                     "trainer.group_size=4", "trainer.eval_samples=2", "trainer.eval_every=0",
                                     f"run_dir={run_dir}", "tensorboard=false"])
    return run_dir


def test_predictions_are_out_of_sample_and_follow_the_step_order(real_run):
    res = evaluate_world_model(real_run, "test-memorizer", warmup=16)
    stored = read_trajectories(real_run / "store.sqlite")
    assert len(stored) == 4 * 4 * 4
    assert res["stream"]["n"] == len(stored) - 16  # the first step is the warm-up
    # a memorizer scored on what it was fitted on would be exact; out of sample it is far from it
    assert res["stream"]["mae"] > 0.1
    for split in ("test_id", "test_ood"):
        assert res[split]["n"] == 2 * 2 * 16  # evaluations (before, after) x eval_samples x held-out tasks
        assert res[f"{split}_warm"]["n"] == 2 * 16  # the round after the first, warmed up on the first
    written = json.loads((real_run / "wm_eval" / "test-memorizer.json").read_text())
    assert written["stream"]["n"] == res["stream"]["n"]
    assert (real_run / "wm_eval" / "test-memorizer-stream.png").exists()


def test_memorizer_is_exact_on_data_it_was_fitted_on(real_run):
    # the contrast that makes the test above meaningful: in-sample it would score MAE 0
    stored = read_trajectories(real_run / "store.sqlite")
    wm = Memorizer()
    wm.fit([s.trajectory for s in stored])
    preds = wm.predict([s.trajectory for s in stored])
    assert max(abs(p.mean - s.trajectory.real.reward) for p, s in zip(preds, stored)) == 0.0


def test_default_world_model_of_the_run_and_cli(real_run, capsys):
    assert main(["eval-wm", str(real_run), "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "stream: n=64" in out and "program-distorted.json" in out
    assert main(["eval-wm", str(real_run / "nope")]) == 2
    assert "not a wmrl run folder" in capsys.readouterr().err
    assert main(["eval-wm", str(real_run), "--world-model", "nope"]) == 2
    assert "unknown world model 'nope'" in capsys.readouterr().err


def test_warm_start_fits_the_world_model_on_another_runs_training_executions(real_run, tmp_path):
    cfg = load_config("synthetic-program", ["world_model.type=test-memorizer", "trainer.steps=1",
                                            f"world_model.runtime.warm_start=[{real_run / 'store.sqlite'}]",
                                            f"run_dir={tmp_path / 'b'}", "tensorboard=false"])
    trainer = build_trainer(cfg)
    try:
        train = read_trajectories(real_run / "store.sqlite")
        evals = read_trajectories(real_run / "store.sqlite", include_eval=True)
        assert len(evals) > len(train)
        memorizer = trainer.world_model.model
        expected = {memorizer._key(s.trajectory.task, s.trajectory.actions[-1]) for s in train}
        assert set(memorizer.seen) == expected  # the training stream, never the held-out episodes
    finally:
        trainer.close()
    with pytest.raises(ConfigError, match="warm_start: no run store"):
        load_config("synthetic-program", ["world_model.runtime.warm_start=[/nonexistent/store.sqlite]"])
