"""Run untrusted, agent-written experiment code in a sandbox.

Why
---
An AutoResearch agent writes ML experiment code; we execute it and the graded
result is the reward. The code is untrusted: a policy under RL pressure will
find any way to read the hidden test labels, to reach the network, to wedge the
machine, to kill the trainer, or to make the trusted side -- which runs as root
next to it -- do any of that on its behalf. So it runs only in here, and what
it leaves behind comes back only as bytes the supervisor chose to read.

Real execution is the expensive part of RL here, so per-execution overhead
matters. A *zygote* process imports numpy/pandas/scikit-learn once and forks a
child per execution (tens of ms instead of ~1.5 s of cold imports).

Threat model
------------
The attacker owns every byte the program writes and every inode it makes until
every one of its processes is dead: stdout and stderr, its exit status and
signals, the workdir's contents and types (links, FIFOs, sockets, deep trees,
many entries, odd names, sizes), its memory. It does not own the kernel (kernel
exploits are only narrowed, see below), this module, the supervisor (C1, root),
the inputs directory, or the parent. The trusted side reads nothing the program
wrote except: the requested output files (regular files only, opened without
following links or blocking, at most `max_result_bytes`, through a handle on the
workdir opened before the program ran), the first and last
`max_output_bytes // 2` bytes of each output stream, and the kernel's counters.

Design: fresh namespaces, a fresh uid and a fresh workdir for every execution
--------------------------------------------------------------------------
Each execution is two processes, both forks of the zygote (or, on the cold
path ``use_zygote=False``, of a small stdlib-only launcher):

* C1, *init and supervisor*: forked as pid 1 of a new pid namespace (root).
  It asks the parent to move it into the run's memory cgroup (the parent
  writes its pid while C1 builds the sandbox, so the migration's RCU grace
  period is not paid by the program), ``unshare(NEWNS|NEWNET|NEWIPC|NEWUTS)``,
  builds the new root (below), hands the parent a pidfd for itself, forks the
  program, reaps it, then SIGKILLs and reaps whatever the program left behind,
  opens the requested outputs and passes them to the parent as descriptors,
  and reports the exit status. When C1 dies the kernel kills every process in
  its namespace, so the parent's timeout is a single SIGKILL to C1 and nothing
  survives it -- not setsid'd daemons, not a fork bomb. ``run`` returns only
  once every program process is gone (reaped by C1, or killed with it).
* C2, the *program*: new session, stdio on the capture pipes, rlimits, drop to
  the run's uid, ``PR_SET_NO_NEW_PRIVS``, a seccomp filter, scrubbed env,
  ``chdir(WORKDIR)``, then ``WORKDIR/main.py`` runs as ``__main__`` -- in-process
  on the zygote path, by ``execve(sys.executable)`` on the cold path, through
  the same bootstrap so both behave alike (tested).

* Filesystem -- an **allowlist root** and a **workdir no host path reaches**.
  C1 mounts a tmpfs and bind-mounts into it, read-only/nosuid/nodev, only:
  /usr and /etc (and the /bin, /lib symlinks), the Python installation (its
  prefixes and the isolated interpreter's sys.path), five /dev nodes,
  /sys/devices/system/cpu and a fresh /proc. The workdir (``WORKDIR``), /tmp
  and /dev/shm are three directories of one further tmpfs of ``disk_mb`` and
  ``max_inodes``, made for this execution: C1 writes main.py into it (from a
  memfd: the host never writes a path the program could have shaped) and binds
  each entry of the caller's trusted ``inputs`` directory into it read-only.
  Then it ``pivot_root``s and detaches the old root. The hidden labels, the
  repository and other runs are not in the sandbox's view at all, and nothing
  but that tmpfs is writable. When the namespace dies the kernel frees the
  tmpfs: no host code ever walks, chowns, reads by path or deletes what the
  program left, so links, FIFOs, device nodes, deep trees, huge numbers of
  entries and odd names cannot reach the trusted side. Every execution starts
  from the same files; nothing survives from one to the next.
* Privileges -- a **per-execution uid** (``UID_BASE`` + C1's host pid): no
  groups, no capabilities, no-new-privs, every bind nosuid. This makes
  RLIMIT_NPROC effective and per run (a fork bomb in one slot cannot starve
  another) and leaves nothing to signal or ptrace: the parent, the trainer
  and the zygote are outside the pid namespace (invisible), C1 is root
  (EPERM), concurrent runs have other uids and namespaces; /proc is mounted
  hidepid=2. Inputs are bound read-only, so even hard-linked task data cannot
  be changed, and a hard link out of the workdir crosses a mount (EXDEV).
* Memory -- a **memory cgroup per execution** (`cgroups.py`, v1 or v2): the
  kernel charges the run with everything its processes hold, including tmpfs
  files (workdir, /tmp, /dev/shm), memfds and shared mappings, which RLIMIT_AS
  does not see; at ``memory_mb`` its OOM killer acts, and the cgroup's counter
  tells the supervisor it did. Without a memory cgroup every run fails closed
  ("infra") unless ``require_memory_cgroup=False`` was passed, which falls back
  to RLIMIT_AS = ``memory_mb`` per process. The disk is memory too, hence
  ``disk_mb <= memory_mb / 2``.
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
  keyring, and huge pages (MAP_HUGETLB, MFD_HUGETLB, SHM_HUGETLB: the memory
  cgroup does not count them); foreign ABIs (32-bit binaries, x32) are killed.
* Limits: RLIMIT_CPU (soft; hard = soft + 1 s), RLIMIT_FSIZE, RLIMIT_NOFILE,
  RLIMIT_NPROC and RLIMIT_CORE=0, set before the drop.

Status (``ExecResult.status``) is what the supervisor observed, never text the
program printed: exit 0 -> "ok"; other exit -> "error" (detail: the exit code;
the program's traceback stays in ``stderr`` and ``exception_line``, apart);
wall timeout, or SIGXCPU/SIGKILL once the CPU used reached RLIMIT_CPU ->
"timeout"; any process of the run OOM-killed by its cgroup -> "oom" (also when
the kernel chose the supervisor: the program's processes are made the OOM
killer's first choice, and where CAP_SYS_RESOURCE allows the supervisor is
exempt); death by another signal -> "killed" (a self-sent SIGXCPU is not a
timeout); anything wrong with the machinery itself (zygote died, fork failed,
namespaces or cgroup unavailable) -> "infra", which the caller must grade
UNKNOWN, never 0. A zygote that died with a request in hand is replaced and
the request sent once more (nothing had run); a dead zygote is restarted by
the next run.

Bounds on the trusted side: stdout and stderr each keep their first and last
``max_output_bytes // 2`` bytes, the rest is read and discarded (printing
100 MB neither blocks nor costs memory); each output file costs at most
``max_result_bytes`` of memory and is never followed, waited on or overread;
the parent waits at most ``timeout_s`` for the program plus 2 s to drain, and
180 s for a zygote to start and 120 s for a run's set-up; tearing down the workdir is the kernel's, bounded
by ``disk_mb`` and ``max_inodes``.

Not enforced: CPU share across concurrent runs (RLIMIT_CPU is per process; a
run may use every core until its wall timeout), I/O bandwidth, kernel memory
the memory cgroup does not charge (AF_UNIX socket buffers on v1 and v2, and
UDP buffers on v1: bounded only by RLIMIT_NOFILE x RLIMIT_NPROC x the
host's socket buffer sizes), and the kernel itself (the seccomp filter is a
denylist). An OOM kill while the run was below its own limit (host memory
pressure, e.g. slots x ``memory_mb`` over the machine) is "infra", not the
program's "oom". Everything world-readable under
/usr, /etc and the Python installation is readable by the program, so hidden
data must not live there. Needs root (CAP_SYS_ADMIN, CAP_SETUID) on Linux >=
5.3 (pidfds) and a writable memory cgroup; without them every run is "infra".

Only the standard library is imported here: this file is also the zygote's and
the launcher's entry point (``python -I sandbox.py --zygote|--launch``).
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
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
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["SandboxLimits", "ExecResult", "FileProblem", "Sandbox", "SandboxPool", "UID_BASE", "WORKDIR",
           "read_regular_file"]

#: per-execution uid = UID_BASE + host pid of the run's supervisor (unique among live runs)
UID_BASE = 0x70000000
#: the program's working directory inside the sandbox (a fresh tmpfs every execution)
WORKDIR = "/sandbox/work"

_SELF = os.path.realpath(__file__)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 30.0  # wall clock; the whole process tree is killed after it
    cpu_s: int = 60  # RLIMIT_CPU (per process)
    memory_mb: int = 2048  # the run's memory cgroup: every process, tmpfs file, memfd and shm segment together
    max_processes: int = 64  # RLIMIT_NPROC (per run: every run has its own uid)
    max_file_mb: int = 256  # RLIMIT_FSIZE (per file)
    disk_mb: int = 512  # the workdir, /tmp and /dev/shm together (one tmpfs, also charged to memory_mb)
    max_inodes: int = 16384  # files, directories and links in the workdir, /tmp and /dev/shm together
    max_open_files: int = 256  # RLIMIT_NOFILE
    max_output_bytes: int = 64_000  # stdout and stderr each; head + tail kept beyond
    max_result_bytes: int = 16 * 2**20  # each requested output file; a larger one is reported, not read

    def __post_init__(self):
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"SandboxLimits.{f.name} must be > 0")
        if self.disk_mb > self.memory_mb // 2:  # tmpfs is memory: leave the processes room beside a full disk
            raise ValueError(f"SandboxLimits.disk_mb ({self.disk_mb}) must be at most half of memory_mb "
                             f"({self.memory_mb}): the run's files are held in its memory")


@dataclass(frozen=True)
class FileProblem:
    """Why a requested output file was not collected (observed by the supervisor, not said by the program)."""

    kind: str  # "missing" | "symlink" | "directory" | "fifo" | "socket" | "device" | "too_large" | "unreadable"
    size: int | None = None  # bytes, for "too_large"

    def describe(self) -> str:
        return {
            "missing": "was not written",
            "symlink": "is a symbolic link",
            "directory": "is a directory",
            "fifo": "is a FIFO",
            "socket": "is a socket",
            "device": "is a device node",
            "too_large": f"is {self.size} bytes, over the size limit",
        }.get(self.kind, "could not be read")


@dataclass(frozen=True)
class ExecResult:
    status: str  # "ok" | "error" | "timeout" | "oom" | "killed" | "infra": what the supervisor observed
    returncode: int | None  # exit code, -signal if killed by a signal, None for timeout/infra
    stdout: str  # the program's own output: untrusted text
    stderr: str  # idem (for "error" it usually holds the traceback)
    wall_s: float  # the program's wall time (start to exit/kill); for infra, time spent in run()
    detail: str = ""  # the supervisor's reason, in its own words (never the program's text)
    files: dict[str, bytes] = field(default_factory=dict)  # requested outputs: regular files within the limit
    file_problems: dict[str, FileProblem] = field(default_factory=dict)  # requested outputs not collected, and why
    peak_memory_mb: float | None = None  # the run's memory cgroup high-water mark

    @property
    def exception_line(self) -> str:
        """The last exception line of stderr, as the program printed it (untrusted)."""
        return _last_line(self.stderr[-4000:])


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
# seccomp: close what namespaces do not (vsock to the hypervisor, user namespaces, io_uring, huge pages)

_AF_ALLOWED = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK (all confined to the run's netns)
_CLONE_NEW_MASK = 0x7E020000  # every CLONE_NEW* flag that clone(2) accepts
# arch: (AUDIT_ARCH, {name: nr}); anything else runs without the filter (see the docstring)
_SECCOMP_ARCH = {
    "x86_64": (0xC000003E, {"socket": 41, "clone": 56, "unshare": 272, "setns": 308, "clone3": 435,
                            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                            "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
                            "perf_event_open": 298, "userfaultfd": 323, "mmap": 9, "memfd_create": 319,
                            "shmget": 29}),
    "aarch64": (0xC00000B7, {"socket": 198, "clone": 220, "unshare": 97, "setns": 268, "clone3": 435,
                             "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                             "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280,
                             "perf_event_open": 241, "userfaultfd": 282, "mmap": 222, "memfd_create": 279,
                             "shmget": 194}),
}
_RET_ALLOW, _RET_KILL, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
#: huge pages live outside the memory cgroup: syscall -> (flags argument, the hugetlb flag refused)
_HUGETLB_FLAG = {"mmap": (3, 0x40000), "memfd_create": (1, 0x4), "shmget": (2, 0x800)}


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
    for name in _HUGETLB_FLAG:
        emit(JEQ, nr[name], name)
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
    for name, (arg, flag) in _HUGETLB_FLAG.items():
        label(name)
        emit(LD, 16 + 8 * arg)  # the flags argument (low half)
        emit(JSET, flag, "eperm")
        emit(RET, _RET_ALLOW)
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
_FORBIDDEN_INPUTS = ("/proc", "/sys", "/dev")


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
        if _is_within(p, os.path.dirname(WORKDIR)) or _is_within(WORKDIR, p):
            raise RuntimeError(f"the Python installation path {p!r} collides with the sandbox's workdir {WORKDIR!r}")
        if not any(_is_within(p, k) for k in keep):
            keep.append(p)
    return keep


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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


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


#: the descriptors a run is handed, in this order
_FD_NAMES = ("stdout", "stderr", "status", "code")


def _run_init(req: dict, fds: dict[str, int], visible: Sequence[str], forked: bool) -> None:
    """C1: pid 1 of the run's fresh pid namespace (root). Never returns.

    Builds the sandbox, forks the program (C2), reaps, then kills and reaps whatever
    the program left behind, collects the requested outputs and reports. Its death
    (the parent's timeout SIGKILL, or our PDEATHSIG when the zygote dies) makes the
    kernel kill every process in the namespace.
    """
    st = socket.socket(fileno=fds["status"])
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote ignores SIGCHLD (auto-reap)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getpid() != 1:
            _send(st, {"t": "infra", "detail": "pid namespace unavailable (needs root): refusing to run"})
            os._exit(0)
        os.umask(0o022)
        host_pid = _host_pid()
        uid = UID_BASE + host_pid
        _set_oom_score_adj(-1000)  # where allowed (CAP_SYS_RESOURCE): the OOM killer never takes the supervisor
        # a handle on us first, so the parent can kill the run from here on; it also moves us into the
        # run's memory cgroup while we build the sandbox (a cgroup migration waits for an RCU grace
        # period, ~10 ms: overlapped here, not paid by the program)
        pidfd = os.pidfd_open(os.getpid())
        _send(st, {"t": "hello", "pid": host_pid}, [pidfd])
        os.close(pidfd)
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
        work_fd = _build_root(req, uid, fds["code"], visible)
        os.close(fds["code"])
        st.settimeout(30.0)
        if st.recv(16) != b"go":  # the parent could not place us: it reports why
            os._exit(0)
        st.settimeout(None)
        _send(st, {"t": "started", "uid": uid, "netns": netns, "note": note})
        signal.signal(signal.SIGALRM, _on_alarm)  # backstop if the parent never kills us
        signal.setitimer(signal.ITIMER_REAL, float(req["limits"]["timeout_s"]) + 10.0)
        t0 = time.monotonic()
        c2 = os.fork()
        if c2 == 0:
            _program(req, uid, fds, st, forked)
        os.close(fds["stdout"])
        os.close(fds["stderr"])
        _release_stderr()  # the cold launcher's stderr is the capture pipe: hold no copy of it
        while True:
            pid, status, ru = os.wait4(-1, 0)
            if pid == c2:
                break
        wall = time.monotonic() - t0
        signal.setitimer(signal.ITIMER_REAL, 0)
        _reap_namespace()
        # the outputs go to the parent as descriptors: no copy, no allocation here, nothing followed
        files, problems, out_fds = {}, {}, []
        for name in req["outputs"]:
            fd, problem = open_regular_file(work_fd, name, int(req["limits"]["max_result_bytes"]))
            if fd is None:
                problems[name] = [problem.kind, problem.size]
            else:
                files[name] = len(out_fds)
                out_fds.append(fd)
        disk = os.fstatvfs(work_fd)
        full = disk.f_bavail * disk.f_frsize < (64 << 10) or disk.f_favail == 0
        _send(st, {"t": "exit", "status": status, "wall": wall, "cpu": ru.ru_utime + ru.ru_stime,
                   "maxrss_kb": ru.ru_maxrss, "files": files, "problems": problems, "disk_full": full}, out_fds)
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


def _set_oom_score_adj(value: int) -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write(str(value))
    except PermissionError:
        pass  # lowering needs CAP_SYS_RESOURCE; a supervisor killed at the limit is still classified "oom"


def _release_stderr() -> None:
    null = os.open("/dev/null", os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)


def _spawn_init(req: dict, fds: dict[str, int], visible: Sequence[str], forked: bool,
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
            _run_init(req, fds, visible, forked)
        finally:
            os._exit(1)
    return pid


def _program(req: dict, uid: int, fds: dict[str, int], st: socket.socket, forked: bool) -> None:
    """C2: isolate, limit, drop privileges, run main.py. Never returns (born in the run's memory cgroup)."""
    try:
        st_fd = st.detach()  # from here on fds are managed by number only
        _set_oom_score_adj(1000)  # the program's processes are the OOM killer's first choice
        os.setsid()
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(fds["stdout"], 1)
        os.dup2(fds["stderr"], 2)
        os.dup2(st_fd, 3)
        os.closerange(4, max(5, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
        os.set_inheritable(3, False)
        lim = req["limits"]
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (int(lim["cpu_s"]), int(lim["cpu_s"]) + 1))
        if not req["memory_cgroup"]:  # without a cgroup (require_memory_cgroup=False) only this per-process bound is left
            resource.setrlimit(resource.RLIMIT_AS, (lim["memory_mb"] * mb,) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim["max_file_mb"] * mb,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim["max_open_files"],) * 2)
        resource.setrlimit(resource.RLIMIT_NPROC, (lim["max_processes"],) * 2)
        for which, value in ((resource.RLIMIT_RTPRIO, 0), (resource.RLIMIT_NICE, 0),  # no real-time, no priority boost
                             (resource.RLIMIT_MEMLOCK, 64 << 10), (resource.RLIMIT_MSGQUEUE, 1 << 20),
                             (resource.RLIMIT_SIGPENDING, 4096)):
            hard = resource.getrlimit(which)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)  # raising needs CAP_SYS_RESOURCE
            resource.setrlimit(which, (value, value))
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
        os.chdir(WORKDIR)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as CPython does at startup
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # idem: writes past RLIMIT_FSIZE raise OSError(EFBIG)
        env = dict(req["env"])
        path = WORKDIR + "/main.py"
        if not forked:
            os.execve(sys.executable, [sys.executable, "-I", "-c", _BOOT_CALL, path, WORKDIR], env)
        os.environ.clear()
        os.environ.update(env)
        os.close(3)
    except BaseException as e:  # noqa: BLE001
        try:
            os.write(3, json.dumps({"t": "infra", "detail": f"sandbox program setup failed: {type(e).__name__}: {e}"}).encode())
        except OSError:
            pass
        os._exit(125)
    try:
        ns: dict = {"__name__": "_wmrl_boot"}
        exec(compile(_BOOT_SRC, "<wmrl-sandbox-boot>", "exec"), ns)
        ns["_wmrl_main"](path, WORKDIR, True)
    finally:
        os._exit(1)  # reached only if the program broke the bootstrap's own exit (e.g. a raising excepthook)


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
            msg, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 16, len(_FD_NAMES))
        except OSError:
            break
        if not msg:
            break  # the parent went away
        if len(fds) != len(_FD_NAMES):
            for f in fds:
                os.close(f)
            continue
        named = dict(zip(_FD_NAMES, fds))
        try:
            if _flags & socket.MSG_TRUNC:
                raise ValueError(f"the request is over {1 << 16} bytes")
            _spawn_init(json.loads(msg), named, visible, True, pidns_fd, close_in_child=[ctl])
        except Exception as e:  # noqa: BLE001
            with socket.socket(fileno=os.dup(named["status"])) as st:
                try:
                    _send(st, {"t": "infra", "detail": f"zygote could not start the run: {type(e).__name__}: {e}"})
                except OSError:
                    pass
        for f in fds:
            os.close(f)
    os._exit(0)


def _launch_main(fds_json: str, req_json: str) -> None:
    """The cold path's launcher (a fresh stdlib-only interpreter): start one run, wait for it."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    fds = json.loads(fds_json)
    pid = _spawn_init(json.loads(req_json), fds, _visible_paths(), False, None)
    for f in fds.values():
        os.close(f)
    _release_stderr()
    os.waitpid(pid, 0)
    os._exit(0)


# ---------------------------------------------------------------------------
# Outside: the parent


class _Infra(Exception):
    pass


class _ZygoteLost(Exception):
    """The zygote died with a request in hand, before the run's supervisor existed."""


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


_EXC_LINE_RE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b")


def _last_line(text: str) -> str:
    """The last exception line of a traceback (output may be interleaved from several processes)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if _EXC_LINE_RE.match(ln):
            return ln
    return lines[-1] if lines else ""


def _classify(lim: SandboxLimits, exit_msg: dict | None, timed_out: bool, oom_kills: int) -> tuple[str, int | None, str]:
    """The status from what the supervisor observed: exit status, signal, CPU used, the cgroup's OOM kills."""
    if timed_out:
        return "timeout", None, f"wall-clock timeout after {lim.timeout_s:g} s; the whole process tree was killed"
    oom = (f"killed by the memory limit: {oom_kills} process{'es' if oom_kills > 1 else ''} of the run OOM-killed "
           f"at {lim.memory_mb} MB (all its processes, tmpfs files, memfds and shared memory together)")
    if exit_msg is None:
        return "oom", None, oom
    status = exit_msg["status"]
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        if oom_kills and code != 0:
            return "oom", code, oom
        if code == 0:
            return "ok", 0, oom if oom_kills else ""
        return "error", code, f"exit code {code}"
    sig = os.WTERMSIG(status)
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    if oom_kills:
        return "oom", -sig, oom
    cpu_hit = exit_msg.get("cpu", 0.0) >= lim.cpu_s - 0.05
    if cpu_hit and sig in (signal.SIGXCPU, signal.SIGKILL):
        return "timeout", -sig, f"killed by {name}: CPU time limit (RLIMIT_CPU = {lim.cpu_s} s) exceeded"
    if sig == signal.SIGXFSZ:
        return "killed", -sig, f"killed by SIGXFSZ: file size limit (RLIMIT_FSIZE = {lim.max_file_mb} MB)"
    if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
        return "killed", -sig, f"killed by {name} (a crash)"
    return "killed", -sig, f"killed by {name} (not by a limit of the sandbox: e.g. by the program itself)"


def _readable(sock: socket.socket) -> bool:
    import select

    return bool(select.select([sock], [], [], 0)[0])


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

    def alive(self, wait_s: float = 0.0) -> bool:
        """Whether it runs; `wait_s` gives one killed a moment ago the time to be reaped."""
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return True
        return False

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
    """Runs `code` as main.py in a fresh workdir of an isolated, limited process tree (see the module docstring).

    `run(code, inputs, outputs=...)`: the files of the trusted `inputs` directory
    are visible read-only in the workdir; the `outputs` named come back in
    `ExecResult.files` (regular files within `max_result_bytes`) or, with the
    reason, in `ExecResult.file_problems`. Nothing else survives the run.
    """

    def __init__(self, limits: SandboxLimits = SandboxLimits(), *, preload: Sequence[str] = ("numpy", "pandas", "sklearn"),
                 use_zygote: bool = True, require_netns: bool = True, require_memory_cgroup: bool = True,
                 memory_cgroups: Callable[[], Any] | None = None):
        self.limits = limits
        self.preload = tuple(preload)
        self.use_zygote = use_zygote
        self.require_netns = require_netns
        self.require_memory_cgroup = require_memory_cgroup
        self._cgroup_factory = memory_cgroups
        self._cgroups: Any = None
        self._cgroup_error: str | None = None
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
            if self._cgroups is not None:
                self._cgroups.close()
                self._cgroups = None

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
    def run(self, code: str, inputs: str | Path | None = None, *, outputs: Sequence[str] = (),
            limits: SandboxLimits | None = None) -> ExecResult:
        """Execute `code`; ValueError/FileNotFoundError for a bad `inputs` or `outputs` (the caller's mistake)."""
        lim = limits or self.limits
        t_call = time.monotonic()
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, not {type(code).__name__}")
        inputs = None if inputs is None else os.path.realpath(os.fspath(inputs))
        _check_inputs(inputs)
        outputs = _check_outputs(outputs)
        if self._visible is None:
            self._visible = _visible_paths(with_sys_path=False)  # our sys.path may hold cwd; the child re-checks
        if self._closed:
            return ExecResult("infra", None, "", "", 0.0, "sandbox is closed")
        try:
            cg = self._new_cgroup(lim)
        except _Infra as e:
            return ExecResult("infra", None, "", "", time.monotonic() - t_call, str(e))
        req = {
            "inputs": inputs, "outputs": outputs, "limits": asdict(lim),
            "env": {**self._env, "HOME": WORKDIR}, "require_netns": self.require_netns, "memory_cgroup": cg is not None,
        }
        if getattr(self, "_simulate_no_netns", False):  # test hook for the fail-closed path
            req["simulate_no_netns"] = True
        try:
            for attempt in (0, 1):
                try:
                    return self._attempt(code, req, lim, t_call, cg)
                except _ZygoteLost as e:  # nothing ran: one retry on a fresh zygote pays for nothing twice
                    if attempt or not self.use_zygote:
                        return ExecResult("infra", None, "", "", time.monotonic() - t_call, str(e))
                    log.warning("sandbox: %s; retrying the run on a new zygote", e)
        finally:
            self._release_cgroup(cg)

    def _attempt(self, code: str, req: dict, lim: SandboxLimits, t_call: float, cg) -> ExecResult:
        code_fd = os.memfd_create("wmrl-main.py", os.MFD_CLOEXEC)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st, st_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fds = [out_w, err_w, st_child.fileno(), code_fd]
        launcher = zygote = None
        try:
            _write_all(code_fd, code.encode("utf-8", "surrogatepass"))
            if self.use_zygote:
                zygote = self._submit(req, fds)
            else:
                launcher = subprocess.Popen(
                    [sys.executable, "-I", _SELF, "--launch", json.dumps(dict(zip(_FD_NAMES, fds))), json.dumps(req)],
                    pass_fds=fds, env=self._env, cwd="/",
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_w,
                )
        except Exception as e:  # noqa: BLE001 - whatever failed, nothing started: close everything, grade unknown
            for f in (out_r, err_r):
                os.close(f)
            st.close()
            return ExecResult("infra", None, "", "", time.monotonic() - t_call, f"could not start the sandbox: {e}")
        finally:
            for f in (out_w, err_w, code_fd):
                os.close(f)
            st_child.close()
        try:
            return self._collect(lim, out_r, err_r, st, t_call, cg, zygote)
        finally:
            if launcher is not None:
                try:
                    launcher.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    launcher.kill()
                    launcher.wait()

    def exposes(self, path: str | os.PathLike) -> bool:
        """Whether `path` lies in what every run sees read-only (the system and Python installation)."""
        if self._visible is None:
            self._visible = _visible_paths(with_sys_path=False)
        real = os.path.realpath(os.fspath(path))
        return any(_is_within(real, v) for v in self._visible)

    def _new_cgroup(self, lim: SandboxLimits):
        """The run's memory cgroup; None when running without one was asked for; _Infra when required and missing."""
        with self._lock:
            if self._cgroups is None and self._cgroup_error is None:
                from wmrl.domains.autoresearch.cgroups import CgroupUnavailable, MemoryCgroups

                try:
                    self._cgroups = (self._cgroup_factory or MemoryCgroups.detect)()
                except CgroupUnavailable as e:
                    self._cgroup_error = str(e)
                    if self.require_memory_cgroup:
                        log.error("sandbox: no memory cgroup, every run fails closed: %s", e)
                    else:
                        log.warning("sandbox: no memory cgroup (%s); running with per-process RLIMIT_AS only", e)
            cgroups = self._cgroups
        if cgroups is None:
            if self.require_memory_cgroup:
                raise _Infra(f"no memory cgroup for the run, refusing to run without one: {self._cgroup_error} "
                             "(Sandbox(require_memory_cgroup=False) runs with per-process RLIMIT_AS only)")
            return None
        try:
            return cgroups.create(lim.memory_mb * 2**20)
        except OSError as e:
            raise _Infra(f"could not create the run's memory cgroup: {e}") from None

    def _release_cgroup(self, cg) -> None:
        if cg is not None and self._cgroups is not None:
            self._cgroups.release(cg)

    def _submit(self, req: dict, fds: Sequence[int]) -> "_Zygote":
        with self._lock:
            if self._closed:
                raise _Infra("sandbox is closed")
            for attempt in (0, 1):
                if self._zygote is None or not self._zygote.alive():
                    if self._zygote is not None:
                        log.warning("sandbox: the zygote (pid %d) died; starting a new one", self._zygote.pid)
                        self._zygote.kill()
                    self._zygote = None
                    self._zygote = _Zygote(self.preload, self._env)
                try:
                    self._zygote.submit(req, fds)
                    return self._zygote
                except OSError as e:  # it died between runs: the program has not started, so retry once
                    self._zygote.kill()
                    self._zygote = None
                    if attempt:
                        raise _Infra(f"zygote unreachable: {e}") from None

    def _collect(self, lim: SandboxLimits, out_r: int, err_r: int, st: socket.socket, t_call: float,
                 cg, zygote: "_Zygote | None") -> ExecResult:
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
        contacted = False  # the run's supervisor said something: past this, a lost run is never retried
        files: dict[str, bytes] = {}
        late_problems: dict[str, FileProblem] = {}
        infra: list[str] = []
        notes: list[str] = []
        timed_out = False
        setup_deadline = time.monotonic() + 120.0  # zygote start-up is not counted
        try:
            # done when the pipes are closed and init has reported (it has reaped every program
            # process by then; its own exit is not waited for) or has gone away
            while open_fds or (st_open and exit_msg is None):
                now = time.monotonic()
                if (deadline is not None and exit_msg is None and not timed_out and now >= deadline
                        and not (st_open and _readable(st))):  # an exit report already waiting is read first
                    self._kill(pidfd)
                    timed_out = True
                if (not st_open or exit_msg is not None or timed_out) and drain_until is None:
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
                        msg, fds, _f, _a = socket.recv_fds(st, 1 << 16, 1 + _MAX_OUTPUTS)
                    except OSError:
                        msg, fds = b"", []
                    if not msg:
                        sel.unregister(st)
                        st_open = False
                        continue
                    for f in fds:
                        os.set_inheritable(f, False)
                    m = json.loads(msg)
                    contacted = True
                    if m["t"] == "hello" and pidfd is None:
                        if fds:
                            pidfd = fds.pop(0)
                        reply = b"go"
                        try:
                            if cg is not None:
                                cg.add(int(m["pid"]))
                        except OSError as e:
                            infra.append(f"could not place the run in its memory cgroup: {e}")
                            reply = b"stop"
                        try:
                            st.send(reply)
                        except OSError:
                            pass  # it has already given up (and says why)
                    elif m["t"] == "started" and started_at is None:
                        started_at = time.monotonic()
                        deadline = started_at + lim.timeout_s
                        if m.get("note"):
                            notes.append(m["note"])
                    elif m["t"] == "exit":
                        exit_msg = m
                        for name, i in m["files"].items():
                            data, problem = read_capped(fds[i], lim.max_result_bytes) if i < len(fds) else (None, None)
                            if data is not None:
                                files[name] = data
                            else:
                                late_problems[name] = problem or FileProblem("unreadable")
                        if m.get("disk_full"):
                            notes.append(f"the run's disk was full when it ended (workdir, /tmp and /dev/shm: "
                                         f"{lim.disk_mb} MB, {lim.max_inodes} inodes)")
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
        usage = _cgroup_usage(cg, notes)
        stdout, stderr = out.text(), err.text()
        if exit_msg is not None and not timed_out:
            wall = exit_msg["wall"]
        else:
            wall = time.monotonic() - (started_at if started_at is not None else t_call)
        peak = None if usage is None or usage.peak_bytes is None else usage.peak_bytes / 2**20
        if timed_out:
            return ExecResult("timeout", None, stdout, stderr, wall, "; ".join([_classify(lim, None, True, 0)[2], *notes]),
                              peak_memory_mb=peak)
        if usage is not None and usage.oom_kills and not usage.limit_hit:
            # an OOM killer took a process of the run below the run's own limit: the host's doing, not the program's
            return ExecResult("infra", None, stdout, stderr, wall, "a process of the run was killed by an OOM killer "
                              f"below the run's own limit of {lim.memory_mb} MB (memory pressure outside the run)",
                              peak_memory_mb=peak)
        if exit_msg is None and not infra and usage is not None and usage.oom_kills:
            # the kernel took the supervisor at the run's memory limit: the program's doing, not the machinery's
            return ExecResult("oom", None, stdout, stderr, wall, _classify(lim, None, False, usage.oom_kills)[2]
                              + " (the run's supervisor among them)", peak_memory_mb=peak)
        if not infra and exit_msg is None and not contacted and zygote is not None and not zygote.alive(wait_s=0.5):
            raise _ZygoteLost("the zygote died before the run started")
        if infra or exit_msg is None:
            if not infra:
                alive = zygote.alive() if zygote is not None else True
                infra.append("the sandbox machinery died before reporting the program's exit"
                             + ("" if alive else " (the zygote died; it is restarted on the next run)"))
            return ExecResult("infra", None, stdout, stderr, wall, "; ".join(infra + notes))
        status, rc, detail = _classify(lim, exit_msg, False, usage.oom_kills if usage else 0)
        problems = {name: FileProblem(kind, size) for name, (kind, size) in exit_msg["problems"].items()}
        problems.update(late_problems)
        return ExecResult(status, rc, stdout, stderr, wall, "; ".join(x for x in [detail, *notes] if x),
                          files=files, file_problems=problems, peak_memory_mb=peak)

    @staticmethod
    def _kill(pidfd: int | None) -> None:
        if pidfd is None:
            return
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass  # already gone


def _cgroup_usage(cg, notes: list[str]):
    if cg is None:
        return None
    try:
        return cg.usage()
    except (OSError, ValueError) as e:
        notes.append(f"could not read the run's memory counters: {e}")
        return None


class SandboxPool:
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

    def run_many(self, jobs: Sequence[tuple], *, outputs: Sequence[str] = ()) -> list[ExecResult]:
        """Run (code, inputs[, limits]) jobs, collecting `outputs` from each; results aligned with jobs.

        A job whose host-side handling raises becomes an "infra" result of its own;
        the other jobs of the batch are unaffected.
        """
        futures = [self._executor.submit(self.sandbox.run, job[0], job[1], outputs=outputs,
                                         limits=job[2] if len(job) > 2 else None) for job in jobs]
        results = []
        for i, f in enumerate(futures):
            try:
                results.append(f.result())
            except Exception as e:  # noqa: BLE001 - one bad job costs one result
                log.warning("sandbox pool: job %d of %d failed on the host side: %s: %s", i, len(jobs),
                            type(e).__name__, e)
                results.append(ExecResult("infra", None, "", "", 0.0, f"host-side error: {type(e).__name__}: {e}"))
        return results

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
        _launch_main(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: python -I sandbox.py --zygote FD PRELOAD_JSON | --launch FDS_JSON REQUEST_JSON")
