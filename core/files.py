"""Durable file operations: what makes a write survive a crash or a power cut.

A rename is atomic but only durable once its directory is fsynced; a file's
bytes only once the file is. These are the two steps every durable write here
ends with (checkpoints, archived experience, rewritten metrics).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "fsync_tree", "write_atomic"]


def fsync_dir(path: str | Path) -> None:
    """Make the entries of directory `path` (renames, new files) durable; a no-op where that is unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(path: str | Path) -> None:
    """Make every file under `path`, and `path`'s own entries, durable."""
    for dirpath, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(path)


def write_atomic(path: str | Path, text: str) -> None:
    """Replace `path` with `text` so that a crash leaves the old content or the new, never a mix."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
