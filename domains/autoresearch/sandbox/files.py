"""Files that cross the sandbox's boundary: the caller's inputs going in, the requested outputs coming out.

Outputs are what the program shaped, so they are opened relative to a handle on
the workdir, never following a link (O_NOFOLLOW), never waiting on a FIFO
(O_NONBLOCK), refused unless regular, and read at most `cap` + 1 bytes whatever
the file claims. Inputs are the trusted caller's: plain names, regular files or
directories only.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Sequence

from .result import FileProblem

_FORBIDDEN_INPUTS = ("/proc", "/sys", "/dev")
_MAX_INPUTS = 1024
_MAX_OUTPUTS = 16
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def _check_inputs(inputs: str | None) -> list[str]:
    """The names in a trusted inputs directory (regular files and directories only), for read-only binds."""
    if inputs is None:
        return []
    if inputs == "/" or any(_is_within(inputs, f) for f in _FORBIDDEN_INPUTS):
        raise ValueError(f"{inputs!r} cannot be a sandbox inputs directory")
    if not os.path.isdir(inputs) or os.path.islink(inputs):
        raise FileNotFoundError(f"sandbox inputs directory {inputs!r} does not exist (the caller creates it)")
    names = sorted(os.listdir(inputs))
    if len(names) > _MAX_INPUTS:
        raise ValueError(f"sandbox inputs {inputs!r} has {len(names)} entries; at most {_MAX_INPUTS}")
    for name in names:
        mode = os.lstat(os.path.join(inputs, name)).st_mode
        if not _NAME_RE.fullmatch(name) or name == "main.py":
            raise ValueError(f"sandbox input {name!r} in {inputs!r}: names are [A-Za-z0-9_.-], not main.py")
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ValueError(f"sandbox input {name!r} in {inputs!r} is not a regular file or a directory")
    return names


def _check_outputs(outputs: Sequence[str]) -> list[str]:
    outputs = list(outputs)
    if len(outputs) > _MAX_OUTPUTS:
        raise ValueError(f"at most {_MAX_OUTPUTS} output files per execution")
    for name in outputs:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name == "main.py":
            raise ValueError(f"output file name {name!r}: a plain file name of [A-Za-z0-9_.-], not main.py")
    return outputs


def open_regular_file(dir_fd: int, name: str, cap: int) -> tuple[int | None, FileProblem | None]:
    """A descriptor on `name` below `dir_fd` if it is a regular file of at most `cap` bytes, else why not.

    The open never follows a symbolic link (O_NOFOLLOW), never waits for a writer
    (O_NONBLOCK: a FIFO opens at once and is then refused by type) and never
    acquires a terminal.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None, FileProblem("missing")
    except OSError:
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            return None, FileProblem("unreadable")
        return None, FileProblem(_kind(mode))
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None, FileProblem("unreadable")
    if not stat.S_ISREG(st.st_mode) or st.st_size > cap:
        os.close(fd)
        return None, FileProblem(_kind(st.st_mode)) if not stat.S_ISREG(st.st_mode) else FileProblem("too_large", st.st_size)
    return fd, None


def read_capped(fd: int, cap: int) -> tuple[bytes | None, FileProblem | None]:
    """At most cap + 1 bytes from the start of `fd`, whatever the file says its size is."""
    chunks, got = [], 0
    try:
        while got <= cap:
            chunk = os.pread(fd, min(1 << 20, cap + 1 - got), got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError:
        return None, FileProblem("unreadable")
    if got > cap:
        return None, FileProblem("too_large", got)
    return b"".join(chunks), None


def read_regular_file(dir_fd: int, name: str, cap: int) -> tuple[bytes | None, FileProblem | None]:
    """Read `name` below `dir_fd` if it is a regular file of at most `cap` bytes; never follow, block or overread."""
    fd, problem = open_regular_file(dir_fd, name, cap)
    if fd is None:
        return None, problem
    try:
        return read_capped(fd, cap)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device")):
        if test(mode):
            return kind
    return "unreadable"




def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]




def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
