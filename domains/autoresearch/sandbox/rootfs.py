"""The run's filesystem: an allowlist root, and a workdir no host path reaches.

Built by the supervisor in its fresh mount namespace (see the package
docstring): read-only binds of the system and the Python installation, one
fresh tmpfs for the workdir, /tmp and /dev/shm, main.py written from a memfd,
the inputs bound read-only, then pivot_root.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Sequence

from .files import _check_inputs, _is_within, _write_all
from .limits import WORKDIR
from .linux import (
    _MNT_DETACH, _MS_BIND, _MS_NODEV, _MS_NOEXEC, _MS_NOSUID, _MS_PRIVATE, _MS_RDONLY, _MS_REC, _MS_REMOUNT,
    _b, _bind, _check, _libc, _mount, _pivot_root_here,
)

_SYSTEM_TOPS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_DEV_NODES = ("null", "zero", "full", "random", "urandom")


def _visible_paths(with_sys_path: bool = True) -> list[str]:
    """Host paths bind-mounted read-only (besides the /bin,/lib-style symlinks, /dev and the workdir).

    Computed in the zygote/launcher, which run `python -I`: their sys.path is the
    interpreter's own (stdlib, site-packages), without cwd or PYTHONPATH.
    """
    tops = [p for p in _SYSTEM_TOPS if os.path.isdir(p) and not os.path.islink(p)]
    extra = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), "/sys/devices/system/cpu",
             *(sys.path if with_sys_path else ())]
    keep: list[str] = []
    for p in sorted({os.path.realpath(p) for p in [*tops, *extra] if p and os.path.isabs(p) and os.path.exists(p)},
                    key=lambda p: (p.count("/"), p)):
        if p == "/":
            raise RuntimeError("refusing to expose '/' to the sandbox (a Python prefix or sys.path entry is '/')")
        if _is_within(p, os.path.dirname(WORKDIR)) or _is_within(WORKDIR, p):
            raise RuntimeError(f"the Python installation path {p!r} collides with the sandbox's workdir {WORKDIR!r}")
        if not any(_is_within(p, k) for k in keep):
            keep.append(p)
    return keep




def _open_inputs(inputs: str | None, names: Sequence[str]) -> list[tuple[int, str, bool]]:
    """O_PATH handles on the inputs, opened without following links (C1, before any mount covers them)."""
    if inputs is None:
        return []
    dfd = os.open(inputs, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        out = []
        for name in names:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                os.close(fd)
                raise ValueError(f"input {name!r} is not a regular file or a directory")
            out.append((fd, name, stat.S_ISDIR(mode)))
        return out
    finally:
        os.close(dfd)


def _copy_fd_to(src_fd: int, path: str, uid: int) -> None:
    """Write main.py from the code memfd into the fresh workdir, owned by the run."""
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.lseek(src_fd, 0, os.SEEK_SET)
        while chunk := os.read(src_fd, 1 << 20):
            _write_all(out, chunk)
        os.fchown(out, uid, uid)
    finally:
        os.close(out)


def _build_root(req: dict, uid: int, code_fd: int, visible: Sequence[str]) -> int:
    """In a fresh mount namespace: assemble the allowlist root, pivot into it; return a handle on the workdir.

    The workdir, /tmp and /dev/shm are three directories of one fresh tmpfs
    (size `disk_mb`, `max_inodes` inodes) that no host path reaches: the trusted
    side populates it (main.py, read-only binds of the inputs), reads the
    requested outputs back through the returned descriptor, and the kernel
    frees all of it when the namespace dies. Nothing the program leaves behind
    is ever walked, chowned or deleted by host code.
    """
    lim = req["limits"]
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates back to the host
    # O_PATH handles first: the staging tmpfs may cover the sources (e.g. inputs under /tmp)
    sources = [(os.open(p, os.O_PATH | os.O_CLOEXEC), p, os.path.isdir(p)) for p in visible]
    inputs = _open_inputs(req["inputs"], _check_inputs(req["inputs"]))
    links = [(p, os.readlink(p)) for p in _SYSTEM_TOPS if os.path.islink(p)]
    new = "/tmp"  # staging mount point; only this namespace sees it, and it is detached below
    _mount("tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=4m,nr_inodes=8192")
    ro = _MS_RDONLY | _MS_NOSUID | _MS_NODEV
    for p, target in links:
        os.symlink(target, new + p)
    scratch = new + "/.sandbox/scratch"
    os.makedirs(scratch, 0o755)
    _mount("tmpfs", scratch, "tmpfs", _MS_NOSUID | _MS_NODEV,
           f"mode=0755,size={int(lim['disk_mb'])}m,nr_inodes={int(lim['max_inodes'])}")
    for sub, mode in (("tmp", 0o1777), ("shm", 0o1777), ("work", 0o700)):
        os.mkdir(f"{scratch}/{sub}")
        os.chmod(f"{scratch}/{sub}", mode)
    os.chown(f"{scratch}/work", uid, uid)
    _copy_fd_to(code_fd, f"{scratch}/work/main.py", uid)
    # scratch dirs first, so that a visible path below /tmp (a venv in a clone under /tmp) is
    # bound on top of the private /tmp instead of being hidden by it
    for sub, dst in (("shm", "/dev/shm"), ("tmp", "/tmp"), ("work", WORKDIR)):
        os.makedirs(new + dst, 0o755, exist_ok=True)
        _bind(f"{scratch}/{sub}", new + dst, _MS_NOSUID | _MS_NODEV)
    _check(_libc().umount2(_b(scratch), _MNT_DETACH), "umount2(scratch)")  # reachable only through the binds
    for fd, p, is_dir in sources:
        dst = new + p
        if is_dir:
            os.makedirs(dst, 0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
            open(dst, "a").close()
        _bind(f"/proc/self/fd/{fd}", dst, ro)
        os.close(fd)
    for fd, name, is_dir in inputs:  # read-only: a program can read its inputs, not change or replace them
        dst = f"{new}{WORKDIR}/{name}"
        if is_dir:
            os.mkdir(dst, 0o755)
        else:
            os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444))
        _bind(f"/proc/self/fd/{fd}", dst, ro | _MS_NOEXEC)
        os.close(fd)
    os.makedirs(new + "/dev", 0o755, exist_ok=True)
    for node in _DEV_NODES:
        open(f"{new}/dev/{node}", "a").close()
        _bind(f"/dev/{node}", f"{new}/dev/{node}", _MS_NOSUID | _MS_NOEXEC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{new}/dev/{name}")
    os.makedirs(new + "/var", 0o755, exist_ok=True)
    if not os.path.lexists(new + "/var/tmp"):
        os.symlink("/tmp", new + "/var/tmp")
    os.makedirs(new + "/proc", 0o555, exist_ok=True)
    # we are pid 1 of the run's pid namespace: this /proc shows only the run's processes
    _mount("proc", new + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=2")
    # a passwd/group that knows the run's uid (getpass.getuser(), pwd lookups)
    accounts = {
        "passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                  f"sandbox:x:{uid}:{uid}:sandbox:{WORKDIR}:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nnogroup:x:65534:\nsandbox:x:{uid}:\n",
    }
    for name, text in accounts.items():
        with open(f"{new}/.sandbox/{name}", "w") as fh:
            fh.write(text)
        if os.path.isfile(f"{new}/etc/{name}"):
            _bind(f"{new}/.sandbox/{name}", f"{new}/etc/{name}", ro)
    os.chdir(new)
    _pivot_root_here()
    os.chdir("/")
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | ro)
    # opened before the program runs: whatever it does to the tree, this is the workdir's root
    return os.open(WORKDIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
