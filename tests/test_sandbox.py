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

from wmrl.domains.autoresearch.sandbox import UID_BASE, ExecResult, Sandbox, SandboxLimits, SandboxPool

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


def run(sb: Sandbox, code: str, wd: Path, **limits) -> ExecResult:
    lim = SandboxLimits(**{**FAST.__dict__, **limits}) if limits else None
    return sb.run(textwrap.dedent(code), wd, limits=lim)


def sandbox_pids() -> list[int]:
    """Live host processes running as a sandbox uid (there must be none between runs)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if UID_BASE <= int(line.split()[1]) < UID_BASE + (1 << 22):
                            pids.append(int(entry))
                        break
        except OSError:
            pass
    return pids


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
    """, workdir)
    assert r.status == "ok" and r.returncode == 0, r
    uid = int(r.stdout.split("uid ")[1].split()[0])
    assert UID_BASE < uid < UID_BASE + (1 << 22)  # a per-run uid, never root
    assert f"cwd {workdir} name __main__" in r.stdout
    assert "argv True home True" in r.stdout
    pred = workdir / "predictions.csv"
    assert pred.read_text() == "id,pred\n0,1\n"
    assert pred.stat().st_uid == os.geteuid()  # ownership handed back to the caller
    assert r.wall_s < 5


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
    assert "ValueError: boom" in r.detail


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
    assert env["HOME"] == str(workdir) and env["OMP_NUM_THREADS"] == "1"
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
    assert (workdir / "partial.txt").stat().st_uid == os.geteuid()  # handed back even after a kill
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
    if r.status == "error":
        assert "RLIMIT_NPROC" in r.detail
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
    "x = bytearray(50 * 2**30)",
    "import numpy as np\nx = np.ones(50 * 2**30 // 8)",
    "import numpy as np\nchunks = []\nwhile True:\n    chunks.append(np.ones(2**26))  # 512 MiB, touched\n",
], ids=["bytearray", "numpy", "numpy-touching"])
def test_huge_allocation_is_oom(zygote, workdir, alloc):
    r = run(zygote, alloc, workdir, memory_mb=1024)
    assert r.status == "oom", r
    assert "MemoryError" in r.stderr and "RLIMIT_AS" in r.detail
    still_works(zygote, workdir)


def test_oom_cold_path(cold, workdir):
    r = run(cold, "x = bytearray(50 * 2**30)", workdir)
    assert r.status == "oom", r


def test_huge_file_is_stopped_at_the_size_limit(sandbox, workdir):
    r = run(sandbox, """
        chunk = b"\\0" * 2**20
        with open("big.bin", "wb") as fh:
            for _ in range(10 * 1024):  # 10 GiB
                fh.write(chunk)
    """, workdir, max_file_mb=16)
    assert r.status in ("error", "killed"), r
    assert "file size" in r.detail, r.detail
    assert (workdir / "big.bin").stat().st_size <= 16 * 2**20
    still_works(sandbox, workdir)


def test_non_python_writer_is_killed_by_sigxfsz(zygote, workdir):
    r = run(zygote, """
        import os, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # CPython ignores it; dd would inherit that
        os.execv("/bin/dd", ["dd", "if=/dev/zero", "of=big.bin", "bs=1M", "count=10240"])
    """, workdir, max_file_mb=8)
    assert r.status == "killed" and r.returncode == -signal.SIGXFSZ, r
    assert "SIGXFSZ" in r.detail and "file size" in r.detail
    assert (workdir / "big.bin").stat().st_size <= 8 * 2**20


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
    os.symlink(hidden / "labels.csv", workdir / "planted_link")  # a link into the hidden dir does not help
    tmp_escape = Path(f"/tmp/escape-{uuid.uuid4().hex}")
    r = run(sandbox, f"""
        import os
        for path in ({str(hidden / 'labels.csv')!r}, {str(public / 'labels.csv')!r}, "planted_link",
                     "/work/main/pyproject.toml", "/etc/shadow", "/root/.bashrc"):
            try:
                print("READ", path, open(path).read())
            except OSError as e:
                print("noread", path, type(e).__name__)
        print("listing", os.listdir({str(tmp_path)!r}))  # an empty stand-in: only the workdir's name
        for path in ({str(tmp_path / 'escape.txt')!r}, "/usr/escape.txt", "/etc/escape.txt", "/escape.txt",
                     "/sys/escape.txt", {str(workdir.parent / 'escape.txt')!r}):
            try:
                open(path, "w").write("x")
                print("WROTE", path)
            except OSError as e:
                print("nowrite", path, type(e).__name__)
        open({str(tmp_escape)!r}, "w").write("x")  # lands in the run's private /tmp
        os.symlink("/etc/passwd", "link")
    """, workdir)
    assert r.status == "ok", r
    assert "SECRET-LABEL" not in r.stdout and "READ" not in r.stdout, r.stdout
    assert "listing ['work']" in r.stdout and "WROTE" not in r.stdout, r.stdout
    assert not (tmp_path / "escape.txt").exists() and not tmp_escape.exists()
    assert not (workdir.parent / "escape.txt").exists()
    assert os.path.islink(workdir / "link") and os.lstat(workdir / "link").st_uid == os.geteuid()
    assert os.stat("/etc/passwd").st_uid == 0  # restoring ownership never follows links
    still_works(sandbox, workdir)


def test_setuid_files_are_defused_and_ownership_restored(zygote, workdir):
    r = run(zygote, """
        import os, shutil
        shutil.copy("/bin/true", "sneaky")
        os.chmod("sneaky", 0o4755)
        os.mkdir("sub")
        open("sub/f", "w").write("x")
        print(oct(os.stat("sneaky").st_mode & 0o7777))
    """, workdir)
    assert r.status == "ok", r
    st = (workdir / "sneaky").stat()
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o6000
    assert (workdir / "sub" / "f").stat().st_uid == os.geteuid()


def test_hard_linked_task_data_stays_read_only(zygote, tmp_path, workdir):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "data.csv").write_text("a,b\n1,2\n")
    os.link(shared / "data.csv", workdir / "data.csv")  # how a caller might avoid copying task data
    r = run(zygote, """
        print(open("data.csv").read().count("\\n"))
        try:
            open("data.csv", "a").write("tampered\\n")
            print("TAMPERED")
        except PermissionError:
            print("read-only")
    """, workdir)
    assert r.status == "ok", r
    assert r.stdout == "2\nread-only\n"
    assert (shared / "data.csv").read_text() == "a,b\n1,2\n"


def test_workdir_is_validated(zygote, tmp_path):
    with pytest.raises(FileNotFoundError):
        zygote.run("print(1)", tmp_path / "missing")
    with pytest.raises(ValueError):
        zygote.run("print(1)", "/")


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
        r = sb.run(SKLEARN_SCRIPT, wd)
        assert r.status == "ok", r
        results.append((r.stdout, r.stderr, (wd / "predictions.csv").read_text()))
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
        jobs.append((f"import time; time.sleep(0.5); print({i})", wd))
    with SandboxPool(slots=2, limits=FAST, preload=()) as pool:
        pool.run_many(jobs[:1])  # start the zygote outside the timing
        t0 = time.monotonic()
        results = pool.run_many(jobs)
        elapsed = time.monotonic() - t0
    assert [r.status for r in results] == ["ok"] * 4
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
    assert elapsed < 1.6, elapsed
