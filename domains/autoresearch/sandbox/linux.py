"""Linux plumbing through ctypes: Python 3.11 has no os.unshare, mount, setns or pivot_root."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket

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
