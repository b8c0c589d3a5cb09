"""The world-model runtime: failures become unknown grades, fits run in the background deterministically,
deadlines hold, warm start and checkpoints see a model at rest."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from wmrl.core.interfaces import WorldModel
from wmrl.core.types import Prediction, Task, Trajectory, Transition
from wmrl.core.wm_runtime import RuntimeConfig, WorldModelRuntime


class Counting(WorldModel):
    """Grades every trajectory with the number of trajectories fitted so far; fits wait for `gate`."""

    def __init__(self, gate: threading.Event | None = None, fail_fit: bool = False, answer=None):
        self.fitted, self.gate, self.fail_fit, self.answer = 0, gate, fail_fit, answer

    def reset(self, tasks):
        self.n = len(tasks)
        return [None] * len(tasks)

    def step(self, actions):
        return [None if a is None else Transition(None, float(self.fitted), True, reward_var=0.0) for a in actions]

    def predict(self, trajectories):
        if self.answer is not None:
            return self.answer(trajectories)
        return super().predict(trajectories)

    def fit(self, anchors):
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail_fit:
            raise MemoryError("out of memory")
        self.fitted += len(anchors)

    def state_dict(self):
        return {"fitted": self.fitted}


def trajs(n: int) -> list[Trajectory]:
    return [Trajectory(task=Task(f"t{i}"), source="real", actions=[i], step_rewards=[0.0]) for i in range(n)]


def test_a_background_fit_returns_at_once_and_the_next_call_waits_for_it():
    gate = threading.Event()
    runtime = WorldModelRuntime(Counting(gate), RuntimeConfig(background_fit=True))
    runtime.learn(trajs(3))  # returns although the fit is blocked
    assert runtime.model.fitted == 0
    graded = trajs(2)
    threading.Timer(0.2, gate.set).start()
    runtime.grade(graded)  # queued behind the fit: it sees the finished fit, never a half-way model
    assert [t.wm.mean for t in graded] == [3.0, 3.0]
    # and the same calls without a background fit give the same grades: the run is as deterministic
    sync = WorldModelRuntime(Counting(), RuntimeConfig())
    sync.learn(trajs(3))
    again = trajs(2)
    sync.grade(again)
    assert [t.wm.mean for t in again] == [3.0, 3.0]


def test_a_failing_fit_is_logged_and_the_model_keeps_what_it_had(caplog):
    for background in (False, True):
        runtime = WorldModelRuntime(Counting(fail_fit=True), RuntimeConfig(background_fit=background))
        with caplog.at_level(logging.WARNING, logger="wmrl.core.wm_runtime"):
            runtime.learn(trajs(2))
            runtime.wait()
        assert "out of memory" in caplog.text and runtime.state_dict() == {"fitted": 0}
        caplog.clear()


@pytest.mark.parametrize("answer, error", [
    (lambda ts: [Prediction(0.5)], "predict returned 1 predictions for 3 trajectories"),
    (lambda ts: [Prediction(float("nan"), 0.1)] * len(ts), "non-finite mean"),
    (lambda ts: [Prediction(0.5, -1.0)] * len(ts), "invalid variance"),
])
def test_bad_predictions_become_unknown_grades(answer, error):
    runtime = WorldModelRuntime(Counting(answer=answer), RuntimeConfig())
    graded = trajs(3)
    runtime.grade(graded)
    assert all(t.wm.mean is None and error in t.wm.error for t in graded)


def test_a_call_past_its_deadline_is_unknown_and_the_busy_model_fails_fast_until_free():
    gate = threading.Event()
    runtime = WorldModelRuntime(Counting(gate), RuntimeConfig(timeout_s=0.2))
    runtime.learn(trajs(1))  # overruns: logged, not raised
    assert runtime.timeouts == 1
    graded = trajs(2)
    runtime.grade(graded)  # the model is still inside the late fit: no second thread enters it
    assert all(t.wm.mean is None and "still busy" in t.wm.error for t in graded)
    gate.set()
    runtime.wait()
    runtime.grade(graded)
    assert [t.wm.mean for t in graded] == [1.0, 1.0]  # it serves again, with the late fit done


def test_a_call_is_not_charged_for_the_background_fit_queued_before_it():
    gate = threading.Event()
    runtime = WorldModelRuntime(Counting(gate), RuntimeConfig(background_fit=True, timeout_s=0.5))
    runtime.learn(trajs(2))
    threading.Timer(0.35, gate.set).start()  # the fit takes 0.35 s, the grade almost nothing: 0.35 + 0.35 > 0.5
    graded = trajs(1)
    time.sleep(0.3)
    runtime.grade(graded)
    assert graded[0].wm.mean == 2.0 and runtime.timeouts == 0
    # a fit past the deadline makes the model late: the call fails fast, the next one after it serves
    slow = threading.Event()
    late = WorldModelRuntime(Counting(slow), RuntimeConfig(background_fit=True, timeout_s=0.2))
    late.learn(trajs(3))
    late.grade(graded)
    assert graded[0].wm.mean is None and "overran" in graded[0].wm.error and late.timeouts == 1
    slow.set()
    late.wait()
    late.grade(graded)
    assert graded[0].wm.mean == 3.0


def test_close_stops_the_worker_thread_and_the_model_stays_usable():
    workers = lambda: sum(t.name == "wmrl-wm" for t in threading.enumerate())  # noqa: E731
    before = workers()
    runtime = WorldModelRuntime(Counting(), RuntimeConfig(background_fit=True))
    runtime.learn(trajs(2))
    runtime.close()
    time.sleep(0.05)
    assert workers() == before
    graded = trajs(1)
    runtime.grade(graded)
    assert graded[0].wm.mean == 2.0
