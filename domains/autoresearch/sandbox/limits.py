"""The limits of one execution, and the two constants every side of the sandbox agrees on."""

from __future__ import annotations

from dataclasses import dataclass, fields

#: per-execution uid = UID_BASE + host pid of the run's supervisor (unique among live runs)
UID_BASE = 0x70000000
#: the program's working directory inside the sandbox (a fresh tmpfs every execution)
WORKDIR = "/sandbox/work"


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
