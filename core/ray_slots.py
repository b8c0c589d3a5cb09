"""Execution slots as Ray actors: real execution spread over the machines of a Ray cluster.

Real execution is the expensive part of a step, and one machine's cores bound
how many sandboxes or simulators run at once. A `RaySlots` is N Ray actors of
one class (a sandbox slot, a simulator worker), each running one task at a time;
`run_each` hands tasks to free actors and yields results as they finish, so the
trainer commits each execution the moment it lands, exactly as with the local
pools. An actor that dies mid-task (its node lost, the process killed, OOM) is
not retried in place: that task's result is what `on_failure` makes of it (for
the domains: an unknown grade, never a zero) and a fresh actor takes the slot,
so the run goes on with the same capacity. A task that raises inside a live
actor is that task's failure alone.

Ray is an optional dependency (`pip install wmrl[ray]`) imported only here and
only when a pool is built. Without an address, a local Ray instance is started
with this process's cores and stopped with the pool; with `address` (e.g.
"auto" on a cluster node, or "ray://head:10001") the pool joins that cluster and
leaves it running. Ray schedules actors; nothing here places or balances them.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterator, Sequence, TypeVar

log = logging.getLogger(__name__)

__all__ = ["RaySlots", "import_ray"]

T = TypeVar("T")


def import_ray():
    """The `ray` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("executor: ray needs Ray: pip install 'wmrl[ray]' (or executor: local)") from exc
    return ray


class RaySlots:
    """`n` actors of `actor_cls` (built with `args`), one task each at a time; dead actors are replaced."""

    def __init__(self, actor_cls: type, n: int, *, args: Sequence[Any] = (), num_cpus: float = 1.0,
                 address: str | None = None, name: str = "slot"):
        if n < 1:
            raise ValueError(f"RaySlots: n must be >= 1, got {n}")
        ray = import_ray()
        self._ray = ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            if address is None:
                # a private single-machine instance: no token to set up, no dashboard, loopback only
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")
                ray.init(num_cpus=max(int(n * num_cpus), os.cpu_count() or 1), include_dashboard=False,
                         log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        self.name = name
        self._remote = ray.remote(num_cpus=num_cpus, max_restarts=0, max_task_retries=0)(actor_cls)
        self._args = tuple(args)
        self.actors = [self._spawn() for _ in range(n)]
        self.replaced = 0  # actors that died and were replaced, over the pool's life

    def _spawn(self):
        return self._remote.remote(*self._args)

    def put(self, value: Any):
        """`value` in Ray's object store, shipped to each node at most once (pass it wrapped in a list)."""
        return self._ray.put(value)

    def run_each(self, method: str, calls: Sequence[tuple], on_failure: Callable[[int, BaseException, bool], T]
                 ) -> Iterator[tuple[int, Any]]:
        """Call `method(*calls[i])` on free actors; yield (i, result) as each finishes.

        A call whose actor died yields (i, on_failure(i, exc, True)) and the actor is
        replaced; one that raised in a live actor yields (i, on_failure(i, exc, False)).
        A caller that stops early leaves no queued call behind (running ones finish).
        """
        ray = self._ray
        queue = list(range(len(calls)))[::-1]
        free = list(range(len(self.actors)))[::-1]
        running: dict[Any, tuple[int, int]] = {}  # object ref -> (call index, slot)
        while queue or running:
            while queue and free:
                i, slot = queue.pop(), free.pop()
                running[getattr(self.actors[slot], method).remote(*calls[i])] = (i, slot)
            (ref,), _ = ray.wait(list(running), num_returns=1)
            i, slot = running.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                log.warning("%s %d (a Ray actor) died during call %d: %s; the call fails and a fresh actor takes "
                            "its place", self.name, slot, i, str(exc).splitlines()[0][:300])
                self._replace(slot)
                result = on_failure(i, exc, True)
            except ray.exceptions.RayTaskError as exc:
                result = on_failure(i, exc, False)
            free.append(slot)
            yield i, result

    def _replace(self, slot: int) -> None:
        try:
            self._ray.kill(self.actors[slot], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone is what we expect
            pass
        self.actors[slot] = self._spawn()
        self.replaced += 1

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """`method(*args)` on every actor, waited for (e.g. a warm-up)."""
        return self._ray.get([getattr(a, method).remote(*args) for a in self.actors])

    def close(self) -> None:
        """Kill the actors; stop Ray if this pool started it. Safe to call twice."""
        for a in self.actors:
            try:
                self._ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.actors = []
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()
            self._owns_ray = False
