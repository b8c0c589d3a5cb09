"""A deadline on world-model calls, so a hung world model costs unknown grades, not the run.

A world model may be a remote LLM server or a big network; when one call hangs,
training must go on. `DeadlineWorldModel` runs every call of the wrapped model on
one worker thread and waits at most `timeout_s`. A call past its deadline raises
`TimeoutError`, which the rollout loop and the trainer already turn into unknown
grades (excluded, counted in `unknown_wm`). The late call cannot be killed, so
until it returns every further call fails fast the same way: the wrapped model
is never entered by two threads at once, and it serves again once it is free.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Sequence

from wmrl.core.interfaces import WorldModel
from wmrl.core.types import Prediction, Trajectory, Transition

log = logging.getLogger(__name__)


class DeadlineWorldModel(WorldModel):
    def __init__(self, inner: WorldModel, timeout_s: float):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.inner, self.timeout_s = inner, timeout_s
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        # a daemon thread: a call that never returns must not keep the process from exiting either
        threading.Thread(target=self._work, name="wmrl-wm", daemon=True).start()
        self._late: Future | None = None
        self.timeouts = 0

    def _work(self) -> None:
        while True:
            fut, fn, args = self._jobs.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:  # handed to the caller, who decides
                    fut.set_exception(exc)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self._late is not None and not self._late.done():
            raise TimeoutError(f"world model still busy with a {what} call that overran {self.timeout_s:g} s")
        self._late = None
        fut: Future = Future()
        self._jobs.put((fut, fn, args))
        try:
            return fut.result(timeout=self.timeout_s)
        except FutureTimeout:
            self._late, self.timeouts = fut, self.timeouts + 1
            log.warning("world model %s overran its %g s deadline (%d so far)", what, self.timeout_s, self.timeouts)
            raise TimeoutError(f"world model {what} overran {self.timeout_s:g} s") from None

    def reset(self, tasks) -> list[Any]:
        return self._call("reset", self.inner.reset, tasks)

    def step(self, actions) -> list[Transition | None]:
        return self._call("step", self.inner.step, actions)

    def predict(self, trajectories: Sequence[Trajectory]) -> list[Prediction]:
        return self._call("predict", self.inner.predict, trajectories)

    def fit(self, anchors: Sequence[Trajectory]) -> None:
        self._call("fit", self.inner.fit, anchors)

    def wait(self) -> None:
        if self._late is not None:
            self._late.result()  # a checkpoint needs the model at rest, however long that takes
            self._late = None
        self.inner.wait()

    def state_dict(self) -> dict:
        self.wait()
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.wait()
        self.inner.load_state_dict(state)
