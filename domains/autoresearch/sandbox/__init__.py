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

The package, one concept per module: `limits` (SandboxLimits, UID_BASE,
WORKDIR), `result` (ExecResult, FileProblem, the status), `linux` (syscalls),
`seccomp` (the filter), `files` (what crosses the boundary), `rootfs` (the
run's filesystem), `cgroups` (memory accounting), `supervisor` (C1 and C2),
`zygote` (the forking server and the parent's handle), `runner` (`Sandbox`),
`pool` (`Job`, `ExecutionPool`, `SandboxPool`). Only the standard library is imported in it:
`__main__.py` is the zygote's and the launcher's entry point
(``python -I .../sandbox/__main__.py --zygote|--launch``), which loads the
package without importing the rest of wmrl.
"""

from __future__ import annotations

from .files import read_regular_file
from .limits import UID_BASE, WORKDIR, SandboxLimits
from .pool import ExecutionPool, Job, SandboxPool
from .result import ExecResult, FileProblem
from .runner import Sandbox

__all__ = ["SandboxLimits", "ExecResult", "FileProblem", "Sandbox", "ExecutionPool", "SandboxPool", "Job", "UID_BASE",
           "WORKDIR", "read_regular_file"]
