"""The one owner of a world model's lifecycle in a run: deadlines, failures, background fits, warm start.

A world model may be a remote LLM server, a big network or a user's code; the
trainer must go on whatever it does. `WorldModelRuntime` wraps the model and is
what the trainer, `wmrl eval-wm` and the benchmarks talk to:

- **grades** (`grade`): the model's predictions for trajectories rolled out
  elsewhere, re-checked (`Prediction.checked`: finite mean, non-negative
  variance) and attached as `traj.wm`; a call that raises, returns the wrong
  number of predictions or overruns its deadline leaves unknown grades, which
  the estimator excludes and counts (`unknown_wm`). Rollouts inside the model
  go through `reset`/`step`, which the rollout loop already turns into unknown
  grades when they raise.
- **deadline** (`timeout_s`): every call runs on one worker thread and the
  caller waits at most `timeout_s` for it. A late call cannot be killed, so
  until it returns every further call fails fast the same way: the model is
  never entered by two threads at once, and it serves again once free (a late
  fit still lands then).
- **learning** (`learn`): the step's real-graded anchors are fitted; a fit that
  raises is logged and the model keeps what it had. With `background_fit` the
  fit is queued on the worker thread and the step goes on: it overlaps the
  policy update and the next step's real execution, and the next call to the
  model first waits for it, so every prediction comes from a finished fit and
  a run is as deterministic as without it. That wait has its own `timeout_s`;
  a fit past it makes the model late, as above.
- **warm start** (`warm_start`): before the first step, the model is fitted on
  other runs' real training executions (never their evaluation episodes),
  without a deadline.
- **where** (`executor`): in this process, or in a Ray actor on another
  machine or GPU (`core/wm_remote.py`), which is replaced and restored if it
  dies; every point above holds for both.
- **checkpoints** (`state_dict`): taken at rest, after queued work finished;
  a call that never returns therefore stalls the next checkpoint (it cannot
  hold a model half-way through a call). `close` stops the worker thread.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from wmrl.core.interfaces import WorldModel
from wmrl.core.replay import read_trajectories
from wmrl.core.types import Prediction, Trajectory, Transition

log = logging.getLogger(__name__)


@dataclass
class RuntimeConfig:
    timeout_s: float = 0.0  # deadline per world-model call (0: none); a call past it is an unknown grade
    background_fit: bool = False  # fit on the worker thread while the step goes on (the next call waits for it)
    warm_start: list[str] = field(default_factory=list)  # run stores whose training executions pre-fit the WM
    executor: str = "local"  # "ray": the model lives in a Ray actor (`core/wm_remote.py`), replaced if it dies
    ray_address: str | None = None  # executor ray: None starts a local Ray; "auto" / "ray://host:10001" joins one
    ray_cpus: float = 1.0  # what the actor asks Ray for
    ray_gpus: float = 0.0

    def validate(self) -> None:
        if self.executor not in ("local", "ray"):
            raise ValueError(f"world_model.runtime.executor must be local or ray, got {self.executor!r}")
        if self.ray_address is not None and self.executor != "ray":
            raise ValueError("world_model.runtime.ray_address is set but executor is not ray: set "
                             "world_model.runtime.executor=ray")
        for key in ("ray_cpus", "ray_gpus"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"world_model.runtime.{key} must be a finite number >= 0, got {value!r}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s >= 0):
            raise ValueError(f"world_model.runtime.timeout_s must be >= 0 (0: no deadline), got {self.timeout_s!r}")
        for path in self.warm_start:
            if not Path(path).is_file():
                raise ValueError(f"world_model.runtime.warm_start: no run store at {path}; point it at a run's store.sqlite")


def open_world_model(domain: Any, cfg: Any) -> WorldModelRuntime:
    """The world model `cfg` (a `world_model:` section) configures, built where its runtime says, and wrapped."""
    if cfg.runtime.executor == "ray":
        from wmrl.core.wm_remote import RemoteWorldModel

        return WorldModelRuntime(RemoteWorldModel(domain, cfg), cfg.runtime)
    return WorldModelRuntime(domain.make_world_model(cfg), cfg.runtime)


class WorldModelRuntime(WorldModel):
    def __init__(self, model: WorldModel, cfg: RuntimeConfig):
        self.model, self.cfg = model, cfg
        self.timeouts = 0
        self._late: Future | None = None  # a call that overran its deadline, still running
        self._fitting: Future | None = None  # the background fit the next call waits for
        self._jobs: queue.SimpleQueue | None = None
        if cfg.timeout_s > 0 or cfg.background_fit:
            self._jobs = queue.SimpleQueue()
            # a daemon thread: a call that never returns must not keep the process from exiting
            threading.Thread(target=self._work, name="wmrl-wm", daemon=True).start()

    # ------------------------------------------------------------------ the worker
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:  # close()
                return
            fut, fn, args = job
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:  # handed to whoever reads the future
                    fut.set_exception(exc)

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        self._jobs.put((fut, fn, args))
        return fut

    def _await(self, what: str, fut: Future, *, result: bool = True) -> Any:
        """The result of `fut` (or, `result=False`, its exception) within the deadline; past it, the
        model is late until `fut` is done."""
        try:
            timeout = self.cfg.timeout_s or None
            return fut.result(timeout=timeout) if result else fut.exception(timeout=timeout)
        except FutureTimeout:
            self._late, self.timeouts = fut, self.timeouts + 1
            log.warning("world model %s overran its %g s deadline (%d so far)", what, self.cfg.timeout_s, self.timeouts)
            raise TimeoutError(f"world model {what} overran {self.cfg.timeout_s:g} s") from None

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self._jobs is None:
            return fn(*args)
        if self._late is not None and not self._late.done():
            raise TimeoutError(f"world model still busy with a call that overran {self.cfg.timeout_s:g} s")
        self._late = None
        fitting, self._fitting = self._fitting, None
        if fitting is not None:  # its own deadline, so a call is not charged for the fit queued before it
            self._await("background fit", fitting, result=False)  # a failure is logged by _log_fit_failure
        return self._await(what, self._submit(fn, *args))

    # ------------------------------------------------------------------ the WorldModel shape, deadline-bound
    def reset(self, tasks) -> list[Any]:
        return self._call("reset", self.model.reset, tasks)

    def step(self, actions) -> list[Transition | None]:
        return self._call("step", self.model.step, actions)

    def predict(self, trajectories: Sequence[Trajectory]) -> list[Prediction]:
        return self._call("predict", self.model.predict, trajectories)

    def fit(self, anchors: Sequence[Trajectory]) -> None:
        self._call("fit", self.model.fit, anchors)

    # ------------------------------------------------------------------ what the trainer uses
    def grade(self, trajectories: Sequence[Trajectory]) -> None:
        """Attach the model's checked grade to each trajectory (`traj.wm`); unknown where it failed."""
        if not trajectories:
            return
        try:
            preds = self.predict(trajectories)
            if len(preds) != len(trajectories):
                raise RuntimeError(f"predict returned {len(preds)} predictions for {len(trajectories)} trajectories")
        except Exception as exc:
            log.warning("world model predict failed: %r; %d trajectories lack a WM grade", exc, len(trajectories))
            preds = [Prediction(None, error=repr(exc))] * len(trajectories)
        for traj, p in zip(trajectories, preds):
            traj.wm = p if p.mean is None else Prediction.checked(p.mean, p.var, p.samples)

    def learn(self, graded: Sequence[Trajectory]) -> None:
        """Fit on real-graded trajectories; a failing fit is logged and the model keeps what it had."""
        if not graded:
            return
        if not self.cfg.background_fit:
            try:
                self.fit(graded)
            except Exception as exc:  # a WM that fails to learn must not stop training
                log.warning("world model fit failed: %r", exc)
            return
        if self._late is not None and not self._late.done():
            log.warning("world model still busy with an overrun call; %d trajectories not fitted", len(graded))
            return
        self._fitting = self._submit(self.model.fit, list(graded))
        self._fitting.add_done_callback(_log_fit_failure)

    def warm_start(self) -> None:
        """Fit on the real training executions of the runs in `warm_start` (never their eval episodes)."""
        for path in self.cfg.warm_start:
            trajs = [s.trajectory for s in read_trajectories(path)]
            log.info("warm-starting the world model on %d real trajectories from %s", len(trajs), path)
            if trajs:
                self.wait()
                self.model.fit(trajs)

    def wait(self) -> None:
        """Block until every queued call and fit has finished, however long that takes (checkpoints, shutdown)."""
        if self._jobs is not None:
            self._submit(lambda: None).result()
        self._late = self._fitting = None

    def close(self) -> None:
        """Finish what is queued and stop the worker thread (the model stays usable, called inline)."""
        if self._jobs is not None:
            self.wait()
            self._jobs.put(None)
            self._jobs = None
        self.model.close()

    def state_dict(self) -> dict:
        self.wait()
        return self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.wait()
        self.model.load_state_dict(state)


def _log_fit_failure(fut: Future) -> None:
    if fut.exception() is not None:
        log.warning("world model background fit failed: %r; it keeps the previous fit", fut.exception())
