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
import math
import os
import time
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
                 num_gpus: float = 0.0, address: str | None = None, name: str = "slot",
                 start_timeout_s: float = 300.0, must_start: bool = False):
        """`must_start`: an actor not started within `start_timeout_s` (Ray cannot place it) fails the
        pool instead of a warning (for a pool of one whose calls wait without a deadline)."""
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
        free = ray.available_resources().get("CPU", 0.0)
        if free < n * num_cpus:  # e.g. a Ray started by someone else, smaller than the pool
            log.warning("%d %ss need %g CPUs of Ray and %g are free: the rest wait until CPUs free up, and their "
                        "calls fail at their deadline", n, name, n * num_cpus, free)
        self._remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_task_retries=0)(actor_cls)
        self._args = tuple(args)
        self.actors = [self._spawn() for _ in range(n)]
        self.replaced = 0  # actors that died and were replaced, over the pool's life
        # an actor that cannot be built (a node without what it needs) would die and be replaced forever,
        # each of its calls an unknown grade: fail here instead, with its reason
        ready = [a.__ray_ready__.remote() for a in self.actors]
        done, _ = ray.wait(ready, num_returns=len(ready), timeout=start_timeout_s)
        try:
            ray.get(done)
        except ray.exceptions.RayError as exc:
            self.close()
            reason = str(exc).strip().splitlines()[-1]  # the exception its constructor raised
            raise RuntimeError(f"a {name} (Ray actor) could not start: {reason}") from None
        if len(done) < len(ready) and must_start:
            free = ray.available_resources()
            self.close()
            raise RuntimeError(f"the {name} (Ray actor) was not placed within {start_timeout_s:g} s: it asks Ray "
                               f"for {num_cpus:g} CPU and {num_gpus:g} GPU and Ray has {free.get('CPU', 0):g} CPU "
                               f"and {free.get('GPU', 0):g} GPU free; ask for less or give Ray more")
        if len(done) < len(ready):
            log.warning("%d of %d %ss have not started within %g s (waiting for CPUs?); their calls fail at their "
                        "deadlines", len(ready) - len(done), n, name, start_timeout_s)

    def _spawn(self):
        return self._remote.remote(*self._args)

    def put(self, value: Any):
        """`value` in Ray's object store, shipped to each node at most once (pass it wrapped in a list)."""
        return self._ray.put(value)

    def run_each(self, method: str, calls: Sequence[tuple], on_failure: Callable[[int, BaseException | str, bool], T],
                 deadlines: Sequence[float] | None = None) -> Iterator[tuple[int, Any]]:
        """Call `method(*calls[i])` on free actors; yield (i, result) as each finishes.

        A call whose actor died, or that has not returned `deadlines[i]` seconds after
        it started (a lost node, an actor Ray cannot place), yields
        (i, on_failure(i, why, True)) and its actor is replaced; one that raised in a
        live actor yields (i, on_failure(i, exc, False)). A caller that stops early
        leaves no queued call behind (running ones finish).
        """
        ray = self._ray
        queue = list(range(len(calls)))[::-1]
        free = list(range(len(self.actors)))[::-1]
        running: dict[Any, tuple[int, int, float]] = {}  # object ref -> (call index, slot, deadline)
        while queue or running:
            while queue and free:
                i, slot = queue.pop(), free.pop()
                due = time.monotonic() + (deadlines[i] if deadlines is not None else math.inf)
                running[getattr(self.actors[slot], method).remote(*calls[i])] = (i, slot, due)
            first = min(due for _, _, due in running.values())
            wait = None if first == math.inf else max(0.0, first - time.monotonic())
            ready, _ = ray.wait(list(running), num_returns=1, timeout=wait)
            if not ready:  # the earliest deadline passed
                ref = min(running, key=lambda r: running[r][2])
                i, slot, _ = running.pop(ref)
                why = f"{self.name} {slot} did not return call {i} by its deadline"
                log.warning("%s; the call fails and a fresh actor takes its place", why)
                self.replace(slot)
                free.append(slot)
                yield i, on_failure(i, why, True)
                continue
            ref = ready[0]
            i, slot, _ = running.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                log.warning("%s %d (a Ray actor) died during call %d: %s; the call fails and a fresh actor takes "
                            "its place", self.name, slot, i, str(exc).splitlines()[0][:300])
                self.replace(slot)
                result = on_failure(i, exc, True)
            except ray.exceptions.RayTaskError as exc:
                result = on_failure(i, exc, False)
            except ray.exceptions.RayError as exc:  # the actor's process or object lost some other way
                log.warning("%s %d lost call %d: %s; a fresh actor takes its place", self.name, slot, i,
                            str(exc).splitlines()[0][:300])
                self.replace(slot)
                result = on_failure(i, exc, True)
            free.append(slot)
            yield i, result

    def call_each(self, requests: dict[int, tuple[str, tuple]],
                  timeout_s: float | None) -> dict[int, tuple[str, Any]]:
        """Call `method(*args)` on the actor of each slot at once: {slot: ("ok", result) | ("lost", why)}.

        For actors that hold state between calls (a simulator worker's episodes). A slot
        whose actor died, raised, or did not answer within `timeout_s` (None: no limit) is
        "lost", and its actor is replaced by a fresh one (what it held is gone with it).
        """
        ray = self._ray
        refs = {slot: getattr(self.actors[slot], method).remote(*args) for slot, (method, args) in requests.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        ready = set(ready)
        replies: dict[int, tuple[str, Any]] = {}
        for slot, ref in refs.items():
            if ref not in ready:
                replies[slot] = ("lost", f"{self.name} {slot} did not answer within {timeout_s:g} s")
                continue
            try:
                replies[slot] = ("ok", ray.get(ref))
            except ray.exceptions.RayActorError as exc:
                replies[slot] = ("lost", f"{self.name} {slot} died: {str(exc).splitlines()[0][:300]}")
            except ray.exceptions.RayTaskError as exc:
                replies[slot] = ("lost", f"{self.name} {slot} raised: {str(exc).splitlines()[0][:300]}")
            except ray.exceptions.RayError as exc:
                replies[slot] = ("lost", f"{self.name} {slot} was lost: {str(exc).splitlines()[0][:300]}")
        for slot, (kind, why) in replies.items():
            if kind != "ok":
                log.warning("%s; a fresh actor takes its place", why)
                self.replace(slot)
        return replies

    def replace(self, slot: int) -> None:
        """A fresh actor in `slot` (the old one killed if it still runs)."""
        try:
            self._ray.kill(self.actors[slot], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone is what we expect
            pass
        self.actors[slot] = self._spawn()
        self.replaced += 1

    def call_all(self, method: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        """`method(*args)` on every actor, waited for (up to `timeout_s`: then GetTimeoutError)."""
        return self._ray.get([getattr(a, method).remote(*args) for a in self.actors], timeout=timeout_s)

    def close(self, method: str | None = None, timeout_s: float = 10.0) -> None:
        """Call `method` on every actor (their own clean-up) for up to `timeout_s`, then kill them;
        stop Ray if this pool started it. Safe to call twice."""
        if method is not None and self.actors:
            refs = [getattr(a, method).remote() for a in self.actors]
            self._ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for a in self.actors:
            try:
                self._ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.actors = []
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()
            self._owns_ray = False
