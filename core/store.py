"""Durable, append-only store for the most expensive data a run produces.

Real executions (sandbox runs, simulator episodes) and anchor pairs (a world
model's prediction next to the real outcome it predicted) cost real time and
money. They are appended to an SQLite database in WAL mode with
``synchronous=FULL`` the moment they exist, so a crashed run loses none of them.
A resumed run looks an execution up by its key before running it again, so the
same thing is never executed twice. Anchor pairs are the record of how well the
world model predicted (reports, fidelity); the debiaser is not rebuilt from them:
a resumed run restores its state, map and window, from the checkpoint, and
re-played steps add no pair twice. What warm-starts a world model in another
run is the real executions themselves (`replay.read_trajectories`).

Writes are idempotent: executions are unique on their caller-chosen ``key`` and
anchor pairs on ``(run_id, step, group_id, member)``, so re-playing a step after
a resume adds nothing. Every batch is validated up front and written in one
transaction; a bad record rejects the whole batch and nothing is stored. A
write that fails on a full disk or an I/O error leaves the database as it was
and raises `StorageError`, which says so.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wmrl.core.errors import StorageError

__all__ = ["SCHEMA_VERSION", "AnchorPair", "ExecutionRecord", "RunStore"]

SCHEMA_VERSION = 1

# SQLite's default limit on host parameters per statement is 999 on older builds.
_CHUNK = 500

_SCHEMA = """
CREATE TABLE meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE executions (
    key        TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    step       INTEGER NOT NULL,
    task_id    TEXT NOT NULL,
    status     TEXT NOT NULL,
    reward     REAL,               -- NULL = unknown grade, never 0
    payload    BLOB NOT NULL,
    info       TEXT NOT NULL,      -- JSON object
    created_at REAL NOT NULL
);
CREATE INDEX executions_run ON executions (run_id);
CREATE TABLE anchor_pairs (
    id         INTEGER PRIMARY KEY, -- insertion order
    run_id     TEXT NOT NULL,
    step       INTEGER NOT NULL,
    group_id   TEXT NOT NULL,
    member     INTEGER NOT NULL,
    task_id    TEXT NOT NULL,
    wm_mean    REAL NOT NULL,
    wm_var     REAL,
    real       REAL NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (run_id, step, group_id, member)
);
CREATE INDEX anchor_pairs_run_step ON anchor_pairs (run_id, step);
"""


@dataclass(frozen=True)
class ExecutionRecord:
    """One real episode/execution, stored verbatim under a caller-chosen key."""

    key: str
    run_id: str
    step: int
    task_id: str
    status: str  # e.g. "ok", "error", "timeout", "infra"
    reward: float | None  # None = unknown grade (infrastructure failure)
    payload: bytes = b""  # returned byte-for-byte
    info: dict = field(default_factory=dict)  # JSON-serialisable
    created_at: float = 0.0  # set to time.time() by the store when 0


@dataclass(frozen=True)
class AnchorPair:
    """A world-model prediction for one group member next to the real outcome."""

    run_id: str
    step: int
    group_id: str
    member: int
    task_id: str
    wm_mean: float
    wm_var: float | None
    real: float
    created_at: float = 0.0


class RunStore:
    """Append-only SQLite store of executions and anchor pairs.

    One connection guarded by a lock, so a store may be shared between threads;
    several processes may open the same file concurrently (SQLite's own locking,
    with a busy timeout, serialises their writes).
    """

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 60.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so that every
        # batch is exactly one transaction and nothing is implicitly left open.
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            str(self.path),
            timeout=busy_timeout_s,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            self._open(busy_timeout_s)
        except sqlite3.DatabaseError as e:
            self._conn.close()
            self._conn = None
            # OperationalError (locked, I/O) is a real failure, not a foreign file.
            if isinstance(e, sqlite3.OperationalError):
                raise
            raise ValueError(f"{self.path} is not a wmrl run store: {e}") from e
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    def _open(self, busy_timeout_s: float) -> None:
        conn = self._db
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        self._enable_wal(time.monotonic() + busy_timeout_s)
        # FULL: fsync the WAL on every commit, so a commit survives power loss too.
        conn.execute("PRAGMA synchronous = FULL")
        with self._transaction() as cur:
            tables = {r[0] for r in cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                # executescript() would COMMIT mid-transaction; run statements one by one.
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        cur.execute(stmt)
                cur.execute(
                    "INSERT INTO meta (name, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
                return
            row = None
            if "meta" in tables:
                row = cur.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
            if row is None:
                raise ValueError(
                    f"{self.path} is not a wmrl run store: an SQLite database without "
                    f"a wmrl schema_version (tables: {sorted(tables)})"
                )
            version = int(row[0])
            if version > SCHEMA_VERSION:
                raise ValueError(
                    f"{self.path} has run-store schema version {version}, newer than "
                    f"this wmrl supports ({SCHEMA_VERSION}); upgrade wmrl to open it"
                )
            if version < SCHEMA_VERSION:  # no older versions exist yet
                raise ValueError(f"{self.path} has unknown run-store schema version {version}")

    def _enable_wal(self, deadline: float) -> None:
        # WAL: readers never block the writer, and a commit is one append. The mode
        # is persistent in the file; switching it needs an exclusive lock and SQLite
        # answers "locked" at once (no busy handler) if another process is opening
        # the same fresh file, so retry until the deadline.
        while True:
            try:
                mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
                continue
            if mode.lower() != "wal":
                raise sqlite3.OperationalError(f"cannot enable WAL on {self.path} (mode {mode!r})")
            return

    # -- plumbing -------------------------------------------------------------

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ValueError(f"RunStore({self.path}) is closed")
        return self._conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction; rolled back entirely on any error."""
        with self._lock:
            conn = self._db
            try:
                # IMMEDIATE takes the write lock up front, so two writers wait on the
                # busy timeout instead of deadlocking on a read->write upgrade.
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn.cursor()
                except BaseException:
                    if conn.in_transaction:  # SQLite rolls some failures (a full disk) back itself
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if "locked" in str(exc) or "busy" in str(exc):
                    raise
                # a full disk or an I/O error: the database is as it was before this transaction
                raise StorageError.of(exc, self.path, "could not write to the run store") from exc

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # -- executions -----------------------------------------------------------

    def put_executions(self, records: Sequence[ExecutionRecord]) -> int:
        """Append records not already stored (by key); returns how many were new."""
        now = time.time()
        rows = [_execution_row(r, now) for r in records]  # validate all before writing
        return self._insert_new(
            "INSERT OR IGNORE INTO executions (key, run_id, step, task_id, status, "
            "reward, payload, info, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    def _insert_new(self, sql: str, rows: list[tuple]) -> int:
        """Run an INSERT OR IGNORE over rows in one transaction; how many rows were new."""
        if not rows:
            return 0
        with self._transaction() as cur:
            before = self._db.total_changes
            cur.executemany(sql, rows)
            return self._db.total_changes - before

    def put_execution(self, record: ExecutionRecord) -> bool:
        """Append one record; False if its key was already stored."""
        return self.put_executions([record]) == 1

    def get_executions(self, keys: Sequence[str]) -> dict[str, ExecutionRecord]:
        """Stored records for ``keys``; keys never stored are absent."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, ExecutionRecord] = {}
        for i in range(0, len(wanted), _CHUNK):
            chunk = wanted[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            for row in self._query(
                "SELECT key, run_id, step, task_id, status, reward, payload, info, "
                f"created_at FROM executions WHERE key IN ({marks})",
                chunk,
            ):
                found[row[0]] = _execution_from_row(row)
        return {k: found[k] for k in wanted if k in found}

    def executions(self, run_id: str | None = None, *, key_prefix: str = "") -> list[ExecutionRecord]:
        """Stored records in the order they were stored, optionally of one run and under a key prefix."""
        sql = ("SELECT key, run_id, step, task_id, status, reward, payload, info, created_at FROM executions "
               "WHERE substr(key, 1, ?) = ?")  # not LIKE: that is case-insensitive and has wildcards
        params: list[Any] = [len(key_prefix), key_prefix]
        if run_id is not None:
            sql += " AND run_id = ?"
            params.append(run_id)
        return [_execution_from_row(row) for row in self._query(sql + " ORDER BY rowid", params)]

    def get_execution(self, key: str) -> ExecutionRecord | None:
        return self.get_executions([key]).get(key)

    def count_executions(self, run_id: str | None = None) -> int:
        if run_id is None:
            return self._query("SELECT COUNT(*) FROM executions")[0][0]
        return self._query("SELECT COUNT(*) FROM executions WHERE run_id = ?", (run_id,))[0][0]

    # -- anchor pairs ---------------------------------------------------------

    def add_anchor_pairs(self, pairs: Sequence[AnchorPair]) -> int:
        """Append pairs; one already stored for (run_id, step, group_id, member) is
        ignored (a resume re-plays its last step). Returns how many were new."""
        now = time.time()
        rows = [_anchor_row(p, now) for p in pairs]
        return self._insert_new(
            "INSERT OR IGNORE INTO anchor_pairs (run_id, step, group_id, member, "
            "task_id, wm_mean, wm_var, real, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    def anchor_pairs(
        self,
        run_id: str | None = None,
        *,
        max_step: int | None = None,
        limit: int | None = None,
    ) -> list[AnchorPair]:
        """Pairs in insertion order, optionally of one run and with step <= max_step.

        ``limit`` keeps the most recent ``limit`` pairs, still returned oldest-first.
        """
        where, params = [], []
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        if max_step is not None:
            where.append("step <= ?")
            params.append(int(max_step))
        sql = (
            "SELECT run_id, step, group_id, member, task_id, wm_mean, wm_var, real, "
            "created_at FROM anchor_pairs"
        )
        if where:
            sql += " WHERE " + " AND ".join(where)
        if limit is None:
            rows = self._query(sql + " ORDER BY id", params)
        else:
            if limit < 0:
                raise ValueError(f"limit must be >= 0, got {limit}")
            rows = self._query(sql + " ORDER BY id DESC LIMIT ?", [*params, int(limit)])
            rows.reverse()
        return [AnchorPair(*row) for row in rows]

    def count_anchor_pairs(self, run_id: str | None = None) -> int:
        if run_id is None:
            return self._query("SELECT COUNT(*) FROM anchor_pairs")[0][0]
        return self._query("SELECT COUNT(*) FROM anchor_pairs WHERE run_id = ?", (run_id,))[0][0]

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; safe to call twice."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunStore({str(self.path)!r})"


# -- validation / conversion ---------------------------------------------------


def _finite(value: Any, name: str, where: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, (str, bytes, bool)) or not hasattr(value, "__float__"):
        raise TypeError(f"{name} of {where} must be a number, got {value!r}")
    out = float(value)
    # NaN/inf would silently poison every mean and the debiaser fitted on it.
    if not math.isfinite(out):
        raise ValueError(f"{name} of {where} must be finite, got {out}")
    return out


def _integer(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} of {where} must be an int, got {value!r}")
    return value.__index__()


def _text(value: Any, name: str, where: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} of {where} must be a str, got {value!r}")
    return value


def _execution_row(r: ExecutionRecord, now: float) -> tuple:
    if not isinstance(r, ExecutionRecord):
        raise TypeError(f"expected an ExecutionRecord, got {type(r).__name__}")
    where = f"execution {r.key!r}"
    _text(r.key, "key", where)
    if not isinstance(r.payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"payload of {where} must be bytes, got {type(r.payload).__name__}")
    if not isinstance(r.info, dict):
        raise TypeError(f"info of {where} must be a dict, got {type(r.info).__name__}")
    try:
        # allow_nan=False: NaN is not JSON, and must not hide in info either.
        info = json.dumps(r.info, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"info of {where} is not JSON-serialisable: {e}") from e
    created = _finite(r.created_at, "created_at", where)
    return (
        r.key,
        _text(r.run_id, "run_id", where),
        _integer(r.step, "step", where),
        _text(r.task_id, "task_id", where),
        _text(r.status, "status", where),
        _finite(r.reward, "reward", where, optional=True),
        bytes(r.payload),
        info,
        created or now,
    )


def _execution_from_row(row: tuple) -> ExecutionRecord:
    key, run_id, step, task_id, status, reward, payload, info, created_at = row
    return ExecutionRecord(
        key=key,
        run_id=run_id,
        step=step,
        task_id=task_id,
        status=status,
        reward=reward,
        payload=bytes(payload),
        info=json.loads(info),
        created_at=created_at,
    )


def _anchor_row(p: AnchorPair, now: float) -> tuple:
    if not isinstance(p, AnchorPair):
        raise TypeError(f"expected an AnchorPair, got {type(p).__name__}")
    where = f"anchor pair (run_id={p.run_id!r}, step={p.step!r}, group_id={p.group_id!r}, member={p.member!r})"
    created = _finite(p.created_at, "created_at", where)
    return (
        _text(p.run_id, "run_id", where),
        _integer(p.step, "step", where),
        _text(p.group_id, "group_id", where),
        _integer(p.member, "member", where),
        _text(p.task_id, "task_id", where),
        _finite(p.wm_mean, "wm_mean", where),
        _finite(p.wm_var, "wm_var", where, optional=True),
        _finite(p.real, "real", where),
        created or now,
    )
