"""Per-execution memory cgroups: the kernel's own count of everything a run holds.

Why
---
RLIMIT_AS bounds one process's address space. A program under RL pressure
holds memory where RLIMIT_AS does not look: in tmpfs files (its /tmp,
/dev/shm and workdir), in memfds, in shared-memory segments, and spread over
many processes. A memory cgroup charges all of it, page by page, to the run,
and the kernel's OOM killer enforces the limit: the supervisor then *observes*
an out-of-memory kill (the cgroup's `oom_kill` counter) instead of guessing it
from text the program printed.

One cgroup per execution, made by the trusted parent before the run and removed
after it, so every counter (peak, OOM kills) belongs to exactly one run. The
parent moves the run's supervisor into it before the program is forked, so
every process of the program is born inside.

Both hierarchies: cgroup v1 with the memory controller mounted on its own
(these machines), and cgroup v2 with the memory controller available to the
trainer's cgroup. v2's no-internal-processes rule means the trainer's own
cgroup must be able to delegate the controller (`cgroup.subtree_control`);
when it cannot, or neither hierarchy has a memory controller, `detect` raises
`CgroupUnavailable` saying what to do, and the sandbox fails closed.

Only the standard library, like the rest of the sandbox package; only the
parent (`runner.Sandbox`) uses it.
"""

from __future__ import annotations

import errno
import itertools
import os
import threading
import time
from dataclasses import dataclass

__all__ = ["CgroupUnavailable", "MemoryUsage", "RunCgroup", "MemoryCgroups", "locate"]

_PREFIX = "wmrl-"
_counter = itertools.count()


class CgroupUnavailable(RuntimeError):
    """No memory cgroup can be made for a run here; the message says why and what to do."""


@dataclass(frozen=True)
class MemoryUsage:
    oom_kills: int  # processes of the run killed by an OOM killer (the run's own, or the host's)
    peak_bytes: int | None  # high-water mark of the run's charged memory (None where the kernel does not say)
    limit_hit: bool  # the run itself reached its limit (so its OOM kills are its own doing, not the host's)


def locate(mountinfo: str, proc_cgroup: str) -> tuple[int, str] | None:
    """(version, directory) of the calling process's memory cgroup, from /proc/self/mountinfo and /proc/self/cgroup.

    v1's memory controller wins over v2 (a hybrid host mounts v2 without controllers).
    """
    ours: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                ours[ctrl] = parts[2]
    found: dict[int, str] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mount_point, fstype, options = fields[3], fields[4], tail[0], tail[2].split(",")
        if fstype == "cgroup" and "memory" in options and "memory" in ours:
            found.setdefault(1, _join(mount_point, root, ours["memory"]))
        elif fstype == "cgroup2" and "" in ours:
            found.setdefault(2, _join(mount_point, root, ours[""]))
    for version in (1, 2):
        if version in found:
            return version, found[version]
    return None


def _join(mount_point: str, mount_root: str, path: str) -> str:
    rel = path[len(mount_root):] if mount_root != "/" and path.startswith(mount_root) else path
    return os.path.normpath(mount_point + "/" + rel.lstrip("/"))


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _counter_in(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


class RunCgroup:
    """One execution's cgroup: the run's first process is added, then its counters are read, then it is removed."""

    def __init__(self, path: str, version: int, limit_bytes: int):
        self.path, self.version, self.limit_bytes = path, version, limit_bytes

    def add(self, pid: int) -> None:
        """Move process `pid` (and so everything it starts from then on) into this cgroup."""
        _write(os.path.join(self.path, "cgroup.procs"), str(pid))

    def usage(self) -> MemoryUsage:
        if self.version == 1:
            oom = _counter_in(_read(os.path.join(self.path, "memory.oom_control")), "oom_kill")
            peak = self._number("memory.max_usage_in_bytes")
            # v1 counts failures only without a memsw limit; a peak at the limit says the same
            hit = (any(self._number(f) for f in ("memory.failcnt", "memory.memsw.failcnt"))
                   or (peak or 0) >= self.limit_bytes - (1 << 20))
        else:
            events = _read(os.path.join(self.path, "memory.events"))
            oom = _counter_in(events, "oom_kill")
            hit = _counter_in(events, "max") > 0 or _counter_in(events, "oom") > 0
            peak = self._number("memory.peak")
        return MemoryUsage(oom, peak, hit)

    def _number(self, name: str) -> int | None:
        try:
            return int(_read(os.path.join(self.path, name)))
        except (OSError, ValueError):
            return None

    def remove(self, wait_s: float = 0.2) -> bool:
        """rmdir; a run's last processes may still be leaving the cgroup for a moment (EBUSY)."""
        until = time.monotonic() + wait_s
        while True:
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() >= until:
                    return False
                time.sleep(0.002)


class MemoryCgroups:
    """Makes one memory cgroup per execution below a parent cgroup of this process's own."""

    def __init__(self, base: str, version: int):
        self.version = version
        self.base = base
        self._leftover: list[RunCgroup] = []
        self._lock = threading.Lock()
        self._check_controller()
        self.parent = os.path.join(base, f"{_PREFIX}{os.getpid()}-{next(_counter)}")
        self._sweep_dead()
        try:
            os.mkdir(self.parent)
        except FileExistsError:
            pass
        except OSError as e:
            raise CgroupUnavailable(f"cannot create a cgroup under {base} ({e}); the sandbox needs root with a "
                                    "writable memory cgroup") from None
        if version == 2:
            self._delegate(self.parent)
        self._check_swap()

    def _check_swap(self) -> None:
        """With swap on, a run's memory must be limited in swap too, or memory_mb leaks into it."""
        try:
            swapping = len(_read("/proc/swaps").strip().splitlines()) > 1
        except OSError:
            swapping = False
        limit = os.path.join(self.base if self.version == 1 else self.parent,
                             "memory.memsw.limit_in_bytes" if self.version == 1 else "memory.swap.max")
        if swapping and not os.path.exists(limit):
            self.close()
            raise CgroupUnavailable(f"swap is on but the memory cgroup does not account it ({limit} is missing): "
                                    "boot with swapaccount=1 (cgroup v1) or turn swap off")

    @classmethod
    def detect(cls) -> "MemoryCgroups":
        try:
            where = locate(_read("/proc/self/mountinfo"), _read("/proc/self/cgroup"))
        except OSError as e:
            raise CgroupUnavailable(f"cannot read this process's cgroups ({e})") from None
        if where is None:
            raise CgroupUnavailable("neither a cgroup v1 memory controller nor a cgroup v2 hierarchy is mounted")
        return cls(where[1], where[0])

    def _check_controller(self) -> None:
        if self.version == 1:
            if not os.path.exists(os.path.join(self.base, "memory.limit_in_bytes")):
                raise CgroupUnavailable(f"{self.base} is not a cgroup v1 memory cgroup")
            return
        try:
            controllers = _read(os.path.join(self.base, "cgroup.controllers")).split()
        except OSError as e:
            raise CgroupUnavailable(f"{self.base} is not a cgroup v2 cgroup ({e})") from None
        if "memory" not in controllers:
            raise CgroupUnavailable(
                f"the cgroup v2 memory controller is not available at {self.base} (it offers: "
                f"{' '.join(controllers) or 'nothing'}); enable it in the parent's cgroup.subtree_control, "
                "or run the trainer in a delegated cgroup (e.g. systemd-run --scope -p Delegate=yes)")
        self._delegate(self.base)

    def _delegate(self, path: str) -> None:
        try:
            if "memory" in _read(os.path.join(path, "cgroup.subtree_control")).split():
                return
        except FileNotFoundError:
            pass  # not a cgroup directory: the write below fails with the reason
        try:
            _write(os.path.join(path, "cgroup.subtree_control"), "+memory")
        except OSError as e:
            hint = (" (it holds processes: cgroup v2 lets only a cgroup without processes delegate a controller; "
                    "start the trainer in a leaf of a delegated cgroup, e.g. systemd-run --scope -p Delegate=yes)"
                    if e.errno == errno.EBUSY else "")
            raise CgroupUnavailable(f"cannot enable the memory controller below {path}: {e}{hint}") from None

    def _sweep_dead(self) -> None:
        """Remove the empty run cgroups of trainers that died without cleaning up."""
        try:
            names = os.listdir(self.base)
        except OSError:
            return
        for name in names:
            pid = name[len(_PREFIX):].split("-", 1)[0]
            if not name.startswith(_PREFIX) or not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
                continue
            parent = os.path.join(self.base, name)
            try:
                for child in os.listdir(parent):
                    if os.path.isdir(os.path.join(parent, child)):
                        os.rmdir(os.path.join(parent, child))
                os.rmdir(parent)
            except OSError:
                pass

    def create(self, limit_bytes: int) -> RunCgroup:
        with self._lock:
            self._leftover = [cg for cg in self._leftover if not cg.remove(wait_s=0)]
        path = os.path.join(self.parent, f"run-{next(_counter)}")
        os.mkdir(path)
        try:
            if self.version == 1:
                _write(os.path.join(path, "memory.limit_in_bytes"), str(limit_bytes))
                for name in ("memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes"):  # no escape into
                    if os.path.exists(os.path.join(path, name)):  # swap, nor into (uncharged on v1) TCP buffers
                        _write(os.path.join(path, name), str(limit_bytes))
            else:
                _write(os.path.join(path, "memory.max"), str(limit_bytes))
                for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    if os.path.exists(os.path.join(path, name)):
                        _write(os.path.join(path, name), value)
            return RunCgroup(path, self.version, limit_bytes)
        except BaseException:
            os.rmdir(path)
            raise

    def release(self, cg: RunCgroup) -> None:
        if not cg.remove():
            with self._lock:
                self._leftover.append(cg)

    def close(self) -> None:
        with self._lock:
            for cg in self._leftover:
                cg.remove()
            self._leftover = []
        try:
            os.rmdir(self.parent)
        except OSError:
            pass
