"""The zygote: a process that imports numpy/pandas/scikit-learn once and forks a run per request.

`zygote_main` is its loop (and `launch_main` the cold path's one-shot
launcher), started as `python -I .../sandbox/__main__.py`; `Zygote` is the
parent's handle on it. A request is one SOCK_SEQPACKET message (JSON) with the
run's descriptors attached (`_FD_NAMES`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from typing import Sequence

from .linux import _PR_SET_PDEATHSIG, _libc, _prctl
from .result import _Infra
from .rootfs import _visible_paths
from .supervisor import _FD_NAMES, _release_stderr, _send, _spawn_init

#: the entry point the zygote and the launcher are started from
ENTRY = os.path.join(os.path.dirname(os.path.realpath(__file__)), "__main__.py")

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




class Zygote:
    def __init__(self, preload: Sequence[str], env: dict[str, str]):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", ENTRY, "--zygote", str(child.fileno()), json.dumps(list(preload))],
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
