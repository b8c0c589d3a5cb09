"""Run untrusted, agent-written experiment code in a sandbox.

Why
---
An AutoResearch agent writes ML experiment code; we execute it and the graded
result is the reward. The code is untrusted: a policy under RL pressure will
find any way to read the hidden test labels, to reach the network, to wedge the
machine or to kill the trainer. So it runs only in here: its own working
directory, no network, resource limits, a wall-clock timeout that kills every
process it started, a scrubbed environment and capped output. The grader
(someone else's module) runs OUTSIDE the sandbox on the predictions file the
code leaves in its workdir; hidden labels never enter the sandbox.

Real execution is the expensive part of RL here, so per-execution overhead
matters. A *zygote* process imports numpy/pandas/scikit-learn once and forks a
child per execution (tens of ms instead of ~1.5 s of cold imports).

Design: fresh namespaces and a fresh uid for every execution
------------------------------------------------------------
Each execution is two processes, both forks of the zygote (or, on the cold
path ``use_zygote=False``, of a small stdlib-only launcher):

* C1, *init and supervisor*: forked as pid 1 of a new pid namespace (root).
  It chowns the workdir to the run's uid, ``unshare(NEWNS|NEWNET|NEWIPC|NEWUTS)``,
  builds the new root (below), hands the parent a pidfd for itself, forks the
  program, reaps it, then SIGKILLs and reaps whatever the program left behind,
  gives the workdir back to the caller and reports the exit status. When C1
  dies the kernel kills every process in its namespace, so the parent's
  timeout is a single SIGKILL to C1 and nothing survives it -- not setsid'd
  daemons, not a fork bomb. ``run`` returns only once every program process is
  gone (reaped by C1, or killed with it).
* C2, the *program*: new session, stdio on the capture pipes, rlimits, drop to
  the run's uid, ``PR_SET_NO_NEW_PRIVS``, a seccomp filter, scrubbed env,
  ``chdir(workdir)``, then ``workdir/main.py`` runs as ``__main__`` -- in-process
  on the zygote path, by ``execve(sys.executable)`` on the cold path, through
  the same bootstrap so both behave alike (tested).

Why these choices rather than "just drop to nobody" (dropping privileges is
part of it, but it is not enough when we run as root, /tmp is world-writable
and a label file might be world-readable):

* Filesystem -- an **allowlist root**. C1 mounts a tmpfs and bind-mounts into
  it, read-only/nosuid/nodev, only: /usr and /etc (and the /bin, /lib symlinks),
  the Python installation (its prefixes and the isolated interpreter's
  sys.path), five /dev nodes, /sys/devices/system/cpu and a fresh /proc; adds
  a private tmpfs /tmp and /dev/shm (``max_file_mb`` each); binds the workdir
  read-write at its own absolute path; ``pivot_root``s into it and detaches
  the old root. Anything else on the host -- the grader's hidden labels
  wherever they live and whatever their mode, the repository, other runs'
  workdirs -- is not in the sandbox's view at all, and nothing but the workdir
  is writable (writes to /tmp land in a tmpfs that vanishes with the run).
* Privileges -- a **per-execution uid** (``UID_BASE`` + C1's host pid): no
  groups, no capabilities, no-new-privs, every bind nosuid. This makes
  RLIMIT_NPROC effective and per run (a fork bomb in one slot cannot starve
  another) and leaves nothing to signal or ptrace: the parent, the trainer
  and the zygote are outside the pid namespace (invisible), C1 is root
  (EPERM), concurrent runs have other uids and namespaces; /proc is mounted
  hidepid=2. Task files that are hard links (possibly shared with the
  caller's data) are not handed to the run's uid, so they stay read-only.
  When the workdir is handed back, setuid/setgid bits are stripped.
* Network -- a fresh network namespace per run with only a loopback interface
  (up, so a program may talk to itself). There is no route: connect() fails
  at once, and the host's sockets (the parent's 127.0.0.1 listeners, abstract
  unix sockets) are unreachable. If the namespace cannot be made, the run
  fails closed with status "infra", unless ``require_netns=False`` was passed
  explicitly.
* Syscall filter (x86_64, aarch64) -- what namespaces do not cover: sockets
  other than AF_UNIX/INET/INET6/NETLINK are refused (AF_VSOCK would reach the
  hypervisor of a VM such as Firecracker, whatever the netns), as are user
  namespaces and every other CLONE_NEW*/unshare/setns, io_uring (it can make
  sockets without socket(2)), bpf, perf_event_open, userfaultfd and the kernel
  keyring; foreign ABIs (32-bit binaries, x32) are killed.
* Limits: RLIMIT_AS, RLIMIT_CPU (soft; hard = soft + 1 s), RLIMIT_FSIZE,
  RLIMIT_NOFILE, RLIMIT_NPROC and RLIMIT_CORE=0, set before the drop.

Status mapping (``ExecResult.status``): exit 0 -> "ok"; other exit or uncaught
exception -> "error" (stderr keeps its tail, hence the traceback); wall
timeout, or the CPU limit (SIGXCPU) -> "timeout"; a MemoryError (RLIMIT_AS) ->
"oom"; death by another signal (SIGXFSZ from a non-Python writer, a kernel
SIGKILL, a crash) -> "killed" with the reason in ``detail``; anything wrong
with the machinery itself (zygote died, fork failed, namespaces unavailable)
-> "infra", which the caller must grade UNKNOWN, never 0. A dead zygote is
restarted by the next run. (CPython ignores SIGXFSZ, so a Python program that
writes past the file-size limit gets OSError(EFBIG): "error", detail "file
size limit exceeded".)

Output: stdout and stderr are read concurrently through pipes; each keeps its
first and last ``max_output_bytes // 2`` bytes with a truncation marker in
between and the rest is read and discarded, so printing 100 MB neither blocks
nor costs memory.

Requirements and what is NOT contained: needs root (CAP_SYS_ADMIN, CAP_SETUID)
on Linux >= 5.3 (pidfds); without them every run is "infra". Not capped: total
memory of a run's processes (RLIMIT_AS is per process: worst case
max_processes x memory_mb; needs a cgroup), total bytes written to the
workdir (RLIMIT_FSIZE is per file), CPU across processes (per process). Kernel
exploits are only narrowed (the seccomp filter is a denylist). Everything
world-readable under /usr, /etc and the Python installation is readable by the
program, so hidden data must not live there. On the zygote path the
preloaded modules already occupy ~0.35 GB of the RLIMIT_AS budget. Task files must be readable by
an unprivileged uid if they are hard links; symlinks pointing outside the
workdir do not resolve inside.

Only the standard library is imported here: this file is also the zygote's and
the launcher's entry point (``python -I sandbox.py --zygote|--launch``).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import re
import resource
import selectors
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

__all__ = ["SandboxLimits", "ExecResult", "Sandbox", "SandboxPool", "UID_BASE"]

#: per-execution uid = UID_BASE + host pid of the run's supervisor (unique among live runs)
UID_BASE = 0x70000000

_SELF = os.path.realpath(__file__)


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 30.0  # wall clock; the whole process tree is killed after it
    cpu_s: int = 60  # RLIMIT_CPU (per process)
    memory_mb: int = 2048  # RLIMIT_AS (per process)
    max_processes: int = 64  # RLIMIT_NPROC (per run: every run has its own uid)
    max_file_mb: int = 256  # RLIMIT_FSIZE; also the size of the private /tmp and /dev/shm
    max_open_files: int = 256  # RLIMIT_NOFILE
    max_output_bytes: int = 64_000  # stdout and stderr each; head + tail kept beyond

    def __post_init__(self):
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_processes", "max_file_mb", "max_open_files", "max_output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0")


@dataclass(frozen=True)
class ExecResult:
    status: str  # "ok" | "error" | "timeout" | "oom" | "killed" | "infra"
    returncode: int | None  # exit code, -signal if killed by a signal, None for timeout/infra
    stdout: str
    stderr: str  # for "error": includes the traceback tail
    wall_s: float  # the program's wall time (start to exit/kill); for infra, time spent in run()
    detail: str = ""  # human-readable reason


# ---------------------------------------------------------------------------
# Linux plumbing (ctypes; Python 3.11 has no os.unshare / mount / pivot_root)

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000

_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000
_MNT_DETACH = 0x2

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38

_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

_libc_handle = None


def _libc():
    global _libc_handle
    if _libc_handle is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.unshare.argtypes = [ctypes.c_int]
        lib.setns.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        lib.syscall.restype = ctypes.c_long
        _libc_handle = lib
    return _libc_handle


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc().mount(_b(src), _b(dst), _b(fstype), flags, _b(data)), f"mount({src!r} -> {dst!r})")


def _unshare(flags: int) -> None:
    _check(_libc().unshare(flags), f"unshare({flags:#x})")


def _setns(fd: int, nstype: int) -> None:
    _check(_libc().setns(fd, nstype), "setns")


def _prctl(option: int, arg: int) -> None:
    _check(_libc().prctl(option, arg, 0, 0, 0), f"prctl({option})")


def _pivot_root_here() -> None:
    """pivot_root(".", ".") then detach the old root stacked on top (see pivot_root(2))."""
    nr = _SYS_PIVOT_ROOT.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"pivot_root syscall number unknown for {platform.machine()}")
    lib = _libc()
    _check(0 if lib.syscall(ctypes.c_long(nr), ctypes.c_char_p(b"."), ctypes.c_char_p(b".")) == 0 else -1, "pivot_root")
    _check(lib.umount2(b".", _MNT_DETACH), "umount2(old root)")


def _bind(src: str, dst: str, flags: int) -> None:
    _mount(src, dst, None, _MS_BIND)
    _mount(None, dst, None, _MS_REMOUNT | _MS_BIND | flags)


def _loopback_up() -> None:
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, req))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 0x1, b""))  # SIOCSIFFLAGS, IFF_UP


# ---------------------------------------------------------------------------
# seccomp: close what namespaces do not (vsock to the hypervisor, user namespaces, io_uring)

_AF_ALLOWED = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK (all confined to the run's netns)
_CLONE_NEW_MASK = 0x7E020000  # every CLONE_NEW* flag that clone(2) accepts
# arch: (AUDIT_ARCH, {name: nr}); anything else runs without the filter (see the docstring)
_SECCOMP_ARCH = {
    "x86_64": (0xC000003E, {"socket": 41, "clone": 56, "unshare": 272, "setns": 308, "clone3": 435,
                            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                            "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
                            "perf_event_open": 298, "userfaultfd": 323}),
    "aarch64": (0xC00000B7, {"socket": 198, "clone": 220, "unshare": 97, "setns": 268, "clone3": 435,
                             "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                             "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280,
                             "perf_event_open": 241, "userfaultfd": 282}),
}
_RET_ALLOW, _RET_KILL, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


def _seccomp_program() -> bytes | None:
    """A small classic-BPF filter (assembled here, labels resolved to jump offsets)."""
    import struct

    machine = platform.machine()
    if machine not in _SECCOMP_ARCH:
        return None
    arch, nr = _SECCOMP_ARCH[machine]
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    prog: list[tuple] = []  # (code, jt, jf, k); jt/jf: a label name or None (fall through)
    labels: dict[str, int] = {}

    def emit(code, k, jt=None, jf=None):
        prog.append((code, jt, jf, k))

    def label(name):
        labels[name] = len(prog)

    emit(LD, 4)  # seccomp_data.arch
    emit(JEQ, arch, None, "kill")  # a foreign ABI (e.g. a 32-bit binary) is not allowed at all
    emit(LD, 0)  # seccomp_data.nr
    if machine == "x86_64":
        emit(JGE, 0x40000000, "enosys")  # the x32 ABI
    emit(JEQ, nr["socket"], "socket")
    emit(JEQ, nr["clone"], "clone")
    for name in ("unshare", "setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd"):
        emit(JEQ, nr[name], "eperm")
    for name in ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register"):
        emit(JEQ, nr[name], "enosys")  # glibc falls back from clone3 to clone on ENOSYS
    emit(RET, _RET_ALLOW)
    label("socket")
    emit(LD, 16)  # args[0] (low half): the address family
    for af in _AF_ALLOWED:
        emit(JEQ, af, "allow")
    emit(RET, _RET_ERRNO | errno.EAFNOSUPPORT)
    label("clone")
    emit(LD, 16)  # args[0] (low half): the clone flags
    emit(JSET, _CLONE_NEW_MASK, "eperm")
    label("allow")
    emit(RET, _RET_ALLOW)
    label("eperm")
    emit(RET, _RET_ERRNO | errno.EPERM)
    label("enosys")
    emit(RET, _RET_ERRNO | errno.ENOSYS)
    label("kill")
    emit(RET, _RET_KILL)
    out = b""
    for i, (code, jt, jf, k) in enumerate(prog):
        off = [0 if t is None else labels[t] - i - 1 for t in (jt, jf)]
        out += struct.pack("=HBBI", code, off[0], off[1], k)
    return out


def _install_seccomp() -> bool:
    prog = _seccomp_program()
    if prog is None:
        return False

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    fprog = _Fprog(len(prog) // 8, prog)
    lib = _libc()
    rc = lib.prctl(22, 2, ctypes.cast(ctypes.pointer(fprog), ctypes.c_void_p).value, 0, 0)  # PR_SET_SECCOMP, FILTER
    _check(rc, "prctl(PR_SET_SECCOMP)")
    return True


# ---------------------------------------------------------------------------
# What the sandbox can see

_SYSTEM_TOPS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_DEV_NODES = ("null", "zero", "full", "random", "urandom")
_FORBIDDEN_WORKDIRS = ("/proc", "/sys", "/dev")


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


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
        if not any(_is_within(p, k) for k in keep):
            keep.append(p)
    return keep


def _check_workdir(wd: str, visible: Sequence[str]) -> None:
    if wd == "/" or any(_is_within(wd, f) for f in _FORBIDDEN_WORKDIRS):
        raise ValueError(f"workdir {wd!r} cannot be a sandbox workdir")
    for p in visible:
        if _is_within(p, wd):
            raise ValueError(f"workdir {wd!r} contains {p!r}, which the sandbox must see read-only")


def _chown_tree(root: str, uid: int, gid: int, *, handing_back: bool = False) -> None:
    """lchown every entry under root (symlinks are never followed).

    Handing the workdir to a run skips files with other hard links: the inode may be
    shared with the caller's task data, which the program must then not be able to
    modify (it can still read them, and replace the entry). Handing it back also
    strips setuid/setgid bits, so the program cannot leave a root-owned setuid file.
    """
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
                if not handing_back and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    continue
                os.lchown(p, uid, gid)
                if handing_back and stat.S_ISREG(st.st_mode) and st.st_mode & 0o6000:
                    os.chmod(p, st.st_mode & ~0o6000)
            except OSError:
                pass


def _build_root(wd: str, uid: int, tmp_mb: int, visible: Sequence[str]) -> None:
    """In a fresh mount namespace: assemble the allowlist root and pivot into it."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates back to the host
    # O_PATH handles first: the staging tmpfs may cover the sources (e.g. a workdir under /tmp)
    sources = [(os.open(p, os.O_PATH | os.O_CLOEXEC), p, os.path.isdir(p)) for p in visible]
    wfd = os.open(wd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    links = [(p, os.readlink(p)) for p in _SYSTEM_TOPS if os.path.islink(p)]
    new = "/tmp"  # staging mount point; only this namespace sees it, and it is detached below
    _mount("tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=4m,nr_inodes=8192")
    ro = _MS_RDONLY | _MS_NOSUID | _MS_NODEV
    for p, target in links:
        os.symlink(target, new + p)
    # scratch dirs first, so that a visible path below /tmp (a venv in a clone under /tmp) is
    # bound on top of the private /tmp instead of being hidden by it
    for scratch in ("/dev/shm", "/tmp"):
        os.makedirs(new + scratch, 0o755, exist_ok=True)
        _mount("tmpfs", new + scratch, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={tmp_mb}m")
    for fd, p, is_dir in sources:
        dst = new + p
        if is_dir:
            os.makedirs(dst, 0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
            open(dst, "a").close()
        _bind(f"/proc/self/fd/{fd}", dst, ro)
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
    os.makedirs(new + "/.sandbox", 0o755, exist_ok=True)
    accounts = {
        "passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                  f"sandbox:x:{uid}:{uid}:sandbox:{wd}:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nnogroup:x:65534:\nsandbox:x:{uid}:\n",
    }
    for name, text in accounts.items():
        with open(f"{new}/.sandbox/{name}", "w") as fh:
            fh.write(text)
        if os.path.isfile(f"{new}/etc/{name}"):
            _bind(f"{new}/.sandbox/{name}", f"{new}/etc/{name}", ro)
    os.makedirs(new + wd, 0o755, exist_ok=True)
    _bind(f"/proc/self/fd/{wfd}", new + wd, _MS_NOSUID | _MS_NODEV)  # the only writable host path
    os.close(wfd)
    os.chdir(new)
    _pivot_root_here()
    os.chdir("/")
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | ro)


# ---------------------------------------------------------------------------
# The program's bootstrap: the same source runs in-process (zygote) and via -c (cold)

_BOOT_SRC = r'''
def _wmrl_main(path, workdir, forked):
    import builtins, os, sys, types
    if forked:  # fresh stdio over fds 0-2, as a cold interpreter would have; keep the old objects alive
        import io, random
        global _wmrl_keep
        _wmrl_keep = (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__)
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8")
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                                       encoding="utf-8", errors="backslashreplace", line_buffering=True)
        random.seed()  # every fork would otherwise share the zygote's RNG state
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
    sys.argv = [path]
    sys.path.insert(0, workdir)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    main.__cached__ = None
    sys.modules["__main__"] = main
    code = 0
    try:
        with open(path, "rb") as fh:
            source = fh.read()
        exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as e:
        code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            try:
                print(code, file=sys.stderr)
            except Exception:
                pass
            code = 1
    except BaseException as e:
        tb = e.__traceback__.tb_next  # drop the bootstrap's own frame
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        code = 1
    try:  # what interpreter shutdown would do: wait for threads, atexit, flush
        import threading
        threading._shutdown()
    except BaseException:
        pass
    try:
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code & 0xFF)
'''

_BOOT_CALL = _BOOT_SRC + "\nimport sys\n_wmrl_main(sys.argv[1], sys.argv[2], False)\n"


# ---------------------------------------------------------------------------
# Inside: C1 (init and supervisor), C2 (the program)


def _send(sock: socket.socket, obj: dict, fds: Sequence[int] = ()) -> None:
    data = json.dumps(obj).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _host_pid() -> int:
    """Our pid in the host's pid namespace (read before our own /proc replaces the host's)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("NSpid:"):
                return int(line.split()[1])
    raise RuntimeError("no NSpid in /proc/self/status")


class _Backstop(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Backstop()


def _reap_namespace() -> None:
    """As init of the run's pid namespace: SIGKILL every other process in it and reap until none is left."""
    if os.getpid() != 1:  # kill(-1) outside our own pid namespace would hit the whole machine
        raise RuntimeError("refusing kill(-1): not the init of a private pid namespace")
    while True:
        try:
            os.kill(-1, signal.SIGKILL)  # scoped to this pid namespace; init itself is exempt
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _run_init(req: dict, out_w: int, err_w: int, st: socket.socket, visible: Sequence[str], forked: bool) -> None:
    """C1: pid 1 of the run's fresh pid namespace (root). Never returns.

    Builds the sandbox, forks the program (C2), reaps, then kills and reaps whatever
    the program left behind, restores workdir ownership and reports. Its death (the
    parent's timeout SIGKILL, or our PDEATHSIG when the zygote dies) makes the kernel
    kill every process in the namespace.
    """
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote ignores SIGCHLD (auto-reap)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getpid() != 1:
            _send(st, {"t": "infra", "detail": "pid namespace unavailable (needs root): refusing to run"})
            os._exit(0)
        os.umask(0o022)
        wd = req["workdir"]
        _check_workdir(wd, visible)
        uid = UID_BASE + _host_pid()
        flags = _CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWUTS
        netns, note = True, ""
        try:
            if req.get("simulate_no_netns"):
                raise OSError(errno.EPERM, "unshare(CLONE_NEWNET): simulated failure")
            _unshare(flags | _CLONE_NEWNET)
        except OSError as e:
            netns = False
            if req["require_netns"]:
                _send(st, {"t": "infra", "detail": f"network namespace unavailable ({e}); refusing to run without one"})
                os._exit(0)
            note = f"ran WITHOUT a network namespace ({e}; require_netns=False)"
            try:
                _unshare(flags)
            except OSError as e2:
                _send(st, {"t": "infra", "detail": f"sandbox namespaces unavailable (needs root): {e2}"})
                os._exit(0)
        if netns:
            try:
                _loopback_up()
            except OSError:
                pass  # loopback stays down: still isolated
        _chown_tree(wd, uid, uid)  # (if anything fails from here on, the parent hands the workdir back)
        _build_root(wd, uid, req["limits"]["max_file_mb"], visible)
        pidfd = os.pidfd_open(os.getpid())
        _send(st, {"t": "started", "uid": uid, "netns": netns, "note": note}, [pidfd])
        os.close(pidfd)
        signal.signal(signal.SIGALRM, _on_alarm)  # backstop if the parent never kills us
        signal.setitimer(signal.ITIMER_REAL, float(req["limits"]["timeout_s"]) + 10.0)
        t0 = time.monotonic()
        c2 = os.fork()
        if c2 == 0:
            _program(req, uid, out_w, err_w, st, forked)
        os.close(out_w)
        os.close(err_w)
        _release_stderr()  # the cold launcher's stderr is the capture pipe: hold no copy of it
        while True:
            pid, status, ru = os.wait4(-1, 0)
            if pid == c2:
                break
        wall = time.monotonic() - t0
        signal.setitimer(signal.ITIMER_REAL, 0)
        _reap_namespace()
        warn = ""
        try:
            _chown_tree(wd, req["owner"][0], req["owner"][1], handing_back=True)
        except OSError as e:
            warn = f"could not restore workdir ownership: {e}"
        _send(st, {"t": "exit", "status": status, "wall": wall, "cpu": ru.ru_utime + ru.ru_stime,
                   "maxrss_kb": ru.ru_maxrss, "warn": warn})
    except _Backstop:
        try:
            _reap_namespace()
            _send(st, {"t": "infra", "detail": "sandbox backstop: the parent did not enforce the timeout"})
        except BaseException:  # noqa: BLE001
            pass
    except BaseException as e:  # noqa: BLE001 - everything here is machinery failure
        try:
            _send(st, {"t": "infra", "detail": f"sandbox init failed: {type(e).__name__}: {e}"})
        except BaseException:  # noqa: BLE001
            pass
    os._exit(0)


def _release_stderr() -> None:
    null = os.open("/dev/null", os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)


def _spawn_init(req: dict, out_w: int, err_w: int, st_fd: int, visible: Sequence[str], forked: bool,
                pidns_fd: int | None, close_in_child: Sequence[socket.socket] = ()) -> int:
    """Fork C1 as pid 1 of a new pid namespace; return its pid (in our namespace)."""
    newpid = True
    try:
        _unshare(_CLONE_NEWPID)  # applies to our next child only ...
    except OSError:
        newpid = False  # C1 notices (its pid is not 1) and reports infra
    try:
        pid = os.fork()
    except OSError:
        pid = -1
        raise
    finally:
        if pid != 0 and newpid and pidns_fd is not None:
            _setns(pidns_fd, _CLONE_NEWPID)  # ... so that the next request can unshare again
    if pid == 0:
        try:
            for sock in close_in_child:
                sock.close()
            if pidns_fd is not None:
                os.close(pidns_fd)
            _run_init(req, out_w, err_w, socket.socket(fileno=st_fd), visible, forked)
        finally:
            os._exit(1)
    return pid


def _program(req: dict, uid: int, out_w: int, err_w: int, st: socket.socket, forked: bool) -> None:
    """C2: isolate, limit, drop privileges, run main.py. Never returns."""
    try:
        st_fd = st.detach()  # from here on fds are managed by number only
        os.setsid()
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(st_fd, 3)
        os.closerange(4, max(5, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
        os.set_inheritable(3, False)
        lim = req["limits"]
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (int(lim["cpu_s"]), int(lim["cpu_s"]) + 1))
        resource.setrlimit(resource.RLIMIT_AS, (lim["memory_mb"] * mb,) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim["max_file_mb"] * mb,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim["max_open_files"],) * 2)
        resource.setrlimit(resource.RLIMIT_NPROC, (lim["max_processes"],) * 2)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups():
            raise RuntimeError("privilege drop did not take effect")
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise RuntimeError("could regain root after the privilege drop")
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by the uid change; set again
        _install_seccomp()
        os.chdir(req["workdir"])
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as CPython does at startup
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # idem: writes past RLIMIT_FSIZE raise OSError(EFBIG)
        env = dict(req["env"])
        path = os.path.join(req["workdir"], "main.py")
        if not forked:
            os.execve(sys.executable, [sys.executable, "-I", "-c", _BOOT_CALL, path, req["workdir"]], env)
        os.environ.clear()
        os.environ.update(env)
        os.close(3)
    except BaseException as e:  # noqa: BLE001
        try:
            os.write(3, json.dumps({"t": "infra", "detail": f"sandbox program setup failed: {type(e).__name__}: {e}"}).encode())
        except OSError:
            pass
        os._exit(125)
    ns: dict = {"__name__": "_wmrl_boot"}
    exec(compile(_BOOT_SRC, "<wmrl-sandbox-boot>", "exec"), ns)
    ns["_wmrl_main"](path, req["workdir"], True)
    os._exit(1)  # not reached


# ---------------------------------------------------------------------------
# The zygote and the one-shot launcher (entry points of this file as a script)

#: warmed in the zygote along with "sklearn" (importing the top package leaves most estimators unloaded)
_SKLEARN_WARM = ("sklearn.base", "sklearn.utils", "sklearn.metrics", "sklearn.model_selection", "sklearn.preprocessing",
                 "sklearn.linear_model", "sklearn.ensemble", "sklearn.tree", "sklearn.neighbors", "sklearn.svm",
                 "sklearn.pipeline", "sklearn.impute", "sklearn.decomposition", "sklearn.datasets")


def _zygote_main(fd: int, preload: Sequence[str]) -> None:
    import gc
    import importlib

    ctl = socket.socket(fileno=fd)
    failed = []
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - the program will meet the same error cold
            failed.append(f"{name}: {type(e).__name__}: {e}")
        if name == "sklearn":
            for sub in _SKLEARN_WARM:
                try:
                    importlib.import_module(sub)
                except Exception:  # noqa: BLE001
                    pass
    visible = _visible_paths()
    _libc()
    pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    gc.collect()
    gc.freeze()  # keep forks copy-on-write friendly
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # runs are reaped automatically
    _send(ctl, {"t": "ready", "pid": os.getpid(), "failed": failed})
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 16, 3)
        except OSError:
            break
        if not msg:
            break  # the parent went away
        if len(fds) != 3:
            for f in fds:
                os.close(f)
            continue
        out_w, err_w, st_fd = fds
        try:
            _spawn_init(json.loads(msg), out_w, err_w, st_fd, visible, True, pidns_fd, close_in_child=[ctl])
        except Exception as e:  # noqa: BLE001
            with socket.socket(fileno=os.dup(st_fd)) as st:
                try:
                    _send(st, {"t": "infra", "detail": f"zygote could not start the run: {type(e).__name__}: {e}"})
                except OSError:
                    pass
        for f in fds:
            os.close(f)
    os._exit(0)


def _launch_main(out_w: int, err_w: int, st_fd: int, req_json: str) -> None:
    """The cold path's launcher (a fresh stdlib-only interpreter): start one run, wait for it."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    pid = _spawn_init(json.loads(req_json), out_w, err_w, st_fd, _visible_paths(), False, None)
    for f in (out_w, err_w, st_fd):
        os.close(f)
    _release_stderr()
    os.waitpid(pid, 0)
    os._exit(0)


# ---------------------------------------------------------------------------
# Outside: the parent


class _Infra(Exception):
    pass


class _Capture:
    """Keep the first and last cap/2 bytes of a stream; count the rest."""

    def __init__(self, cap: int):
        self.head_cap = cap - cap // 2
        self.tail_cap = cap // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_cap:
            self.tail += chunk[-self.tail_cap:]
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    def text(self) -> str:
        dropped = self.total - len(self.head) - len(self.tail)
        if dropped <= 0:
            return (self.head + self.tail).decode("utf-8", "replace")
        return (self.head.decode("utf-8", "replace") + f"\n[... {dropped} bytes truncated by the sandbox ...]\n"
                + self.tail.decode("utf-8", "replace"))


def _base_env() -> dict[str, str]:
    env = {
        "PATH": os.pathsep.join(dict.fromkeys([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
    }
    for key in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


_MEMORY_RE = re.compile(r"^(?:[\w.]+\.)?\w*MemoryError\b|std::bad_alloc|Cannot allocate memory|out of memory", re.M)


_EXC_LINE_RE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b")


def _last_line(text: str) -> str:
    """The last exception line of a traceback (output may be interleaved from several processes)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if _EXC_LINE_RE.match(ln):
            return ln
    return lines[-1] if lines else ""


def _classify(lim: SandboxLimits, exit_msg: dict | None, timed_out: bool, stderr: str) -> tuple[str, int | None, str]:
    mb = f"{lim.max_file_mb} MB"
    if timed_out:
        return "timeout", None, f"wall-clock timeout after {lim.timeout_s:g} s; the whole process tree was killed"
    status = exit_msg["status"]
    tail = stderr[-4000:]
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        if code == 0:
            return "ok", 0, ""
        last = _last_line(tail)
        if _MEMORY_RE.search(last):
            return "oom", code, f"out of memory ({last}); address-space limit RLIMIT_AS = {lim.memory_mb} MB"
        if "File too large" in tail or "[Errno 27]" in tail:
            return "error", code, f"file size limit exceeded (RLIMIT_FSIZE = {mb}): {last}"
        if "BlockingIOError: [Errno 11]" in tail:
            return "error", code, f"process limit reached (RLIMIT_NPROC = {lim.max_processes}): {last}"
        return "error", code, f"exit code {code}" + (f": {last}" if last else "")
    sig = os.WTERMSIG(status)
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    cpu_hit = exit_msg.get("cpu", 0.0) >= lim.cpu_s - 0.05
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_hit):
        return "timeout", -sig, f"killed by {name}: CPU time limit (RLIMIT_CPU = {lim.cpu_s} s) exceeded"
    if sig == signal.SIGXFSZ:
        return "killed", -sig, f"killed by SIGXFSZ: file size limit (RLIMIT_FSIZE = {mb}) exceeded"
    if _MEMORY_RE.search(tail):
        return "oom", -sig, f"killed by {name} after a memory allocation failure (RLIMIT_AS = {lim.memory_mb} MB)"
    if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
        return "killed", -sig, f"killed by {name} (a crash; possibly the address-space limit RLIMIT_AS = {lim.memory_mb} MB)"
    if sig == signal.SIGKILL:
        return "killed", -sig, "killed by SIGKILL (not by the sandbox's timeout: e.g. the kernel OOM killer or the program itself)"
    return "killed", -sig, f"killed by {name}"


def _wait_pidfd(pidfd: int, timeout: float) -> bool:
    import select

    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(int(timeout * 1000)))


class _Zygote:
    def __init__(self, preload: Sequence[str], env: dict[str, str]):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", _SELF, "--zygote", str(child.fileno()), json.dumps(list(preload))],
                pass_fds=[child.fileno()], env={**env, "HOME": "/nonexistent"}, cwd="/",
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            child.close()
        self.sock = parent
        parent.settimeout(180)
        try:
            msg = parent.recv(1 << 16)
        except OSError as e:
            self.kill()
            raise _Infra(f"zygote did not start: {e}") from None
        finally:
            parent.settimeout(None)
        if not msg:
            self.kill()
            raise _Infra(f"zygote exited during start-up (code {self.proc.poll()})")
        self.info = json.loads(msg)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def submit(self, req: dict, fds: Sequence[int]) -> None:
        socket.send_fds(self.sock, [json.dumps(req).encode()], list(fds))

    def kill(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=2)  # EOF on its socket makes it exit
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Sandbox:
    """Runs `code` as `workdir/main.py` in an isolated, limited process tree (see the module docstring)."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), *, preload: Sequence[str] = ("numpy", "pandas", "sklearn"),
                 use_zygote: bool = True, require_netns: bool = True):
        self.limits = limits
        self.preload = tuple(preload)
        self.use_zygote = use_zygote
        self.require_netns = require_netns
        self._env = _base_env()
        self._lock = threading.Lock()
        self._zygote: _Zygote | None = None
        self._visible: list[str] | None = None
        self._closed = False

    # -- lifecycle
    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._zygote is not None:
                self._zygote.kill()
                self._zygote = None

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # best effort; the zygote also exits when our end of its socket closes
        try:
            if self._zygote is not None:
                self._zygote.kill()
        except Exception:  # noqa: BLE001
            pass

    # -- running
    def run(self, code: str, workdir: str | Path, *, limits: SandboxLimits | None = None) -> ExecResult:
        lim = limits or self.limits
        t_call = time.monotonic()
        wd = os.path.realpath(os.fspath(workdir))
        if not os.path.isdir(wd):
            raise FileNotFoundError(f"sandbox workdir {wd!r} does not exist (the caller creates it)")
        if self._visible is None:
            self._visible = _visible_paths(with_sys_path=False)  # our sys.path may hold cwd; the child re-checks
        _check_workdir(wd, self._visible)
        if self._closed:
            return ExecResult("infra", None, "", "", 0.0, "sandbox is closed")
        with open(os.path.join(wd, "main.py"), "w", encoding="utf-8") as fh:
            fh.write(code)
        req = {
            "workdir": wd, "limits": asdict(lim), "env": {**self._env, "HOME": wd},
            "require_netns": self.require_netns, "owner": [os.geteuid(), os.getegid()],
        }
        if getattr(self, "_simulate_no_netns", False):  # test hook for the fail-closed path
            req["simulate_no_netns"] = True
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st, st_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        launcher = None
        try:
            if self.use_zygote:
                self._submit(req, [out_w, err_w, st_child.fileno()])
            else:
                launcher = subprocess.Popen(
                    [sys.executable, "-I", _SELF, "--launch", str(out_w), str(err_w), str(st_child.fileno()), json.dumps(req)],
                    pass_fds=[out_w, err_w, st_child.fileno()], env=self._env, cwd="/",
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_w,
                )
        except (_Infra, OSError) as e:
            for f in (out_r, err_r):
                os.close(f)
            st.close()
            return ExecResult("infra", None, "", "", time.monotonic() - t_call, f"could not start the sandbox: {e}")
        finally:
            os.close(out_w)
            os.close(err_w)
            st_child.close()
        try:
            return self._collect(lim, out_r, err_r, st, t_call, wd)
        finally:
            if launcher is not None:
                try:
                    launcher.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    launcher.kill()
                    launcher.wait()

    def _submit(self, req: dict, fds: Sequence[int]) -> None:
        with self._lock:
            if self._closed:
                raise _Infra("sandbox is closed")
            for attempt in (0, 1):
                if self._zygote is None or not self._zygote.alive():
                    if self._zygote is not None:
                        self._zygote.kill()
                    self._zygote = None
                    self._zygote = _Zygote(self.preload, self._env)
                try:
                    self._zygote.submit(req, fds)
                    return
                except OSError as e:  # it died between runs: the program has not started, so retry once
                    self._zygote.kill()
                    self._zygote = None
                    if attempt:
                        raise _Infra(f"zygote unreachable: {e}") from None

    def _collect(self, lim: SandboxLimits, out_r: int, err_r: int, st: socket.socket, t_call: float,
                 wd: str) -> ExecResult:
        out, err = _Capture(lim.max_output_bytes), _Capture(lim.max_output_bytes)
        sel = selectors.DefaultSelector()
        sel.register(out_r, selectors.EVENT_READ, out)
        sel.register(err_r, selectors.EVENT_READ, err)
        sel.register(st, selectors.EVENT_READ, None)
        open_fds = {out_r, err_r}
        st_open = True
        pidfd = None
        started_at = deadline = drain_until = None
        exit_msg = None
        infra: list[str] = []
        notes: list[str] = []
        timed_out = False
        setup_deadline = time.monotonic() + 120.0  # zygote start-up is not counted
        try:
            # done when the pipes are closed and init has reported (it has reaped every program
            # process by then; its own exit is not waited for) or has gone away
            while open_fds or (st_open and exit_msg is None):
                now = time.monotonic()
                if deadline is not None and exit_msg is None and not timed_out and now >= deadline:
                    self._kill(pidfd)
                    timed_out = True
                if (not st_open or exit_msg is not None) and drain_until is None:
                    drain_until = now + 2.0  # no program process is left: the pipes close at once
                if drain_until is not None and now >= drain_until:
                    break
                if started_at is None and st_open and now >= setup_deadline:
                    infra.append("sandbox set-up did not finish in 120 s")
                    break
                waits = [t - now for t in (deadline if exit_msg is None and not timed_out else None, drain_until,
                                           setup_deadline if started_at is None else None) if t is not None]
                for key, _ in sel.select(max(0.0, min(waits)) if waits else None):
                    if key.data is not None:
                        chunk = os.read(key.fd, 1 << 16)
                        if chunk:
                            key.data.feed(chunk)
                        else:
                            sel.unregister(key.fd)
                            open_fds.discard(key.fd)
                        continue
                    try:
                        msg, fds, _f, _a = socket.recv_fds(st, 1 << 16, 2)
                    except OSError:
                        msg, fds = b"", []
                    if not msg:
                        sel.unregister(st)
                        st_open = False
                        continue
                    m = json.loads(msg)
                    if m["t"] == "started" and started_at is None:
                        if fds:
                            pidfd = fds.pop(0)
                        started_at = time.monotonic()
                        deadline = started_at + lim.timeout_s
                        if m.get("note"):
                            notes.append(m["note"])
                    elif m["t"] == "exit":
                        exit_msg = m
                        if m.get("warn"):
                            notes.append(m["warn"])
                    elif m["t"] == "infra":
                        infra.append(m["detail"])
                    for f in fds:
                        os.close(f)
        finally:
            sel.close()
            for f in (out_r, err_r):
                os.close(f)
            st.close()
            if pidfd is not None:
                if exit_msg is None:
                    self._kill(pidfd)  # never leave a tree behind, whatever went wrong
                _wait_pidfd(pidfd, 10.0)  # readable once the init (hence its whole namespace) is gone
                os.close(pidfd)
        if exit_msg is None and (pidfd is not None or not st_open):  # init is gone without handing it back
            try:
                _chown_tree(wd, os.geteuid(), os.getegid(), handing_back=True)
            except OSError as e:
                notes.append(f"could not restore workdir ownership: {e}")
        stdout, stderr = out.text(), err.text()
        if exit_msg is not None and not timed_out:
            wall = exit_msg["wall"]
        else:
            wall = time.monotonic() - (started_at if started_at is not None else t_call)
        if timed_out:
            return ExecResult("timeout", None, stdout, stderr, wall, "; ".join([_classify(lim, None, True, "")[2], *notes]))
        if infra or exit_msg is None:
            if not infra:
                alive = (self._zygote is not None and self._zygote.alive()) if self.use_zygote else True
                infra.append("the sandbox machinery died before reporting the program's exit"
                             + ("" if alive else " (the zygote died; it is restarted on the next run)"))
            return ExecResult("infra", None, stdout, stderr, wall, "; ".join(infra + notes))
        status, rc, detail = _classify(lim, exit_msg, False, stderr)
        return ExecResult(status, rc, stdout, stderr, wall, "; ".join(x for x in [detail, *notes] if x))

    @staticmethod
    def _kill(pidfd: int | None) -> None:
        if pidfd is None:
            return
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass  # already gone


class SandboxPool:
    """Up to `slots` concurrent executions through one shared Sandbox (one zygote serves all slots)."""

    def __init__(self, slots: int | None = None, limits: SandboxLimits = SandboxLimits(), **sandbox_kwargs):
        self.slots = int(slots or os.cpu_count() or 1)
        if self.slots < 1:
            raise ValueError("slots must be >= 1")
        self.sandbox = Sandbox(limits, **sandbox_kwargs)
        self._executor = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="wmrl-sandbox")

    def run_many(self, jobs: Sequence[tuple]) -> list[ExecResult]:
        """Run (code, workdir[, limits]) jobs; results aligned with jobs."""
        futures = [self._executor.submit(self.sandbox.run, job[0], job[1], limits=job[2] if len(job) > 2 else None)
                   for job in jobs]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.sandbox.close()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--zygote"]:
        _zygote_main(int(sys.argv[2]), json.loads(sys.argv[3]))
    elif sys.argv[1:2] == ["--launch"]:
        _launch_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        sys.exit("usage: python -I sandbox.py --zygote FD PRELOAD_JSON | --launch OUT ERR STATUS REQUEST_JSON")
