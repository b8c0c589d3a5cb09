"""The sandbox contains hostile agent code, reports it with the right status, and keeps working.

Every hostile case checks three things: the damage did not happen (on the host,
not just as the program reports it), the status/detail say what happened, and
the next run is still fine. Most run on both paths (zygote fork and cold
subprocess), which share the isolation code but not the process plumbing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox is Linux-only", allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("the sandbox needs root (namespaces, uid switching)", allow_module_level=True)

from wmrl.bench.hostile import sandbox_pids
from wmrl.domains.autoresearch.sandbox.cgroups import CgroupUnavailable, MemoryCgroups, locate
from wmrl.domains.autoresearch.sandbox import (
    UID_BASE, WORKDIR, ExecResult, FileProblem, Job, Sandbox, SandboxLimits, SandboxPool, read_regular_file,
)

FAST = SandboxLimits(timeout_s=10.0, cpu_s=20, memory_mb=2048, max_processes=32, max_file_mb=16)


@pytest.fixture(scope="module")
def zygote():
    sb = Sandbox(FAST)
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def cold():
    sb = Sandbox(FAST, use_zygote=False)
    yield sb
    sb.close()


@pytest.fixture(params=["zygote", "cold"])
def sandbox(request, zygote, cold):
    return zygote if request.param == "zygote" else cold


@pytest.fixture
def workdir(tmp_path):
    wd = tmp_path / "work"
    wd.mkdir()
    (wd / "train.csv").write_text("x,y\n1,2\n3,4\n")
    return wd


def run(sb: Sandbox, code: str, wd: Path, outputs=(), **limits) -> ExecResult:
    lim = SandboxLimits(**{**FAST.__dict__, **limits}) if limits else None
    return sb.run(textwrap.dedent(code), wd, outputs=outputs, limits=lim)


def still_works(sb: Sandbox, wd: Path) -> None:
    r = sb.run("print('alive')", wd)
    assert (r.status, r.stdout) == ("ok", "alive\n"), r
    assert sandbox_pids() == []


# ---------------------------------------------------------------- ordinary runs


def test_ok_run_writes_file_prints_and_runs_unprivileged(sandbox, workdir):
    r = run(sandbox, """
        import os, sys
        rows = open("train.csv").read().splitlines()
        with open("predictions.csv", "w") as fh:
            fh.write("id,pred\\n0,1\\n")
        print("rows", len(rows), "uid", os.getuid(), "cwd", os.getcwd(), "name", __name__)
        print("argv", sys.argv[0] == os.path.abspath("main.py"), "home", os.environ["HOME"] == os.getcwd())
        print("listing", sorted(os.listdir(".")))
    """, workdir, outputs=["predictions.csv", "absent.csv"])
    assert r.status == "ok" and r.returncode == 0, r
    uid = int(r.stdout.split("uid ")[1].split()[0])
    assert UID_BASE < uid < UID_BASE + (1 << 22)  # a per-run uid, never root
    assert f"rows 3 uid {uid} cwd {WORKDIR} name __main__" in r.stdout
    assert "argv True home True" in r.stdout
    assert "listing ['main.py', 'predictions.csv', 'train.csv']" in r.stdout
    assert r.files == {"predictions.csv": b"id,pred\n0,1\n"}  # handed back as bytes; nothing on the host
    assert r.file_problems == {"absent.csv": FileProblem("missing")}
    assert sorted(os.listdir(workdir)) == ["train.csv"]
    assert 0 < r.peak_memory_mb < FAST.memory_mb
    assert r.wall_s < 5


def test_every_run_starts_from_a_fresh_workdir(zygote, workdir):
    first = run(zygote, "open('left.txt', 'w').write('x'); import os; os.symlink('/etc', 'etc')", workdir)
    second = run(zygote, "import os; print(sorted(os.listdir('.')))", workdir)
    assert (first.status, second.status) == ("ok", "ok"), (first, second)
    assert second.stdout == "['main.py', 'train.csv']\n"


def test_exception_is_error_with_traceback(sandbox, workdir):
    r = run(sandbox, """
        def f():
            raise ValueError("boom")
        print("before")
        f()
    """, workdir)
    assert r.status == "error" and r.returncode == 1, r
    assert r.stdout == "before\n"
    assert "Traceback (most recent call last)" in r.stderr
    assert 'main.py", line 5' in r.stderr and "ValueError: boom" in r.stderr
    assert "wmrl-sandbox-boot" not in r.stderr  # the bootstrap frame is not shown
    assert r.detail == "exit code 1"  # the supervisor's words only
    assert r.exception_line == "ValueError: boom"  # the program's, kept apart


def test_syntax_error_and_exit_codes(sandbox, workdir):
    r = run(sandbox, "def f(:\n    pass\n", workdir)
    assert r.status == "error", r
    assert "SyntaxError" in r.stderr
    r = run(sandbox, "import sys; print('x'); sys.exit(3)", workdir)
    assert (r.status, r.returncode, r.stdout) == ("error", 3, "x\n"), r
    r = run(sandbox, "import sys; sys.exit()", workdir)
    assert (r.status, r.returncode) == ("ok", 0), r


def test_environment_is_scrubbed(sandbox, workdir, monkeypatch):
    monkeypatch.setenv("WMRL_SECRET_TOKEN", "hunter2")
    r = run(sandbox, "import os, json; print(json.dumps(dict(os.environ)))", workdir)
    assert r.status == "ok", r
    import json

    env = json.loads(r.stdout)
    allowed = {"PATH", "HOME", "LANG", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "PYTHONHASHSEED", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LC_CTYPE"}
    assert set(env) <= allowed, set(env) - allowed
    assert env["HOME"] == WORKDIR and env["OMP_NUM_THREADS"] == "1"
    assert "hunter2" not in r.stdout


# ---------------------------------------------------------------- time and processes


def test_infinite_loop_times_out_and_the_whole_tree_dies(sandbox, workdir):
    t0 = time.monotonic()
    r = run(sandbox, """
        import os, subprocess, time
        open("partial.txt", "w").write("x")
        subprocess.Popen(["sleep", "1000"], start_new_session=True)  # escapes the process group
        if os.fork() == 0:
            os.setsid()
            while True:
                pass
        print("looping", flush=True)
        while True:
            pass
    """, workdir, timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert r.status == "timeout" and r.returncode is None, r
    assert "timeout" in r.detail
    assert r.stdout == "looping\n"
    assert 1.0 <= r.wall_s and elapsed < 1.0 + 2.5, (r.wall_s, elapsed)
    assert sandbox_pids() == []  # nothing survived, not even the setsid'd ones
    assert sorted(os.listdir(workdir)) == ["train.csv"]
    still_works(sandbox, workdir)


def test_cpu_limit_is_a_timeout(zygote, workdir):
    r = run(zygote, "while True:\n    pass\n", workdir, cpu_s=1, timeout_s=10.0)
    assert r.status == "timeout" and r.returncode == -signal.SIGXCPU, r
    assert "CPU" in r.detail
    assert r.wall_s < 5
    still_works(zygote, workdir)


def test_fork_bomb_is_contained(sandbox, workdir):
    t0 = time.monotonic()
    r = run(sandbox, """
        import os
        while True:
            os.fork()
    """, workdir, timeout_s=5.0, max_processes=32)
    assert r.status in ("error", "timeout"), r
    assert time.monotonic() - t0 < 10
    assert sandbox_pids() == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork
    still_works(sandbox, workdir)


def test_cannot_signal_the_parent_or_the_trainer(sandbox, workdir):
    me = os.getpid()
    r = run(sandbox, f"""
        import os, signal
        for target in (os.getppid(), {me}, 1):
            try:
                os.kill(target, signal.SIGKILL)
                print(target, "killed?!")
            except (PermissionError, ProcessLookupError) as e:
                print(target, type(e).__name__)
        print("visible pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
        try:
            os.kill(-1, signal.SIGKILL)  # everything it may signal: only its own processes (none)
        except ProcessLookupError:
            pass
        print("survived kill(-1)")
    """, workdir)
    assert r.status == "ok", r
    assert "killed?!" not in r.stdout
    assert f"{me} ProcessLookupError" in r.stdout  # the trainer is not even visible
    assert "visible pids [2]" in r.stdout  # its /proc shows nothing but itself
    assert "survived kill(-1)" in r.stdout
    if sandbox.use_zygote:
        assert sandbox._zygote is not None and sandbox._zygote.alive()
    os.kill(me, 0)  # and we are, of course, alive
    still_works(sandbox, workdir)


# ---------------------------------------------------------------- memory, disk, output


@pytest.mark.parametrize("alloc", [
    "import numpy as np\nchunks = []\nwhile True:\n    chunks.append(np.ones(2**26))  # 512 MiB, touched\n",
    "import os\nfds = [os.memfd_create(str(i)) for i in range(48)]  # each under RLIMIT_FSIZE\nfor fd in fds:\n"
    "    for _ in range(3):\n        os.write(fd, bytes(4 << 20))\n",
    "import mmap\nm = mmap.mmap(-1, 3 << 30, flags=mmap.MAP_SHARED)\nfor i in range(0, len(m), 4096):\n    m[i] = 1\n",
], ids=["numpy-touching", "memfd", "shared-mapping"])
def test_memory_the_kernel_counts_is_oom(sandbox, workdir, alloc):
    r = run(sandbox, alloc, workdir, memory_mb=512, disk_mb=128)
    assert r.status == "oom" and "OOM-killed at 512 MB" in r.detail, r
    assert r.peak_memory_mb <= 512
    still_works(sandbox, workdir)


def test_an_allocation_refused_outright_is_the_programs_error_not_an_oom(zygote, workdir):
    r = run(zygote, "x = bytearray(50 * 2**40)", workdir)  # 50 TiB: refused by the kernel, nothing charged
    assert r.status == "error" and r.exception_line.startswith("MemoryError"), r


def test_printed_memoryerror_is_not_an_oom(zygote, workdir):
    r = run(zygote, "import sys\nprint('MemoryError: out of memory', file=sys.stderr)\nsys.exit(1)", workdir)
    assert (r.status, r.detail) == ("error", "exit code 1"), r


def test_self_sent_sigxcpu_is_not_a_cpu_timeout(zygote, workdir):
    r = run(zygote, "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)", workdir)
    assert r.status == "killed" and r.returncode == -signal.SIGXCPU and "CPU time limit" not in r.detail, r


def test_huge_file_is_stopped_at_the_size_limit(sandbox, workdir):
    r = run(sandbox, """
        chunk = b"\\0" * 2**20
        with open("big.bin", "wb") as fh:
            for _ in range(10 * 1024):  # 10 GiB
                fh.write(chunk)
    """, workdir, outputs=["big.bin"], max_file_mb=16, max_result_bytes=64 << 20)
    assert r.status == "error" and "File too large" in r.exception_line, r
    assert len(r.files["big.bin"]) <= 16 * 2**20
    still_works(sandbox, workdir)


def test_disk_and_inodes_are_capped_for_the_whole_run(zygote, workdir):
    r = run(zygote, """
        import os
        n = 0
        try:
            for d in (".", "/tmp", "/dev/shm"):
                for i in range(100):
                    open(f"{d}/f{i}", "wb").write(b"x" * (4 << 20))
                    n += 4
        except OSError as e:
            print("stopped at", n, "MB", e.errno)
        try:
            for i in range(10**6):
                open(f"/tmp/e{i}", "w").close()
        except OSError as e:
            print("stopped at", i, "files", e.errno)
    """, workdir, disk_mb=64, max_inodes=500)
    assert r.status == "ok", r
    mb = int(r.stdout.split("stopped at ")[1].split()[0])
    files = int(r.stdout.split("stopped at ")[2].split()[0])
    assert 56 <= mb <= 64 and " MB 28" in r.stdout  # ENOSPC at the disk cap, counted over all three
    assert files < 500 and "files 28" in r.stdout
    assert "disk was full" in r.detail


def test_non_python_writer_is_killed_by_sigxfsz(zygote, workdir):
    r = run(zygote, """
        import os, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # CPython ignores it; dd would inherit that
        os.execv("/bin/dd", ["dd", "if=/dev/zero", "of=big.bin", "bs=1M", "count=10240"])
    """, workdir, outputs=["big.bin"], max_file_mb=8, max_result_bytes=64 << 20)
    assert r.status == "killed" and r.returncode == -signal.SIGXFSZ, r
    assert "SIGXFSZ" in r.detail and "file size" in r.detail
    assert len(r.files["big.bin"]) <= 8 * 2**20


def test_output_files_over_the_cap_are_reported_not_read(zygote, workdir):
    r = run(zygote, "open('out.csv', 'wb').write(b'1' * 5000)", workdir, outputs=["out.csv"], max_result_bytes=4096)
    assert r.status == "ok" and r.files == {}
    assert r.file_problems == {"out.csv": FileProblem("too_large", 5000)}


def test_100mb_of_output_is_capped_and_fast(sandbox, workdir):
    import resource

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    r = run(sandbox, """
        import sys
        line = "x" * 1023 + "\\n"
        block = line * 1024
        for _ in range(100):
            sys.stdout.write(block)
        print("THE END")
        sys.stderr.write("e" * 10_000_000)
    """, workdir)
    assert r.status == "ok", r
    cap = FAST.max_output_bytes
    assert len(r.stdout) <= cap + 200 and len(r.stderr) <= cap + 200
    assert "truncated by the sandbox" in r.stdout and r.stdout.endswith("THE END\n")  # head and tail kept
    assert time.monotonic() - t0 < 20
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 50_000  # KiB: nothing buffered


# ---------------------------------------------------------------- network


def test_no_network(sandbox, workdir):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        r = run(sandbox, f"""
            import socket
            for addr in (("127.0.0.1", {port}), ("1.1.1.1", 80)):
                s = socket.socket()
                s.settimeout(3)
                try:
                    s.connect(addr)
                    s.sendall(b"leak")
                    print(addr[0], "CONNECTED")
                except OSError as e:
                    print(addr[0], "failed", type(e).__name__)
            try:
                socket.getaddrinfo("example.com", 80)
                print("dns RESOLVED")
            except OSError as e:
                print("dns failed")
            print("interfaces", [name for _, name in socket.if_nameindex()])
        """, workdir)
        assert r.status == "ok", r
        assert "CONNECTED" not in r.stdout and "RESOLVED" not in r.stdout
        assert "127.0.0.1 failed" in r.stdout and "1.1.1.1 failed" in r.stdout and "dns failed" in r.stdout
        assert "interfaces ['lo']" in r.stdout
        assert r.wall_s < 5  # no route: failures are immediate
        with pytest.raises(BlockingIOError):
            listener.accept()  # the parent's listener received nothing
    finally:
        listener.close()


def test_syscall_filter_blocks_vsock_user_namespaces_and_io_uring(sandbox, workdir):
    # no traffic is sent: creating the socket is what must fail
    r = run(sandbox, """
        import ctypes, socket
        for fam in ("AF_VSOCK", "AF_PACKET", "AF_ALG"):
            try:
                socket.socket(getattr(socket, fam), socket.SOCK_STREAM if fam == "AF_VSOCK" else socket.SOCK_DGRAM)
                print(fam, "OPEN")
            except OSError as e:
                print(fam, "blocked")
        libc = ctypes.CDLL(None, use_errno=True)
        print("unshare", libc.unshare(0x10000000 | 0x40000000), ctypes.get_errno())  # CLONE_NEWUSER|NEWNET
        print("io_uring", libc.syscall(425, 1, 0), ctypes.get_errno())
        import threading, subprocess
        t = threading.Thread(target=print, args=("thread ok",)); t.start(); t.join()
        print(subprocess.run(["echo", "subprocess ok"], capture_output=True, text=True).stdout.strip())
    """, workdir)
    assert r.status == "ok", r
    assert "OPEN" not in r.stdout and r.stdout.count("blocked") == 3, r.stdout
    assert "unshare -1 1\n" in r.stdout and "io_uring -1 38\n" in r.stdout  # EPERM, ENOSYS
    assert "thread ok" in r.stdout and "subprocess ok" in r.stdout


def test_network_namespace_failure_fails_closed(workdir):
    sb = Sandbox(FAST, use_zygote=False)
    sb._simulate_no_netns = True
    r = sb.run("print('ran')", workdir)
    assert r.status == "infra" and "network namespace unavailable" in r.detail, r
    assert r.stdout == ""  # it never ran
    loose = Sandbox(FAST, use_zygote=False, require_netns=False)
    loose._simulate_no_netns = True
    r = loose.run("print('ran')", workdir)
    assert r.status == "ok" and "WITHOUT a network namespace" in r.detail, r


# ---------------------------------------------------------------- filesystem


def test_hidden_labels_are_unreadable_and_nothing_outside_is_writable(sandbox, tmp_path, workdir):
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    (hidden / "labels.csv").write_text("id,label\n0,SECRET-LABEL\n")
    os.chmod(hidden / "labels.csv", 0o600)
    public = tmp_path / "public_but_outside"  # world-readable, still outside the workdir
    public.mkdir(mode=0o755)
    (public / "labels.csv").write_text("SECRET-LABEL\n")
    os.chmod(public / "labels.csv", 0o644)
    tmp_escape = Path(f"/tmp/escape-{uuid.uuid4().hex}")
    r = run(sandbox, f"""
        import os
        os.symlink({str(hidden / 'labels.csv')!r}, "planted_link")  # a link into the hidden dir does not help
        for path in ({str(hidden / 'labels.csv')!r}, {str(public / 'labels.csv')!r}, "planted_link",
                     {str(workdir / 'train.csv')!r}, "/work/main/pyproject.toml", "/etc/shadow", "/root/.bashrc"):
            try:
                print("READ", path, open(path).read())
            except OSError as e:
                print("noread", path, type(e).__name__)
        for path in ({str(tmp_path)!r}, {str(workdir)!r}):
            print("listing", os.path.exists(path))  # the host's paths do not exist in here
        for path in ({str(tmp_path / 'escape.txt')!r}, "/usr/escape.txt", "/etc/escape.txt", "/escape.txt",
                     "/sys/escape.txt", {str(workdir / 'escape.txt')!r}, "train.csv"):
            try:
                open(path, "a").write("x")
                print("WROTE", path)
            except OSError as e:
                print("nowrite", path, type(e).__name__)
        open({str(tmp_escape)!r}, "w").write("x")  # lands in the run's private /tmp
    """, workdir)
    assert r.status == "ok", r
    assert "SECRET-LABEL" not in r.stdout and "READ" not in r.stdout, r.stdout
    assert "listing True" not in r.stdout and "WROTE" not in r.stdout, r.stdout
    assert not (tmp_path / "escape.txt").exists() and not tmp_escape.exists()
    assert sorted(os.listdir(workdir)) == ["train.csv"] and (workdir / "train.csv").read_text() == "x,y\n1,2\n3,4\n"
    still_works(sandbox, workdir)


def test_inputs_are_read_only_even_when_hard_linked(zygote, tmp_path, workdir):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "data.csv").write_text("a,b\n1,2\n")
    os.link(shared / "data.csv", workdir / "data.csv")  # how a caller might avoid copying task data
    (workdir / "extra").mkdir()
    (workdir / "extra" / "notes.txt").write_text("n\n")
    r = run(zygote, """
        import os
        print(open("data.csv").read().count("\\n"), open("extra/notes.txt").read().strip())
        for act in (lambda: open("data.csv", "a").write("tampered\\n"), lambda: os.remove("data.csv"),
                    lambda: open("extra/new.txt", "w"), lambda: os.rename("extra", "moved")):
            try:
                act()
                print("TAMPERED")
            except OSError as e:
                print("refused", e.errno)
    """, workdir)
    assert r.status == "ok", r
    assert r.stdout.startswith("2 n\n") and "TAMPERED" not in r.stdout and r.stdout.count("refused") == 4, r.stdout
    assert (shared / "data.csv").read_text() == "a,b\n1,2\n"
    assert sorted(os.listdir(workdir / "extra")) == ["notes.txt"]


def test_inputs_and_outputs_are_validated(zygote, tmp_path):
    with pytest.raises(FileNotFoundError):
        zygote.run("print(1)", tmp_path / "missing")
    with pytest.raises(ValueError):
        zygote.run("print(1)", "/")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "data.csv").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="not a regular file or a directory"):
        zygote.run("print(1)", linked)
    for bad in ("../x", "a/b", "main.py", "", ".."):
        with pytest.raises(ValueError, match="output file name"):
            zygote.run("print(1)", None, outputs=[bad])
    assert zygote.run("print(1)").status == "ok"  # no inputs at all


# ---------------------------------------------------------------- reading what a run leaves


def test_read_regular_file_never_follows_blocks_or_overreads(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "ok.csv").write_bytes(b"a\n1\n")
    (d / "big.csv").write_bytes(b"x" * 101)
    (d / "link.csv").symlink_to(d / "ok.csv")
    os.mkfifo(d / "fifo.csv")
    (d / "dir.csv").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "sock.csv"))
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        got = {name: read_regular_file(fd, name, 100) for name in
               ("ok.csv", "big.csv", "link.csv", "fifo.csv", "dir.csv", "sock.csv", "none.csv")}
    finally:
        os.close(fd)
        sock.close()
    assert got["ok.csv"] == (b"a\n1\n", None)
    assert got["big.csv"] == (None, FileProblem("too_large", 101))
    assert {k: v[1].kind for k, v in got.items() if k not in ("ok.csv", "big.csv")} == {
        "link.csv": "symlink", "fifo.csv": "fifo", "dir.csv": "directory", "sock.csv": "socket", "none.csv": "missing"}


# ---------------------------------------------------------------- the memory cgroup


def test_without_a_memory_cgroup_every_run_fails_closed(workdir):
    def unavailable():
        raise CgroupUnavailable("no memory controller here")

    with Sandbox(FAST, preload=(), memory_cgroups=unavailable) as sb:
        r = sb.run("open('/tmp/ran', 'w')", workdir)
        assert r.status == "infra" and "no memory controller here" in r.detail, r
        assert "require_memory_cgroup=False" in r.detail and r.stdout == ""
    with Sandbox(FAST, preload=(), memory_cgroups=unavailable, require_memory_cgroup=False) as loose:
        r = run(loose, "x = bytearray(600 << 20)", workdir, memory_mb=512, disk_mb=128)  # RLIMIT_AS is all that is left
        assert r.status == "error" and r.exception_line.startswith("MemoryError") and r.peak_memory_mb is None, r


V2_NO_MEMORY = "/sys/fs/cgroup/unified"


@pytest.mark.skipif(not os.path.exists(os.path.join(V2_NO_MEMORY, "cgroup.controllers")),
                    reason="this machine mounts no cgroup v2 hierarchy beside v1")
def test_a_cgroup_v2_without_the_memory_controller_is_refused_with_what_to_do(workdir):
    with open(os.path.join(V2_NO_MEMORY, "cgroup.controllers")) as fh:
        assert "memory" not in fh.read().split()  # a hybrid host: the controller is bound to v1
    with pytest.raises(CgroupUnavailable, match="memory controller is not available"):
        MemoryCgroups(V2_NO_MEMORY, 2)
    with Sandbox(FAST, preload=(), memory_cgroups=lambda: MemoryCgroups(V2_NO_MEMORY, 2)) as sb:
        r = sb.run("print(1)", workdir)
        assert r.status == "infra" and "Delegate=yes" in r.detail, r


MOUNTINFO_V1 = """\
25 30 0:22 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
30 25 0:26 /process_api/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
MOUNTINFO_V2 = "26 1 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_locate_finds_the_memory_cgroup_on_v1_hybrid_and_v2_hosts():
    v1 = "4:memory:/process_api/abc\n0::/\n"
    assert locate(MOUNTINFO_V1, v1) == (1, "/sys/fs/cgroup/memory")  # v1's memory controller wins on hybrid hosts
    assert locate(MOUNTINFO_V1.replace("/process_api/abc ", "/ "), v1) == (1, "/sys/fs/cgroup/memory/process_api/abc")
    assert locate(MOUNTINFO_V2, "0::/user.slice/session-3.scope\n") == (2, "/sys/fs/cgroup/user.slice/session-3.scope")
    assert locate("22 1 0:5 / /proc rw - proc proc rw\n", "0::/\n") is None


def test_cgroup_v2_protocol_writes_the_limits_and_reads_the_counters(tmp_path):
    base = tmp_path / "cg"
    base.mkdir()
    (base / "cgroup.controllers").write_text("cpu memory pids\n")
    (base / "cgroup.subtree_control").write_text("")
    cgroups = MemoryCgroups(str(base), 2)
    assert (base / "cgroup.subtree_control").read_text() == "+memory"  # delegated to the runs' parent
    parent = Path(cgroups.parent)
    assert (parent / "cgroup.subtree_control").read_text() == "+memory"
    run_cg = cgroups.create(512 << 20)
    path = Path(run_cg.path)
    assert path.parent == parent and (path / "memory.max").read_text() == str(512 << 20)
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n")
    (path / "memory.peak").write_text("123456\n")
    assert (run_cg.usage().oom_kills, run_cg.usage().peak_bytes) == (2, 123456)
    run_cg.add(4242)
    assert (path / "cgroup.procs").read_text() == "4242"


def test_run_cgroups_are_removed(workdir):
    with Sandbox(FAST, preload=()) as sb:
        assert sb.run("print(1)", workdir).status == "ok"
        parent = sb._cgroups.parent
        assert os.path.isdir(parent) and os.listdir(parent) and not [
            d for d in os.listdir(parent) if os.path.isdir(os.path.join(parent, d))]
    assert not os.path.exists(parent)


# ---------------------------------------------------------------- zygote vs cold, zygote death, pool

SKLEARN_SCRIPT = """
import numpy as np
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
X, y = make_classification(n_samples=400, n_features=10, random_state=0)
Xtr, Xte, ytr, yte = train_test_split(X, y, random_state=0)
model = LogisticRegression(max_iter=200).fit(Xtr, ytr)
pred = model.predict(Xte)
np.savetxt("predictions.csv", pred, fmt="%d")
print("acc", round(float((pred == yte).mean()), 6), "coef", round(float(model.coef_.sum()), 6))
"""


def test_zygote_and_cold_paths_agree(zygote, cold, tmp_path):
    results = []
    for sb, name in ((zygote, "z"), (cold, "c")):
        wd = tmp_path / name
        wd.mkdir()
        r = sb.run(SKLEARN_SCRIPT, wd, outputs=["predictions.csv"])
        assert r.status == "ok", r
        results.append((r.stdout, r.stderr, r.files["predictions.csv"]))
    assert results[0] == results[1]
    assert results[0][0].startswith("acc ")


def test_unseeded_randomness_differs_between_forks(zygote, workdir):
    code = "import random, numpy as np; print(random.random(), np.random.rand())"
    a, b = zygote.run(code, workdir), zygote.run(code, workdir)
    assert a.status == b.status == "ok"
    assert a.stdout != b.stdout  # forks do not replay the zygote's RNG state


def test_killed_zygote_is_restarted(workdir, tmp_path):
    with Sandbox(FAST, preload=("numpy",)) as sb:
        assert sb.run("print(1)", workdir).status == "ok"
        old = sb._zygote.pid
        box: list[ExecResult] = []
        t = threading.Thread(target=lambda: box.append(sb.run("import time; time.sleep(8)", workdir)))
        t0 = time.monotonic()
        t.start()
        time.sleep(0.7)
        os.kill(old, signal.SIGKILL)
        t.join(10)
        assert box and box[0].status == "infra", box
        assert time.monotonic() - t0 < 5  # the in-flight run died with its zygote
        assert sandbox_pids() == []
        r = sb.run("print('again')", workdir)
        assert (r.status, r.stdout) == ("ok", "again\n"), r
        assert sb._zygote.pid != old


def test_pool_runs_concurrently_and_keeps_order(tmp_path):
    jobs = []
    for i in range(4):
        wd = tmp_path / f"job{i}"
        wd.mkdir()
        jobs.append(Job(f"import time; time.sleep(0.5); print({i})", wd))
    with SandboxPool(slots=2, limits=FAST, preload=()) as pool:
        pool.run_many(jobs[:1])  # start the zygote outside the timing
        t0 = time.monotonic()
        results = pool.run_many(jobs)
        elapsed = time.monotonic() - t0
    assert [r.status for r in results] == ["ok"] * 4
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
    assert elapsed < 1.6, elapsed


def test_an_oom_kill_below_the_runs_own_limit_is_the_hosts_doing_not_the_programs(workdir):
    """A neighbour (or the host) running the machine out of memory must not turn this run's grade into a failure."""
    from wmrl.domains.autoresearch.sandbox.cgroups import MemoryUsage, RunCgroup

    class HostOOM(RunCgroup):
        def usage(self):
            return MemoryUsage(oom_kills=1, peak_bytes=64 << 20, limit_hit=False)

    class Cgroups(MemoryCgroups):
        def create(self, limit_bytes):
            real = super().create(limit_bytes)
            return HostOOM(real.path, real.version, limit_bytes)

    with Sandbox(FAST, preload=(), memory_cgroups=lambda: Cgroups(*_here())) as sb:
        r = sb.run("print(1)", workdir)
    assert r.status == "infra" and "below the run's own limit" in r.detail, r


def _here():
    with open("/proc/self/mountinfo") as a, open("/proc/self/cgroup") as b:
        version, base = locate(a.read(), b.read())
    return base, version


def test_the_commit_cost_bench_stores_every_execution_once_on_both_sides(tmp_path):
    from wmrl.bench.sandbox import _commit_cost
    from wmrl.core.store import RunStore

    res = _commit_cost(tmp_path, rounds=2, jobs_per_round=3)
    assert len(res["each"]["round_rates"]) == len(res["batch"]["round_rates"]) == 2
    assert res["commit_median_ms"] > 0 and res["each_over_batch"] > 0
    store = RunStore(tmp_path / "store.sqlite")
    try:  # 2 rounds x 2 sides x 3 executions, keyed by round, side and job: nothing lost, nothing twice
        keys = sorted(r.key for r in store.executions("bench"))
    finally:
        store.close()
    assert keys == sorted(f"{r}/{m}/{i}" for r in range(2) for m in ("each", "batch") for i in range(3))
