"""The failures a run can meet that are not bugs: each ends the run with one line that says what to do.

A full disk, a damaged checkpoint, a run directory another process holds, a stop
signal. None of them loses anything already stored, and each message says how
to go on (usually: the same command again).
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from pathlib import Path

__all__ = ["CheckpointError", "Interrupted", "RunLocked", "StorageError"]

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class StorageError(RuntimeError):
    """Writing to the run directory failed (a full disk, an I/O error); nothing already stored is lost."""

    @classmethod
    def of(cls, exc: BaseException, path: str | Path, what: str) -> "StorageError":
        """The error to raise for `exc`, met while doing `what` in `path`."""
        if isinstance(exc, StorageError):
            return exc
        where = Path(path)
        while not where.exists() and where != where.parent:
            where = where.parent
        try:
            left = shutil.disk_usage(where).free
        except OSError:
            left = None
        # some writers (torch's) drop the errno: a disk with almost nothing left is full all the same
        full = _is_full(exc) or (left is not None and left < 2**20)
        free = "free space unknown" if left is None else f"{left / 2**20:.1f} MiB free"
        reason = "the disk is full" if full else f"{type(exc).__name__}: {str(exc)[:300]}"
        todo = "free space" if full else "fix the disk"
        return cls(f"{what} in {path}: {reason} ({free}); nothing already stored is lost: {todo} and run "
                   "the same command again to resume")


def _is_full(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return True
        if isinstance(exc, sqlite3.OperationalError) and "full" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class CheckpointError(RuntimeError):
    """No checkpoint that was asked for (or none at all) can be loaded."""


class RunLocked(RuntimeError):
    """Another live process holds the run directory."""


class Interrupted(RuntimeError):
    """A stop signal ended the run cleanly at a checkpoint."""

    def __init__(self, signum: int, step: int, message: str):
        super().__init__(message)
        self.signum, self.step = signum, step
