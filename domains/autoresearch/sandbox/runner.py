"""The parent's side of one execution: `Sandbox.run`, from request to `ExecResult`.

It makes the run's memory cgroup, hands the code and the descriptors to the
zygote (or a cold launcher), moves the supervisor into the cgroup when it says
hello, enforces the wall-clock timeout with one SIGKILL to the supervisor,
reads the capped output streams and the output files, and classifies.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from .files import _MAX_OUTPUTS, _check_inputs, _check_outputs, _is_within, _write_all, read_capped
from .limits import WORKDIR, SandboxLimits
from .result import ExecResult, FileProblem, _classify, _Infra, _ZygoteLost
from .rootfs import _visible_paths
from .supervisor import _FD_NAMES
from .zygote import ENTRY, Zygote

log = logging.getLogger(__name__)

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


def _readable(sock: socket.socket) -> bool:
    import select

    return bool(select.select([sock], [], [], 0)[0])


def _wait_pidfd(pidfd: int, timeout: float) -> bool:
    import select

    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(int(timeout * 1000)))


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
        self._zygote: Zygote | None = None
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
                    [sys.executable, "-I", ENTRY, "--launch", json.dumps(dict(zip(_FD_NAMES, fds))), json.dumps(req)],
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
                from .cgroups import CgroupUnavailable, MemoryCgroups

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

    def _submit(self, req: dict, fds: Sequence[int]) -> "Zygote":
        with self._lock:
            if self._closed:
                raise _Infra("sandbox is closed")
            for attempt in (0, 1):
                if self._zygote is None or not self._zygote.alive():
                    if self._zygote is not None:
                        log.warning("sandbox: the zygote (pid %d) died; starting a new one", self._zygote.pid)
                        self._zygote.kill()
                    self._zygote = None
                    self._zygote = Zygote(self.preload, self._env)
                try:
                    self._zygote.submit(req, fds)
                    return self._zygote
                except OSError as e:  # it died between runs: the program has not started, so retry once
                    self._zygote.kill()
                    self._zygote = None
                    if attempt:
                        raise _Infra(f"zygote unreachable: {e}") from None

    def _collect(self, lim: SandboxLimits, out_r: int, err_r: int, st: socket.socket, t_call: float,
                 cg, zygote: "Zygote | None") -> ExecResult:
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
