"""A killed run resumes exactly and pays for no real execution twice.

Each run is a `wmrl train` subprocess that SIGKILLs itself at a scripted point
(`durability_harness.py`): inside an environment batch, before the first
checkpoint, while a checkpoint is written, during evaluation. The same command
then runs again until it finishes, and everything it produced is compared with
an uninterrupted run of the same seed: rewards, anchor pairs, stored executions,
metrics (wall-clock aside), evaluation history and the final weights. Real
executions are counted by an independent ledger the environment (or the
sandbox) appends to, outside the run store.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import torch

from wmrl.api import resumed_trainer
from wmrl.core.archive import load_trajectories
from wmrl.core.engine import saved_client_state
from wmrl.core.metrics import read_jsonl

HARNESS = Path(__file__).with_name("durability_harness.py")
#: what legitimately differs between an interrupted and an uninterrupted run: clocks, and what the
#: sandbox measures of a program (its peak memory varies by a few hundred kB from run to run)
CLOCK = {"wall", "real_wall", "eval_time", "real_executed_fresh"}
MEASURED = {"peak_memory_mb"}


def _env() -> dict:
    dist = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")  # a fresh process group each
    return {**{k: v for k, v in os.environ.items() if k not in dist}, "OMP_NUM_THREADS": "1"}


def harness(kill: str, args: list[str], *, ledger: Path | None = None) -> subprocess.CompletedProcess:
    opts = [kill] + (["--ledger", str(ledger)] if ledger else [])
    return subprocess.run([sys.executable, str(HARNESS), *opts, "--", *args], env=_env(), capture_output=True,
                          text=True, timeout=600)


def train_with_kills(kills: list[str], args: list[str], *, ledger: Path | None = None) -> subprocess.CompletedProcess:
    """Run `wmrl train args` dying at each kill point in turn, then once more to the end."""
    for kill in kills:
        done = harness(kill, args, ledger=ledger)
        assert done.returncode == -9, f"{kill}: the run did not reach its kill point:\n{done.stderr[-3000:]}"
    done = harness("none", args, ledger=ledger)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _timeless(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in CLOCK and not k.startswith("time_")}


def _episode(payload: bytes, run_dir: Path, key: str) -> tuple:
    (t,) = load_trajectories([payload], run_dir, names=[key])
    infos = [{k: v for k, v in i.items() if k not in MEASURED} for i in t.infos]
    return (t.task.id, pickle.dumps((t.observations, t.actions)), t.log_probs, t.step_rewards, infos, t.real)


def fingerprint(run_dir: Path, overrides: tuple[str, ...] = ()) -> dict:
    """Everything a run produced that does not depend on the clock (`overrides` for reading it back)."""
    with sqlite3.connect(run_dir / "store.sqlite") as db:
        executions = {row[0]: (*row[1:-1], _episode(row[-1], run_dir, row[0])) for row in db.execute(
            "SELECT key, run_id, step, task_id, status, reward, info, payload FROM executions")}
        pairs = sorted(db.execute(
            "SELECT run_id, step, group_id, member, task_id, wm_mean, wm_var, real FROM anchor_pairs"))
    summary = json.loads((run_dir / "summary.json").read_text())
    trainer = resumed_trainer(run_dir, overrides)
    try:
        with trainer.engine.gathered() as module:  # whole under ZeRO-3 too
            weights = [p.detach().clone() for p in module.parameters()]
        estimator = trainer.estimator.state_dict()
    finally:
        trainer.close()
    return {
        "executions": executions,
        "pairs": pairs,
        "metrics": [_timeless(r) for r in read_jsonl(run_dir / "metrics.jsonl")],
        "history": [_timeless(r) for r in summary["history"]],
        "real_executions": summary["real_executions"],
        "weights": weights,
        "estimator": estimator,
    }


def assert_same_run(a: dict, b: dict) -> None:
    assert b["executions"].keys() == a["executions"].keys()
    differ = [k for k in a["executions"] if a["executions"][k] != b["executions"][k]]
    assert not differ, f"{len(differ)} stored executions differ, e.g. {differ[0]}"
    assert b["pairs"] == a["pairs"]
    assert [r["step"] for r in b["metrics"]] == [r["step"] for r in a["metrics"]]
    for ra, rb in zip(a["metrics"], b["metrics"]):
        assert rb == ra, f"metrics of step {ra['step']} differ"
    assert b["history"] == a["history"]
    assert b["real_executions"] == a["real_executions"]
    assert all(torch.equal(x, y) for x, y in zip(a["weights"], b["weights"]))
    assert b["estimator"] == a["estimator"]


def _program_args(run_dir: Path, ledger: Path, every: int = 3, delay: float = 0.0,
                  extra: tuple[str, ...] = ()) -> list[str]:
    return ["train", "synthetic-program", f"run_dir={run_dir}", "trainer.steps=6", f"trainer.checkpoint_every={every}",
            "trainer.eval_every=3", "trainer.eval_samples=2", "trainer.groups_per_step=4", "trainer.group_size=4",
            "anchors.fraction=0.5", "estimator.debias.min_pairs=4", "estimator.denoise.warmup=2",
            f"domain.real_delay_s={delay}", "domain.real_capacity=2", f"domain.ledger={ledger}", "tensorboard=false",
            *extra, "--no-progress", "--no-report"]


def test_a_run_killed_anywhere_resumes_exactly_and_executes_nothing_twice(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train_with_kills([], _program_args(straight, tmp_path / "straight.ledger"))
    kills = [
        "commit:s2g",  # inside step 2's environment batch (2 of its 4 waves done), before the first checkpoint
        "checkpoint:step000003:file",  # a torn file in the first checkpoint: the run restarts from nothing
        "checkpoint:step000003:staged",  # written but never published
        "commit:s5g:2",  # inside a batch again, after a checkpoint
        "commit:eval/6/test_ood",  # during the final evaluation
    ]
    train_with_kills(kills, _program_args(killed, tmp_path / "killed.ledger"))
    a, b = fingerprint(straight), fingerprint(killed)
    assert_same_run(a, b)
    ran_a = collections.Counter((tmp_path / "straight.ledger").read_text().splitlines())
    ran_b = collections.Counter((tmp_path / "killed.ledger").read_text().splitlines())
    assert ran_b == ran_a  # the same executions, each paid for once
    assert sum(ran_b.values()) == len(b["executions"])

    again = harness("none", _program_args(killed, tmp_path / "killed.ledger"))  # a finished run is not run again
    assert again.returncode == 0 and "finished its 6 steps before; its stored result" in again.stdout
    lines = again.stdout.splitlines()  # DeepSpeed may print a line of its own first
    stored = next(lines[i + 1] for i, line in enumerate(lines) if "finished its 6 steps before" in line)
    assert json.loads(stored)["final"] == json.loads((killed / "summary.json").read_text())["history"][-1]
    assert collections.Counter((tmp_path / "killed.ledger").read_text().splitlines()) == ran_b


def test_a_run_killed_with_asynchronous_anchors_in_flight_resumes_exactly_and_executes_nothing_twice(tmp_path):
    """The worker commits step 5's anchors while the loop is steps ahead; the checkpoint of step 3 holds the
    batches of steps 2 and 3, not yet used: they are sent again and the store plays back what had finished."""

    def args(run_dir, ledger):
        return _program_args(run_dir, ledger, extra=("anchors.max_staleness=2",))

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train_with_kills([], args(straight, tmp_path / "straight.ledger"))
    assert harness("commit:s5g", args(killed, tmp_path / "killed.ledger")).returncode == -9
    in_flight = saved_client_state(killed / "checkpoints")["anchors_in_flight"]
    assert [b["step"] for b in in_flight] == [2, 3]
    train_with_kills(["commit:s6g", "commit:eval/6/test_ood"], args(killed, tmp_path / "killed.ledger"))
    assert_same_run(fingerprint(straight), fingerprint(killed))
    ran_a = collections.Counter((tmp_path / "straight.ledger").read_text().splitlines())
    ran_b = collections.Counter((tmp_path / "killed.ledger").read_text().splitlines())
    assert ran_b == ran_a  # each execution paid for once


def test_a_multi_step_run_resumes_exactly_and_repeats_only_episodes_in_flight(tmp_path):
    """For a simulator the durable unit is the episode: one cut off by the kill runs again from its start."""
    G, groups, horizon = 4, 4, 6

    def args(run_dir, ledger):
        return ["train", "synthetic-control", f"run_dir={run_dir}", "trainer.steps=4", "trainer.checkpoint_every=2",
                "trainer.eval_every=2", "trainer.eval_samples=1", f"trainer.groups_per_step={groups}",
                f"trainer.group_size={G}", "anchors.fraction=0.5", f"domain.horizon={horizon}",
                "domain.real_delay_s=0", f"domain.ledger={ledger}", "tensorboard=false", "--no-progress",
                "--no-report"]

    train_with_kills([], args(tmp_path / "straight", tmp_path / "straight.ledger"))
    train_with_kills(["commit:s1g", "commit:s3g", "commit:eval/4/"], args(tmp_path / "killed", tmp_path / "killed.ledger"))
    assert_same_run(fingerprint(tmp_path / "straight"), fingerprint(tmp_path / "killed"))
    ran_a = collections.Counter((tmp_path / "straight.ledger").read_text().splitlines())
    ran_b = collections.Counter((tmp_path / "killed.ledger").read_text().splitlines())
    assert not ran_a - ran_b  # everything the straight run executed, the killed one did too
    in_flight = 2 * (groups // 2) * G * horizon + 16 * horizon  # two training batches and one evaluation batch
    assert sum((ran_b - ran_a).values()) <= in_flight


def test_a_killed_autoresearch_run_resumes_exactly_and_runs_no_program_twice(suite_agent, tmp_path):
    """Real sandboxed programs of the embedded agent, counted by a ledger around the sandbox itself."""

    def args(run_dir):
        return ["train", "autoresearch", f"run_dir={run_dir}", f"domain.agent={suite_agent}", "domain.sandbox_slots=1",
                "trainer.steps=2", "trainer.checkpoint_every=1", "trainer.eval_every=2", "trainer.eval_samples=1",
                "trainer.eval_splits=[test_id]", "trainer.groups_per_step=2", "trainer.group_size=2",
                "anchors.fraction=0.5", "tensorboard=false", "--no-progress", "--no-report"]

    train_with_kills([], args(tmp_path / "straight"), ledger=tmp_path / "straight.ledger")
    # the first commit of an evaluation: a reply without code settles at once, so how many commits a batch
    # takes depends on how many replies hold code
    kills = ["commit:eval/0/", "commit:s1g", "checkpoint:step000001:staged", "commit:eval/2/"]
    train_with_kills(kills, args(tmp_path / "killed"), ledger=tmp_path / "killed.ledger")
    a, b = fingerprint(tmp_path / "straight"), fingerprint(tmp_path / "killed")
    assert_same_run(a, b)
    ran_a = collections.Counter((tmp_path / "straight.ledger").read_text().splitlines())
    ran_b = collections.Counter((tmp_path / "killed.ledger").read_text().splitlines())
    assert sum(ran_a.values()) >= 10 and ran_b == ran_a


def _ledger(path: Path) -> collections.Counter:
    return collections.Counter(path.read_text().splitlines()) if path.exists() else collections.Counter()


def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before_and_the_run_still_ends_exactly(tmp_path):
    straight, damaged = tmp_path / "straight", tmp_path / "damaged"
    train_with_kills([], _program_args(straight, tmp_path / "a.ledger", every=2))
    assert harness("commit:s5g:2", _program_args(damaged, tmp_path / "b.ledger", every=2)).returncode == -9
    assert sorted(p.name for p in (damaged / "checkpoints").iterdir()) == ["latest", "step000002", "step000004"]
    weights = max((damaged / "checkpoints" / "step000004").rglob("*.pt"), key=lambda p: p.stat().st_size)
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated
    done = harness("none", _program_args(damaged, tmp_path / "b.ledger", every=2))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step000004 is damaged: " in done.stderr
    assert "resumed from checkpoint step000002 instead of step000004" in done.stderr
    assert_same_run(fingerprint(straight), fingerprint(damaged))
    assert _ledger(tmp_path / "b.ledger") == _ledger(tmp_path / "a.ledger")


def test_sigterm_then_sigint_stop_at_a_checkpoint_with_a_message_and_the_run_resumes_exactly(tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train_with_kills([], _program_args(straight, tmp_path / "a.ledger", every=6))
    for signal_kill, name, step, code in (("term:s2g:2", "SIGTERM", 2, 143), ("int:s4g", "SIGINT", 4, 130)):
        done = harness(signal_kill, _program_args(stopped, tmp_path / "b.ledger", every=6))
        # the step in progress finishes and is checkpointed although checkpoint_every is 6
        assert done.returncode == code, done.stderr[-3000:]
        assert f"{name} received: finishing the step in progress" in done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last == (f"wmrl train: stopped by {name} after step {step} of 6 (checkpoint {stopped / 'checkpoints'}); "
                        "run the same command again to resume")
        assert "Traceback" not in done.stderr
        assert (stopped / "checkpoints" / f"step{step:06d}" / "manifest.json").exists()
    assert harness("none", _program_args(stopped, tmp_path / "b.ledger", every=6)).returncode == 0
    assert_same_run(fingerprint(straight), fingerprint(stopped))
    assert _ledger(tmp_path / "b.ledger") == _ledger(tmp_path / "a.ledger")  # a stop wastes no execution


def test_a_second_process_on_a_run_directory_gets_one_line_and_a_dead_holders_lock_is_taken_over(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom wmrl.core.run_lock import RunLock\n"
                               f"RunLock({str(run)!r}); print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        done = harness("none", _program_args(run, tmp_path / "ledger"))
        assert done.returncode == 1
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"wmrl train: error: {run} is in use by pid {holder.pid} on ")
        assert "since " in line and "wait for it to finish, or stop it" in line
        assert not (run / "store.sqlite").exists() and not _ledger(tmp_path / "ledger")  # it touched nothing
    finally:
        holder.kill()
        holder.wait()
    done = harness("none", _program_args(run, tmp_path / "ledger"))  # killed: its lock is free, the run goes on
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["history"][-1]["step"] == 6


def test_a_full_disk_stops_the_run_with_one_line_and_it_resumes_exactly_once_space_is_freed(tmp_path):
    """On a 64 MiB tmpfs of a private mount namespace, filled up after step 3 was stored."""
    straight, copy, mnt = tmp_path / "straight", tmp_path / "full-copy", tmp_path / "mnt"
    train_with_kills([], _program_args(straight, tmp_path / "a.ledger"))
    mnt.mkdir()
    run, out = mnt / "run", tmp_path / "out"
    out.mkdir()

    def step(kill: str, name: str) -> str:
        argv = " ".join(shlex.quote(a) for a in [sys.executable, str(HARNESS), kill, "--", *_program_args(
            run, tmp_path / "b.ledger")])
        return f"{argv} >{out / name}.out 2>{out / name}.err; echo $? >{out / name}.rc"

    script = "\n".join([
        "set -u", f"mount -t tmpfs -o size=64m tmpfs {mnt}",
        step("commit:s4g", "first"),  # dies inside step 4, after checkpoint 3
        f"dd if=/dev/zero of={mnt}/ballast bs=64k 2>/dev/null; true",  # the disk is full now
        step("none", "full"),
        f"rm {mnt}/ballast",  # space freed
        step("none", "freed"),
        f"cp -a {run} {copy}",
    ])
    subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=_env(), check=True,
                   timeout=900)

    def rc(name):
        return int((out / f"{name}.rc").read_text())

    assert rc("first") == 137
    full = (out / "full.err").read_text()
    assert rc("full") == 1, full[-3000:]
    assert "Traceback" not in full
    last = full.strip().splitlines()[-1]
    assert last.startswith("wmrl train: error: ") and f" in {mnt}" in last and "the disk is full" in last
    assert "nothing already stored is lost: free space and run the same command again to resume" in last
    assert rc("freed") == 0, (out / "freed.err").read_text()[-3000:]
    assert_same_run(fingerprint(straight), fingerprint(copy))
    assert _ledger(tmp_path / "b.ledger") == _ledger(tmp_path / "a.ledger")


STORE_ON_A_FULL_DISK = """
import json, os, sqlite3, subprocess, sys
from wmrl.core.errors import StorageError
from wmrl.core.store import ExecutionRecord, RunStore

mnt = sys.argv[1]
store = RunStore(os.path.join(mnt, "store.sqlite"))
payload = os.urandom(48 * 1024)  # incompressible, so the disk fills after a few dozen records

def put(i):
    store.put_executions([ExecutionRecord(f"k{i}", "run", 0, "t", "ok", 0.5, payload, {"i": i})])

acked, error = 0, None
try:
    for i in range(10_000):
        put(i)
        acked = i + 1
except StorageError as exc:
    error = str(exc)
stored_full = store.count_executions()
subprocess.run(["mount", "-o", "remount,size=16m", mnt], check=True)  # space freed
for i in range(acked, acked + 10):
    put(i)
store.close()
with sqlite3.connect(os.path.join(mnt, "store.sqlite")) as db:
    check = db.execute("PRAGMA integrity_check").fetchone()[0]
    keys = {k for (k,) in db.execute("SELECT key FROM executions")}
print(json.dumps({"acked": acked, "error": error, "stored_full": stored_full, "check": check,
                  "keys": sorted(keys, key=lambda k: int(k[1:]))}))
"""


def test_the_store_on_a_full_disk_keeps_every_acknowledged_record_and_writes_again_once_space_is_freed(tmp_path):
    """SQLite's own ENOSPC path, below the trainer: a 2 MiB tmpfs in a private mount namespace."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = f"mount -t tmpfs -o size=2m tmpfs {mnt} && exec {sys.executable} -c \"$0\" {mnt}"
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, STORE_ON_A_FULL_DISK],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout.splitlines()[-1])
    assert 5 <= res["acked"] < 10_000 and res["stored_full"] == res["acked"]  # the failed write added nothing
    assert res["error"].startswith(f"could not write to the run store in {mnt / 'store.sqlite'}: the disk is full")
    assert res["check"] == "ok"
    assert res["keys"] == [f"k{i}" for i in range(res["acked"] + 10)]  # none lost, the writes go on
