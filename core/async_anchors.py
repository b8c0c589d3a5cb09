"""Asynchronous anchors: a step's anchor groups execute on the real pool while the loop goes on.

With synchronous anchors every step waits for its slowest anchor program, so
real execution stays on the critical path and the speed-up over all-real
training is bounded by 1 / ((1 - s) + s * rho) (s: real execution's share of a
real step). Here a step generates its anchor groups' replies itself (the step's
policy and generator, so nothing about sampling changes), hands them to one
worker thread that executes them in a `RealEnv` of its own, and goes on with
the world-model groups and the update. An environment holds one batch's
episode state, so the worker's is never the one the loop evaluates with.

The batch of step s is consumed at step s + k exactly (k =
`anchors.max_staleness`), or at the last step if that comes first; the loop
blocks there if it has not landed. A fixed lag makes a run the same whatever
the timing, so a resumed run computes what the first one did. How a landed
batch is used is `anchors.stale_use`:

* `train`: its groups join step s + k's batch as anchor groups with their real
  rewards; their ratio is taken against the behaviour log-probability recorded
  when the replies were sampled (PPO's clipped importance ratio, off-policy by
  k updates), and their pairs feed the debiaser and denoiser. With k = 0 this
  is the synchronous loop exactly.
* `calibrate`: every group trains at its own step on world-model grades (the
  anchors' replies are graded by the world model before they run); the landed
  pairs only calibrate.

Durability: each execution is committed to the run store the moment it ends,
by the same code as a synchronous step's (`Trainer._real`). A checkpoint holds
the batches not yet consumed (task ids, replies, log-probabilities); a resumed
run submits them again and the store plays back what had finished, so an
execution in flight at a crash runs again only if it had not finished.

Single-turn domains only: a multi-turn episode calls the policy between
executions, which would need a frozen copy of the actor per batch in flight.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from wmrl.core.interfaces import Policy
from wmrl.core.types import Task, Trajectory

__all__ = ["STALE_USES", "AnchorBatch", "AnchorPipeline", "RecordedReplies"]

STALE_USES = ("train", "calibrate")


@dataclass
class AnchorBatch:
    """One step's anchor groups: sampled, not yet graded by the real environment."""

    step: int
    group_ids: list[str]
    tasks: list[Task]  # one per episode (group-major)
    keys: list[str]  # the run store's key of each episode
    actions: list[Any]
    log_probs: list[float]
    future: Future | None = field(default=None, repr=False)

    def state(self) -> dict:
        """What a checkpoint keeps (tasks by id: the domain rebuilds them)."""
        return {"step": self.step, "group_ids": list(self.group_ids), "task_ids": [t.id for t in self.tasks],
                "keys": list(self.keys), "actions": list(self.actions), "log_probs": list(self.log_probs)}

    @classmethod
    def from_state(cls, state: dict, tasks_by_id: dict[str, Task]) -> "AnchorBatch":
        missing = [t for t in state["task_ids"] if t not in tasks_by_id]
        if missing:
            raise ValueError(f"the checkpoint's anchors in flight name train task {missing[0]!r}, which the domain "
                             "no longer has: resume with the task set the run started with")
        return cls(int(state["step"]), list(state["group_ids"]), [tasks_by_id[t] for t in state["task_ids"]],
                   list(state["keys"]), list(state["actions"]), [float(x) for x in state["log_probs"]])


@dataclass
class Landed:
    batch: AnchorBatch
    trajectories: list[Trajectory]
    execution_time: float  # the worker's wall on this batch
    fresh: int  # executions it ran (the others were played back from the store)
    waited: float  # how long the loop blocked for it


class RecordedReplies(Policy):
    """Plays back replies sampled earlier, so the rollout records them with their behaviour log-probs."""

    def __init__(self, actions: Sequence[Any], log_probs: Sequence[float]):
        self.module = torch.nn.Module()
        self._next = list(zip(actions, log_probs))

    def act(self, observations, *, generator=None, greedy=False):
        if len(observations) != len(self._next):
            raise RuntimeError(f"{len(self._next)} recorded replies for {len(observations)} episodes")
        out, self._next = self._next, []
        return [a for a, _ in out], [lp for _, lp in out]

    def log_prob(self, observations, actions) -> torch.Tensor:
        raise NotImplementedError("recorded replies are played back, never trained")


class AnchorPipeline:
    """Anchor batches in flight on one worker thread, consumed in step order at a fixed lag."""

    def __init__(self, execute: Callable[[AnchorBatch], tuple[list[Trajectory], float, int]], max_staleness: int):
        if max_staleness < 0:
            raise ValueError("anchors.max_staleness must be >= 0 (or null for synchronous anchors)")
        self.k = max_staleness
        self._execute = execute
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="wmrl-anchors")
        self.pending: list[AnchorBatch] = []

    def submit(self, batch: AnchorBatch) -> None:
        """Queue `batch` behind those in flight (and any restored ones, which start now)."""
        self.pending.append(batch)
        self._start()

    def _start(self) -> None:
        for b in self.pending:  # in step order: restored ones first
            if b.future is None:
                b.future = self._worker.submit(self._execute, b)

    def restore(self, batch: AnchorBatch) -> None:
        """A batch from a checkpoint: it starts with the next `submit` or `due`, so an evaluation of the
        checkpoint alone runs none of it."""
        self.pending.append(batch)

    def due(self, step: int, *, last: bool) -> list[Landed]:
        """The batches step `step` consumes (those k steps old, every one at the last step), oldest first;
        blocks until they have landed. A batch whose execution raised raises here."""
        self._start()  # restored batches not sent yet (a step with no anchors of its own)
        take = [b for b in self.pending if last or step - b.step >= self.k]
        out = []
        for b in take:
            t0 = time.perf_counter()
            trajectories, execution_time, fresh = b.future.result()
            out.append(Landed(b, trajectories, execution_time, fresh, time.perf_counter() - t0))
            self.pending.remove(b)
        return out

    def settle(self) -> float:
        """Wait until nothing is executing (before the loop uses the real environment itself); the wait."""
        t0 = time.perf_counter()
        for b in self.pending:
            if b.future is not None:
                b.future.exception()  # waits; what it raised comes out when the batch is consumed
        return time.perf_counter() - t0

    def state_dict(self) -> list[dict]:
        return [b.state() for b in self.pending]

    def close(self) -> None:
        """Let the batch executing finish (what it pays for is stored), drop those still queued."""
        for b in self.pending:
            if b.future is not None:
                b.future.cancel()
        self._worker.shutdown(wait=True)
        self.pending = []
