"""Concurrent executions: a typed `Job`, the `ExecutionPool` contract, and `SandboxPool`, slots sharing one
Sandbox (and so one zygote). `domains/autoresearch/ray_pool.py` keeps the contract with slots on Ray actors."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from .limits import SandboxLimits
from .result import ExecResult
from .runner import Sandbox

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Job:
    """One execution for `SandboxPool.run_many`: the program, its trusted inputs directory, its limits."""

    code: str
    inputs: str | Path | None = None
    limits: SandboxLimits | None = None  # None: the pool's


class ExecutionPool:
    """Runs jobs `slots` at a time and reports each as it finishes; one job's failure costs that job only."""

    slots: int

    def run_each(self, jobs: Sequence[Job], *, outputs: Sequence[str] = ()) -> Iterator[tuple[int, ExecResult]]:
        """(job index, result) as each job finishes, so a caller can store it at once."""
        raise NotImplementedError

    def exposes(self, path: str | os.PathLike) -> bool:
        """Whether `path` lies in what every run sees read-only (the system and Python installation)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def run_many(self, jobs: Sequence[Job], *, outputs: Sequence[str] = ()) -> list[ExecResult]:
        """Run the jobs, collecting `outputs` from each; results aligned with jobs.

        A job whose host-side handling raises becomes an "infra" result of its own;
        the other jobs of the batch are unaffected.
        """
        results: list[ExecResult | None] = [None] * len(jobs)
        for i, result in self.run_each(jobs, outputs=outputs):
            results[i] = result
        return results  # type: ignore[return-value]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SandboxPool(ExecutionPool):
    """Up to `slots` concurrent executions through one shared Sandbox (one zygote serves all slots)."""

    def __init__(self, slots: int | None = None, limits: SandboxLimits = SandboxLimits(), **sandbox_kwargs):
        self.slots = int(slots or os.cpu_count() or 1)
        if self.slots < 1:
            raise ValueError("slots must be >= 1")
        self.sandbox = Sandbox(limits, **sandbox_kwargs)
        self._executor = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="wmrl-sandbox")
        total_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
        if self.slots * limits.memory_mb > total_mb:  # then the host's OOM killer, not a run's limit, may act
            log.warning("sandbox pool: %d slots x %d MB exceed this machine's %.0f MB; runs may be killed by host "
                        "memory pressure (graded unknown)", self.slots, limits.memory_mb, total_mb)

    def exposes(self, path: str | os.PathLike) -> bool:
        return self.sandbox.exposes(path)

    def run_each(self, jobs: Sequence[Job], *, outputs: Sequence[str] = ()) -> Iterator[tuple[int, ExecResult]]:
        futures = {self._executor.submit(self.sandbox.run, job.code, job.inputs, outputs=outputs, limits=job.limits): i
                   for i, job in enumerate(jobs)}
        try:
            for f in as_completed(futures):
                i = futures[f]
                try:
                    yield i, f.result()
                except Exception as e:  # noqa: BLE001 - one bad job costs one result
                    log.warning("sandbox pool: job %d of %d failed on the host side: %s: %s", i, len(jobs),
                                type(e).__name__, e)
                    yield i, ExecResult("infra", None, "", "", 0.0, f"host-side error: {type(e).__name__}: {e}")
        finally:  # a caller that stops early leaves no queued job behind to run for nothing
            for f in futures:
                f.cancel()

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.sandbox.close()
