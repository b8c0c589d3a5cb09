"""A world model that lives in a Ray actor: `world_model.runtime.executor: ray`.

A large world model (an LLM judge, a latent model on video) wants its own GPU
or node, away from the trainer's. `RemoteWorldModel` builds the configured
model inside one Ray actor (`RaySlots`, so it starts and is placed like the
execution slots) and forwards every `WorldModel` call to it; the trainer's
`WorldModelRuntime` wraps it as it wraps a local model, so deadlines,
background fits and checkpoints behave the same.

An actor that dies (its node lost, OOM, killed) fails the call in progress,
which the runtime turns into unknown grades, and a fresh actor takes its
place. The fresh one is brought back to where the dead one was, not to a
blank model: it loads the state the run last saved or loaded and re-fits, in
order, every batch fitted since; no call reaches it before that has worked.
For a fit that depends only on its data and the model's state (the learned
regressors, the latent ensembles: the tests check the grades) that is the same
model, so a lost actor costs time and the grades of one call, never what the
model had learned; a time-capped fit or a sampler that counts its calls (the
LLM outcome model) comes back close, not identical. A checkpoint's
`state_dict` is asked again of the restored actor instead of failing. Episodes
open inside the dead actor are gone with it: their steps fail and those
rollouts are unknown. An exception the model raises is that call's failure
alone: the actor lives on.

The actor builds the model from the run's config on its own node, so what the
model reads from disk (an agent folder, demonstrations) must be there too
(shared storage, or the same path on every node).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from wmrl.core.interfaces import WorldModel
from wmrl.core.ray_slots import RaySlots
from wmrl.core.types import Prediction, Trajectory, Transition

log = logging.getLogger(__name__)

__all__ = ["RemoteWorldModel"]


class WorldModelHost:
    """The Ray actor: the domain's world model, built on the actor's own machine."""

    def __init__(self, domain: Any, cfg: Any):
        self.model: WorldModel = domain.make_world_model(cfg)

    def call(self, method: str, *args: Any) -> tuple[bool, Any]:
        """(True, result), or (False, what the model raised): a model's error must not cost the actor."""
        try:
            return True, getattr(self.model, method)(*args)
        except Exception as exc:  # noqa: BLE001 - handed back to the trainer's side, which raises it
            return False, f"{type(exc).__name__}: {exc}"


class ActorLost(RuntimeError):
    """The world model's actor died during a call."""


class RemoteWorldModel(WorldModel):
    def __init__(self, domain: Any, cfg: Any):
        rt = cfg.runtime
        self.slots = RaySlots(WorldModelHost, 1, args=(domain, cfg), num_cpus=rt.ray_cpus, num_gpus=rt.ray_gpus,
                              address=rt.ray_address, name="world model", must_start=True)
        self._base: dict | None = None  # the state last saved or loaded
        self._fits: list[list[Trajectory]] = []  # the batches fitted since
        self._stale = False  # a fresh actor that has not been restored yet
        self.restarts = 0

    def _send(self, method: str, *args: Any) -> Any:
        kind, value = self.slots.call_each({0: ("call", (method, *args))}, timeout_s=None)[0]
        if kind != "ok":  # the actor is gone; call_each put a fresh one in its slot
            self._stale, self.restarts = True, self.restarts + 1
            raise ActorLost(f"world model {method} lost with its Ray actor ({value}); a fresh actor took its place")
        done, result = value
        if not done:
            raise RuntimeError(f"world model {method} failed in its Ray actor: {result}")
        return result

    def _call(self, method: str, *args: Any, again: bool = False) -> Any:
        """`method` on the actor, restored first if it is fresh; `again`: asked once more after a loss."""
        if self._stale:
            self._restore()
        try:
            return self._send(method, *args)
        except ActorLost:
            if not again:
                raise
            self._restore()
            return self._send(method, *args)

    def _restore(self) -> None:
        """Bring a fresh actor to the dead one's state: the last saved state, then every fit since."""
        if self._base is not None:
            self._send("load_state_dict", self._base)
        for batch in self._fits:
            self._send("fit", batch)
        self._stale = False
        log.warning("world model restored in a fresh Ray actor (%d fits replayed)", len(self._fits))

    def reset(self, tasks) -> list[Any]:
        return self._call("reset", list(tasks))

    def step(self, actions) -> list[Transition | None]:
        return self._call("step", list(actions))

    def predict(self, trajectories: Sequence[Trajectory]) -> list[Prediction]:
        return self._call("predict", list(trajectories))

    def fit(self, anchors: Sequence[Trajectory]) -> None:
        batch = list(anchors)
        self._call("fit", batch)
        self._fits.append(batch)  # only a fit that landed: a lost one is not part of the model

    def state_dict(self) -> dict:
        state = self._call("state_dict", again=True)  # a checkpoint must not fail for a lost actor
        self._base, self._fits = state, []
        return state

    def load_state_dict(self, state: dict) -> None:
        self._base, self._fits, self._stale = state, [], True  # the next call loads it, in whichever actor

    def close(self) -> None:
        if self.slots.actors:
            self.slots.call_each({0: ("call", ("close",))}, timeout_s=30.0)
        self.slots.close()
