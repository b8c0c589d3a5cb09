"""One writer per run directory: an advisory lock held for as long as a trainer is open.

Two processes appending to one run (its store, checkpoints, metrics) would
interleave two experiments. The lock is `flock` on `RUN_DIR/.lock`: the kernel
drops it when its holder exits however it dies, so a lock left by a killed
process is simply free, and the next holder takes it over. The file names the
holder (pid, host, since when, its command line) so the process that meets a
held lock can say who has it. `flock` is per machine: on a network file system
shared by several hosts it may not exclude across them.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from wmrl.core.errors import RunLocked

__all__ = ["RunLock"]


class RunLock:
    """Holds `run_dir`'s lock from construction until `release` (or the process ends)."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / ".lock"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            os.close(self._fd)
            self._fd = None
            raise RunLocked(f"{self.path.parent} is in use by {holder}; wait for it to finish, or stop it "
                            "(its work is kept) and run this again") from None
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "command": " ".join(sys.argv)[:300]}
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(me).encode(), 0)

    def _holder(self) -> str:
        try:
            h = json.loads(self.path.read_text() or "{}")
            return f"pid {h['pid']} on {h['host']} since {h['since']} ({h['command']})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process (it has not written its name yet)"

    def release(self) -> None:
        """Safe to call twice."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None
