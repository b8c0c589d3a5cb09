"""`RaySandboxPool`: the sandbox pool's slots as Ray actors, for real execution across machines.

The same contract as `SandboxPool` (`run_each` yields each execution as it
finishes; a failure costs that execution only), so `AutoResearchEnv` runs on
either (`domain.executor: local | ray`). Each slot is one actor that owns a
`Sandbox` and its zygote on whichever node Ray placed it; the isolation is the
sandbox's own, on that node, so every node must run the actors as root, like
the local pool.

A job's inputs are a directory on the trainer's machine, which another node
cannot read: the trusted public files are packed once per directory, put in
Ray's object store (shipped to a node at most once), and written by each actor
into its own cache the first time it runs that task. An actor that dies
mid-execution (node lost, process killed) makes that execution "infra" -- an
unknown grade, excluded from advantages -- and is replaced (`core/ray_slots.py`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from wmrl.core.ray_slots import RaySlots
from wmrl.domains.autoresearch.sandbox import ExecResult, ExecutionPool, Job, Sandbox, SandboxLimits

__all__ = ["RaySandboxPool", "SandboxSlot"]


class SandboxSlot:
    """One Ray actor: a Sandbox on its node, and the task inputs it has been sent so far."""

    def __init__(self, limits: SandboxLimits, sandbox_kwargs: dict):
        self.sandbox = Sandbox(limits, **sandbox_kwargs)
        _sweep_caches()
        self.cache = Path(tempfile.mkdtemp(prefix=f"{CACHE_PREFIX}{os.getpid()}-"))

    def run(self, code: str, inputs: tuple[str, list] | None, outputs: Sequence[str],
            limits: SandboxLimits | None) -> ExecResult:
        """`inputs`: (digest, [object ref of {relative path: bytes}]) -- fetched only on a cache miss."""
        where = None
        if inputs is not None:
            digest, (ref,) = inputs
            where = self.cache / digest
            if not where.is_dir():
                import ray

                staging = Path(tempfile.mkdtemp(prefix=f".{digest}.", dir=self.cache))
                for rel, data in ray.get(ref).items():
                    (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                    (staging / rel).write_bytes(data)
                os.rename(staging, where)
        return self.sandbox.run(code, where, outputs=outputs, limits=limits)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.sandbox.close()
        shutil.rmtree(self.cache, ignore_errors=True)


CACHE_PREFIX = "wmrl-ray-inputs-"


def _sweep_caches() -> None:
    """Remove the input caches of slots whose process is gone (killed before `close`: replaced, timed out)."""
    for d in Path(tempfile.gettempdir()).glob(f"{CACHE_PREFIX}*-*"):
        pid = d.name[len(CACHE_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


def _pack(directory: Path) -> tuple[str, dict[str, bytes]]:
    """A trusted inputs directory as (content digest, {relative path: bytes}); regular files only."""
    files: dict[str, bytes] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise ValueError(f"inputs directory {directory}: {path.name} is not a regular file or folder")
        if path.is_file():
            files[path.relative_to(directory).as_posix()] = path.read_bytes()
    h = hashlib.sha256()
    for rel, data in files.items():
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:32], files


class RaySandboxPool(ExecutionPool):
    """Up to `slots` concurrent executions, each slot a Ray actor with its own Sandbox."""

    def __init__(self, slots: int | None = None, limits: SandboxLimits = SandboxLimits(), *,
                 address: str | None = None, **sandbox_kwargs):
        self.slots = int(slots or os.cpu_count() or 1)
        self.limits = limits
        self._local = Sandbox(limits, **sandbox_kwargs)  # only to tell what a sandbox exposes; never runs
        self._slots = RaySlots(SandboxSlot, self.slots, args=(limits, sandbox_kwargs), address=address,
                               name="sandbox slot")
        self._packed: dict[tuple[str, float], tuple[str, list]] = {}  # (inputs dir, mtime) -> (digest, [ref])

    @property
    def replaced(self) -> int:
        """Slots whose actor died and was replaced."""
        return self._slots.replaced

    def exposes(self, path: str | os.PathLike) -> bool:
        return self._local.exposes(path)

    def _inputs(self, inputs: str | Path | None) -> tuple[str, list] | None:
        if inputs is None:
            return None
        d = Path(os.path.realpath(inputs))
        if not d.is_dir():
            raise FileNotFoundError(f"inputs directory {inputs} does not exist")
        key = (str(d), d.stat().st_mtime)
        if key not in self._packed:
            digest, files = _pack(d)
            self._packed[key] = (digest, [self._slots.put(files)])
        return self._packed[key]

    def run_each(self, jobs: Sequence[Job], *, outputs: Sequence[str] = ()) -> Iterator[tuple[int, ExecResult]]:
        """As `SandboxPool.run_each`: (job index, result) as each finishes; a dead slot is an "infra" result."""
        calls = [(job.code, self._inputs(job.inputs), tuple(outputs), job.limits) for job in jobs]
        # the sandbox ends a program at its time limit: a slot silent long after that is lost with its node
        deadlines = [2 * (job.limits or self.limits).timeout_s + 120.0 for job in jobs]

        def failed(i: int, why: BaseException | str, died: bool) -> ExecResult:
            what = "its sandbox slot (a Ray actor) died" if died else "host-side error in its sandbox slot"
            return ExecResult("infra", None, "", "", 0.0, f"{what}: {str(why).splitlines()[0][:300]}")

        yield from self._slots.run_each("run", calls, failed, deadlines)

    def actor_pids(self) -> list[int]:
        """The slots' process ids (for tests and diagnostics)."""
        return self._slots.call_all("pid")

    def close(self) -> None:
        self._slots.close("close")  # each actor stops its zygote and removes its input cache, then goes
        self._local.close()
