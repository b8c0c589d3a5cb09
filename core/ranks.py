"""The ranks of a multi-rank run: rank 0 collects, every rank learns.

`wmrl train ... engine.world_size=N` runs N processes (torch's launcher, one
per GPU; several nodes through its `--nnodes`/rendezvous or DeepSpeed's
hostfile). Rank 0 is the *leader*: the only process that generates rollouts,
executes real episodes, runs the world model and the estimator, and writes the
run folder (store, metrics, summary; it alone holds the run lock). The step's
graded groups and the estimate are then broadcast, and every rank computes the
surrogate on its own contiguous block of the step's turns (`SurrogateBatch.
micro_batches(rank=, world=)`); DeepSpeed averages the gradients, so each
rank's share is scaled by N and the update is the one a single rank would take
on the whole batch, up to floating-point summation order. Checkpoints are
collective (DeepSpeed writes each rank's shards; the leader seals them).

Why rank 0 alone collects: real executions and anchor pairs must be stored
once and drawn from one seeded stream, so a resumed run replays them exactly;
generation scales through the rollout engine and execution through the
execution pool (`executor: ray`), not through training ranks. The rollout runs
the leader's full copy of the weights; under ZeRO-3, which shards them, that
copy is a replica the trainer re-syncs after every update (`Trainer._sync_actor`).

Learner ranks wait in a broadcast while the leader executes and evaluates,
which can take long: the process group's collectives time out after
`COLLECTIVE_TIMEOUT` (DeepSpeed's default, 10 minutes, would kill them).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch

__all__ = ["COLLECTIVE_TIMEOUT", "Ranks", "block", "current_ranks"]

#: how long a rank waits in a collective (a learner, for the leader's real executions and evaluations)
COLLECTIVE_TIMEOUT = timedelta(hours=12)

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def broadcast(self, value: T | None) -> T:
        """The leader's `value` on every rank (pickled through the process group)."""
        if self.world == 1:
            return value  # type: ignore[return-value]
        box = [value if self.leader else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[return-value]

    def mean(self, value: float) -> float:
        """The mean of `value` over the ranks."""
        if self.world == 1:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=_device())
        torch.distributed.all_reduce(t)
        return float(t.item()) / self.world

    def all(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank (a decision one rank cannot take alone)."""
        if self.world == 1:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_device())
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        return bool(t.item())



def _device() -> torch.device:
    # NCCL reduces GPU tensors only; gloo CPU ones
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def block(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rank `rank`'s contiguous block [lo, hi) of n items over `world` ranks; sizes differ by at most one."""
    per, extra = divmod(n, world)
    lo = rank * per + min(rank, extra)
    return lo, lo + per + (rank < extra)


def current_ranks() -> Ranks:
    """The ranks of the process group this process belongs to (one rank without one)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return Ranks(torch.distributed.get_rank(), torch.distributed.get_world_size())
    return Ranks()
