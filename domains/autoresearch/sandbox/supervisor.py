"""Inside the run: C1, pid 1 of its pid namespace and the supervisor (root), and C2, the program.

C1 builds the sandbox, forks the program, reaps everything, hands the
requested outputs back as descriptors and reports; C2 limits itself, drops to
the run's uid, installs the syscall filter and runs main.py through the
bootstrap (in-process on the zygote path, by execve on the cold path).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import socket
import sys
import time
from typing import Sequence

from .files import open_regular_file
from .limits import UID_BASE, WORKDIR
from .linux import (
    _CLONE_NEWIPC, _CLONE_NEWNET, _CLONE_NEWNS, _CLONE_NEWPID, _CLONE_NEWUTS, _PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG,
    _loopback_up, _prctl, _setns, _unshare,
)
from .rootfs import _build_root
from .seccomp import _install_seccomp

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
