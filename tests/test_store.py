"""Tests for wmrl.core.store: round trips, idempotence, crash durability, concurrency."""

from __future__ import annotations

import math
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from wmrl.core.store import SCHEMA_VERSION, AnchorPair, ExecutionRecord, RunStore


def rec(key: str, **kw) -> ExecutionRecord:
    base = dict(run_id="r1", step=0, task_id="t", status="ok", reward=1.0)
    base.update(kw)
    return ExecutionRecord(key=key, **base)


def pair(step: int, member: int, run_id: str = "r1", **kw) -> AnchorPair:
    base = dict(group_id=f"g{step}", task_id="t", wm_mean=0.5, wm_var=0.1, real=1.0)
    base.update(kw)
    return AnchorPair(run_id=run_id, step=step, member=member, **base)


# A child process that writes through RunStore. It reports each write that has
# *returned* on stdout, so the parent knows exactly what must have been persisted.
CHILD = textwrap.dedent(
    """
    import sys, time
    from wmrl.core.store import RunStore, ExecutionRecord, AnchorPair
    path, mode, name = sys.argv[1], sys.argv[2], sys.argv[3]
    store = RunStore(path)
    if mode == "batch_then_sleep":
        recs = [ExecutionRecord(f"{name}-{i}", name, i, "t", "ok", float(i), b"x" * i) for i in range(100)]
        assert store.put_executions(recs) == 100
        pairs = [AnchorPair(name, i, "g", 0, "t", 0.5, None, 1.0) for i in range(50)]
        assert store.add_anchor_pairs(pairs) == 50
        print("done", flush=True)
        time.sleep(600)
    elif mode == "loop":
        i = 0
        while True:
            store.put_execution(ExecutionRecord(f"{name}-{i}", name, i, "t", "ok", None, b"p" * 64))
            print(i, flush=True)
            i += 1
    elif mode == "concurrent":
        sys.stdin.readline()  # start line: both writers begin together
        new_shared = 0
        for i in range(300):
            store.put_execution(ExecutionRecord(f"{name}-{i}", name, i, "t", "ok", float(i)))
            store.add_anchor_pairs([AnchorPair(name, i, "g", 0, "t", 0.0, 1.0, 0.0)])
            # Keys both writers try to insert: exactly one of them may count each.
            new_shared += store.put_execution(ExecutionRecord(f"shared-{i}", name, i, "t", "ok", 0.0))
        print(new_shared, flush=True)
    """
)


def spawn(tmp_path: Path, *args: str, stdin=None) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def sigkill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def integrity_ok(path: Path) -> bool:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


# -- round trips -------------------------------------------------------------------


def test_execution_round_trip_all_fields(tmp_path):
    payload = pickle.dumps({"obs": [1, 2, 3], "actions": ("a", "b")})
    a = ExecutionRecord("k1", "run", 3, "task-7", "ok", 0.25, payload, {"n": 1, "tags": ["x"]}, 123.5)
    b = ExecutionRecord("k2", "run", 4, "task-8", "infra", None, b"\x00\xffraw", {})
    with RunStore(tmp_path / "sub" / "dir" / "store.db") as s:
        assert s.put_executions([a, b]) == 2
        got = s.get_executions(["k1", "k2", "missing"])
    assert set(got) == {"k1", "k2"}
    assert got["k1"] == a
    assert pickle.loads(got["k1"].payload) == {"obs": [1, 2, 3], "actions": ("a", "b")}
    # None reward stays None (unknown grade), never coerced to 0.
    assert got["k2"].reward is None
    assert got["k2"].payload == b"\x00\xffraw"
    assert got["k2"].status == "infra" and got["k2"].info == {}
    # created_at 0 is filled by the store; an explicit one is kept.
    assert got["k2"].created_at > 1e9
    assert got["k1"].created_at == 123.5


def test_reopen_sees_data_and_counts_by_run(tmp_path):
    path = tmp_path / "store.db"
    with RunStore(path) as s:
        s.put_executions([rec("a"), rec("b"), rec("c", run_id="r2")])
        s.add_anchor_pairs([pair(0, 0), pair(0, 1, run_id="r2")])
    with RunStore(path) as s:
        assert s.count_executions() == 3
        assert s.count_executions("r1") == 2
        assert s.count_executions("r2") == 1
        assert s.count_executions("nope") == 0
        assert s.get_execution("c") == s.get_executions(["c"])["c"]
        assert s.get_execution("zzz") is None
        assert s.count_anchor_pairs() == 2
        assert s.count_anchor_pairs("r2") == 1


def test_anchor_pairs_round_trip_and_order(tmp_path):
    with RunStore(tmp_path / "s.db") as s:
        # Inserted out of step order: results follow insertion, not step.
        pairs = [
            pair(5, 0, wm_mean=0.1, wm_var=None, real=0.0, created_at=7.0),
            pair(1, 0, wm_mean=0.2, wm_var=0.3, real=1.0),
            pair(3, 1, run_id="r2", wm_mean=-0.4, real=0.5),
        ]
        assert s.add_anchor_pairs(pairs) == 3
        got = s.anchor_pairs()
    assert [(p.run_id, p.step, p.member) for p in got] == [("r1", 5, 0), ("r1", 1, 0), ("r2", 3, 1)]
    assert got[0] == pairs[0]  # wm_var None and explicit created_at kept
    assert got[1].wm_var == 0.3 and got[1].created_at > 1e9
    assert got[2].wm_mean == -0.4 and got[2].group_id == "g3" and got[2].task_id == "t"


def test_anchor_pairs_filters_and_limit(tmp_path):
    with RunStore(tmp_path / "s.db") as s:
        for step in range(10):
            s.add_anchor_pairs([pair(step, 0), pair(step, 1), pair(step, 0, run_id="other")])
        steps = lambda ps: [(p.step, p.member) for p in ps]  # noqa: E731
        assert len(s.anchor_pairs()) == 30
        assert len(s.anchor_pairs("r1")) == 20
        assert steps(s.anchor_pairs("r1", max_step=1)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        # limit: the most recent pairs, still oldest-first.
        assert steps(s.anchor_pairs("r1", limit=3)) == [(8, 1), (9, 0), (9, 1)]
        assert steps(s.anchor_pairs("r1", max_step=4, limit=3)) == [(3, 1), (4, 0), (4, 1)]
        assert [p.run_id for p in s.anchor_pairs(limit=2)] == ["r1", "other"]
        assert s.anchor_pairs("r1", limit=0) == []
        assert len(s.anchor_pairs("r1", limit=1000)) == 20
        with pytest.raises(ValueError, match="limit"):
            s.anchor_pairs(limit=-1)


def test_get_executions_with_2000_keys(tmp_path):
    with RunStore(tmp_path / "s.db") as s:
        # Emulate SQLite builds limited to 999 parameters per statement.
        s._db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        s.put_executions([rec(f"k{i}", step=i) for i in range(2000)])
        keys = [f"k{i}" for i in range(2000)] + ["absent-1", "absent-2"]
        got = s.get_executions(keys)
    assert len(got) == 2000
    assert all(got[f"k{i}"].step == i for i in range(2000))


# -- idempotence -------------------------------------------------------------------


def test_reput_same_key_is_ignored(tmp_path):
    with RunStore(tmp_path / "s.db") as s:
        assert s.put_execution(rec("k", reward=1.0)) is True
        # Same key again, even with different content: the first write wins.
        assert s.put_execution(rec("k", reward=0.0)) is False
        assert s.put_executions([rec("k"), rec("k")]) == 0
        assert s.put_executions([rec("k"), rec("new"), rec("new")]) == 1
        assert s.count_executions() == 2
        assert s.get_execution("k").reward == 1.0


def test_readd_same_anchor_pair_is_ignored(tmp_path):
    with RunStore(tmp_path / "s.db") as s:
        step = [pair(2, m) for m in range(4)]
        assert s.add_anchor_pairs(step) == 4
        assert s.add_anchor_pairs(step) == 0  # resume re-plays the step
        assert s.add_anchor_pairs([pair(2, 0, real=0.0), pair(2, 4)]) == 1
        assert s.count_anchor_pairs() == 5
        assert s.anchor_pairs()[0].real == 1.0
        # Same (step, group, member) under another run is a different pair.
        assert s.add_anchor_pairs([pair(2, 0, run_id="r2")]) == 1


def test_empty_batches(tmp_path):
    with RunStore(tmp_path / "s.db") as s:
        assert s.put_executions([]) == 0
        assert s.add_anchor_pairs([]) == 0
        assert s.get_executions([]) == {}


# -- bad input -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_reward_rejected(tmp_path, bad):
    with RunStore(tmp_path / "s.db") as s:
        with pytest.raises(ValueError, match=r"reward.*'k-bad'"):
            s.put_execution(rec("k-bad", reward=bad))
        assert s.count_executions() == 0


def test_one_bad_record_rejects_whole_batch(tmp_path):
    with RunStore(tmp_path / "s.db") as s:
        batch = [rec("a"), rec("b"), rec("bad", reward=math.nan), rec("c")]
        with pytest.raises(ValueError, match="'bad'"):
            s.put_executions(batch)
        assert s.count_executions() == 0
        assert s.get_executions(["a", "b", "c"]) == {}
        # The store still works afterwards (no transaction left open).
        assert s.put_executions(batch[:2]) == 2


def test_failure_inside_transaction_rolls_back(tmp_path):
    path = tmp_path / "s.db"
    RunStore(path).close()
    # A trigger makes the database itself reject one row mid-batch, after the
    # earlier rows of the same batch were already inserted.
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TRIGGER no_poison BEFORE INSERT ON executions WHEN NEW.key = 'poison' "
        "BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
    )
    conn.commit()
    conn.close()
    with RunStore(path) as s:
        with pytest.raises(sqlite3.IntegrityError, match="poisoned"):
            s.put_executions([rec("a"), rec("b"), rec("poison"), rec("c")])
        assert s.count_executions() == 0
        assert s.put_executions([rec("a")]) == 1


@pytest.mark.parametrize("field_name", ["wm_mean", "real", "wm_var"])
def test_non_finite_anchor_values_reject_batch(tmp_path, field_name):
    with RunStore(tmp_path / "s.db") as s:
        with pytest.raises(ValueError, match=field_name):
            s.add_anchor_pairs([pair(0, 0), pair(0, 1, **{field_name: math.nan})])
        assert s.count_anchor_pairs() == 0


@pytest.mark.parametrize("info", [{"x": object()}, {"x": {1, 2}}, {"x": math.nan}])
def test_non_json_info_rejected(tmp_path, info):
    with RunStore(tmp_path / "s.db") as s:
        with pytest.raises(TypeError, match="JSON"):
            s.put_executions([rec("ok"), rec("bad", info=info)])
        assert s.count_executions() == 0


def test_wrong_types_rejected(tmp_path):
    with RunStore(tmp_path / "s.db") as s:
        with pytest.raises(TypeError, match="payload"):
            s.put_execution(rec("k", payload="not bytes"))
        with pytest.raises(TypeError, match="reward"):
            s.put_execution(rec("k", reward="1.0"))
        with pytest.raises(TypeError, match="step"):
            s.put_execution(rec("k", step=1.5))
        assert s.count_executions() == 0


@pytest.mark.parametrize("content", [os.urandom(4096), b"hello, this is a text file\n" * 20])
def test_non_sqlite_file_rejected(tmp_path, content):
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="is not a wmrl run store"):
        RunStore(path)
    assert path.read_bytes() == content  # left untouched


def test_foreign_sqlite_database_rejected(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(ValueError, match="is not a wmrl run store"):
        RunStore(path)


def test_newer_schema_version_rejected(tmp_path):
    path = tmp_path / "s.db"
    RunStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    with pytest.raises(ValueError, match="newer"):
        RunStore(path)


def test_pragmas_and_closed_store(tmp_path):
    s = RunStore(tmp_path / "s.db")
    assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert s._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    s.close()
    s.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        s.count_executions()


# -- durability and concurrency ---------------------------------------------------


def test_records_survive_sigkill_after_write(tmp_path):
    path = tmp_path / "s.db"
    proc = spawn(tmp_path, str(path), "batch_then_sleep", "child")
    try:
        line = proc.stdout.readline()
        assert line.strip() == "done", proc.stderr.read()
    finally:
        sigkill(proc)
    with RunStore(path) as s:
        got = s.get_executions([f"child-{i}" for i in range(100)])
        assert len(got) == 100
        assert got["child-42"].payload == b"x" * 42 and got["child-42"].reward == 42.0
        assert s.count_anchor_pairs("child") == 50
    assert integrity_ok(path)


def test_reported_writes_survive_sigkill_mid_loop(tmp_path):
    path = tmp_path / "s.db"
    proc = spawn(tmp_path, str(path), "loop", "child")
    reported = []
    try:
        # Kill it while it keeps writing; everything it reported must be there.
        while len(reported) < 200:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            reported.append(int(line))
    finally:
        sigkill(proc)
    reported += [int(x) for x in proc.stdout.read().split()]  # lines still in the pipe
    assert reported == list(range(len(reported)))
    with RunStore(path) as s:
        got = s.get_executions([f"child-{i}" for i in reported])
        assert len(got) == len(reported)
        assert all(r.reward is None for r in got.values())
        assert s.count_executions() in (len(reported), len(reported) + 1)  # one may be unreported
    assert integrity_ok(path)


def test_two_processes_writing_concurrently_lose_nothing(tmp_path):
    path = tmp_path / "s.db"  # fresh: both also race to create the schema
    procs = [spawn(tmp_path, str(path), "concurrent", name, stdin=subprocess.PIPE) for name in ("A", "B")]
    try:
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    new_shared = [int(out) for out, _ in outs]
    assert sum(new_shared) == 300  # each shared key counted as new by exactly one writer
    with RunStore(path) as s:
        assert s.count_executions("A") + s.count_executions("B") == 900
        for name in ("A", "B"):
            assert len(s.get_executions([f"{name}-{i}" for i in range(300)])) == 300
            assert s.count_anchor_pairs(name) == 300
        assert len(s.get_executions([f"shared-{i}" for i in range(300)])) == 300
        assert s.count_executions() == 900
    assert integrity_ok(path)


def test_threads_share_one_store(tmp_path):
    with RunStore(tmp_path / "s.db") as s:
        def work(t: int) -> None:
            for i in range(100):
                s.put_execution(rec(f"t{t}-{i}"))
                s.add_anchor_pairs([pair(i, t)])
                s.get_execution(f"t{t}-{i}")

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert s.count_executions() == 400
        assert s.count_anchor_pairs() == 400


def test_executions_in_stored_order_by_run_and_exact_key_prefix(tmp_path):
    with RunStore(tmp_path / "s.sqlite") as store:
        store.put_executions([rec("s2g0m0"), rec("eval/0/test_id/t/0"), rec("s1g0m0")])
        store.put_executions([rec("S1g9m9"), rec("s_x", run_id="r2"), rec("s%y")])
        assert [r.key for r in store.executions()] == ["s2g0m0", "eval/0/test_id/t/0", "s1g0m0", "S1g9m9", "s_x", "s%y"]
        assert [r.key for r in store.executions(key_prefix="eval/")] == ["eval/0/test_id/t/0"]
        # a prefix is matched exactly: no case folding, `_` and `%` are plain characters
        assert [r.key for r in store.executions(key_prefix="s1")] == ["s1g0m0"]
        assert [r.key for r in store.executions(key_prefix="s_")] == ["s_x"]
        assert [r.key for r in store.executions("r2")] == ["s_x"]
