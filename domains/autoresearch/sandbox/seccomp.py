"""The syscall filter: what namespaces do not close (vsock, user namespaces, io_uring, huge pages).

A small classic-BPF program, assembled here with labels resolved to jump
offsets, for x86_64 and aarch64; anything else runs without the filter.
"""

from __future__ import annotations

import ctypes
import errno
import platform

from .linux import _check, _libc

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
