"""What an execution comes back as, and its status from what the supervisor observed.

The status never comes from text the program printed: `classify` reads only
the exit status, the signal, the CPU time used and the memory cgroup's OOM
kills. The program's own last exception line is kept apart
(`ExecResult.exception_line`), as untrusted text.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass, field

from .limits import SandboxLimits

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




class _Infra(Exception):
    pass


class _ZygoteLost(Exception):
    """The zygote died with a request in hand, before the run's supervisor existed."""


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
