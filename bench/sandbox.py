"""`wmrl bench sandbox`: what one sandboxed execution costs, zygote vs cold start, and pool throughput.

Real execution is the expensive part of RL on AutoResearch, so the sandbox's
own overhead is measured end to end, as the trainer pays it (`Sandbox.run`
from call to return, isolation included):

* per-execution latency of the zygote path (fork of a process that has
  numpy/pandas/scikit-learn imported) and of the cold path (a fresh
  interpreter per execution, same isolation), on (a) `print(1)` and (b) a real
  scikit-learn fit (StandardScaler + LogisticRegression on load_digits).
  `repeats` rounds x `n` executions each, both paths interleaved within each
  round so machine drift hits both alike; the figure is the median over rounds
  of each round's median, and the spread is max - min over rounds;
* pool throughput (executions/s of a short scikit-learn script) for
  slots = 1, 2, ..., os.cpu_count(): the local pool (threads over one zygote)
  and the Ray pool (`executor: ray`, one actor and zygote per slot, a local Ray
  instance), rounds interleaved;
* what durability costs: the pool's executions/s when each execution is
  committed to the run store (SQLite, WAL, synchronous=FULL: an fsync per
  commit) the moment it finishes, as the trainer does, against one commit for
  the whole batch once it is done; same jobs, rounds interleaved.

Options (`wmrl bench sandbox --help`): `repeats=N` (3), `n=N` (10),
`pool_jobs=N` (jobs per slot, 20), `slots=1,2,4` (default 1..cpu_count),
`commit_rounds=N` (5), `out=PATH` (bench/out/sandbox.json).
The default run takes about 2.5 minutes on 2 cores. Needs root (see the
sandbox module); a run that is not "ok" aborts the benchmark.
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from wmrl.bench.harness import write_result
from wmrl.core.store import ExecutionRecord, RunStore
from wmrl.domains.autoresearch.sandbox import Job, Sandbox, SandboxLimits, SandboxPool
from wmrl.registry import register_benchmark

TRIVIAL = "print(1)\n"

SKLEARN_FIT = """\
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
X, y = load_digits(return_X_y=True)
model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=300)).fit(X[:1200], y[:1200])
with open("predictions.csv", "w") as fh:
    fh.write("\\n".join(map(str, model.predict(X[1200:]))))
print(round(model.score(X[1200:], y[1200:]), 4))
"""

SKLEARN_SHORT = """\
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
X, y = make_classification(n_samples=500, n_features=20, random_state=0)
print(round(LogisticRegression().fit(X, y).score(X, y), 4))
"""

LIMITS = SandboxLimits(timeout_s=60.0, cpu_s=120)


def _median(xs):
    return float(statistics.median(xs))


def timed(sb: Sandbox, code: str, wd: Path, outputs: tuple[str, ...] = ()) -> tuple[float, float]:
    """(end-to-end seconds of `Sandbox.run`, the program's wall seconds); a run that is not "ok" raises."""
    t0 = time.perf_counter()
    r = sb.run(code, wd, outputs=outputs)
    e2e = time.perf_counter() - t0
    if r.status != "ok":
        raise RuntimeError(f"benchmark execution failed: {r.status} {r.detail}\n{r.stderr[-2000:]}")
    return e2e, r.wall_s


def _latency(work: Path, repeats: int, n: int) -> dict:
    paths = {"zygote": Sandbox(LIMITS), "cold": Sandbox(LIMITS, use_zygote=False)}
    scripts = {"trivial": TRIVIAL, "sklearn_fit": SKLEARN_FIT}
    out: dict = {}
    try:
        wd = work / "latency"
        wd.mkdir()
        t0 = time.perf_counter()
        timed(paths["zygote"], TRIVIAL, wd)  # zygote start-up, reported separately
        zygote_start = time.perf_counter() - t0
        for sb in paths.values():  # warm the page cache and imports on both paths
            timed(sb, SKLEARN_FIT, wd)
        rounds = {s: {p: [] for p in paths} for s in scripts}
        program = {s: {p: [] for p in paths} for s in scripts}
        for _ in range(repeats):
            for sname, code in scripts.items():
                for pname, sb in paths.items():  # interleaved within the round
                    e2e, wall = zip(*(timed(sb, code, wd) for _ in range(n)))
                    rounds[sname][pname].append(_median(e2e))
                    program[sname][pname].append(_median(wall))
        for sname in scripts:
            entry: dict = {}
            for pname in paths:
                meds = rounds[sname][pname]
                entry[pname] = {
                    "median_s": _median(meds),
                    "spread_s": max(meds) - min(meds),
                    "round_medians_s": meds,
                    "program_wall_median_s": _median(program[sname][pname]),
                }
            entry["cold_over_zygote"] = entry["cold"]["median_s"] / entry["zygote"]["median_s"]
            entry["saved_per_execution_s"] = entry["cold"]["median_s"] - entry["zygote"]["median_s"]
            out[sname] = entry
        out["zygote_startup_s"] = zygote_start
    finally:
        for sb in paths.values():
            sb.close()
    return out


def _throughput(work: Path, slot_list: list[int], jobs_per_slot: int, rounds: int) -> list[dict]:
    """Executions/s of the local pool and of the Ray pool (one actor per slot), per slot count, interleaved."""
    from wmrl.domains.autoresearch.ray_pool import RaySandboxPool

    rows = []
    for slots in slot_list:
        d = work / f"pool{slots}"
        d.mkdir()
        t0 = time.perf_counter()
        pools = {"local": SandboxPool(slots=slots, limits=LIMITS)}
        pools["ray"] = RaySandboxPool(slots, LIMITS)
        ray_start = time.perf_counter() - t0
        rates: dict[str, list[float]] = {name: [] for name in pools}
        walls: dict[str, list[float]] = {name: [] for name in pools}
        try:
            for pool in pools.values():  # zygote start-up and warm-up
                pool.run_many([Job(SKLEARN_SHORT, d) for _ in range(slots)])
            for rnd in range(rounds):
                for name in (("local", "ray") if rnd % 2 == 0 else ("ray", "local")):
                    t0 = time.perf_counter()
                    results = pools[name].run_many([Job(SKLEARN_SHORT, d) for _ in range(slots * jobs_per_slot)])
                    rates[name].append(len(results) / (time.perf_counter() - t0))
                    bad = [r for r in results if r.status != "ok"]
                    if bad:
                        raise RuntimeError(f"{name} pool execution failed: {bad[0].status} {bad[0].detail}")
                    walls[name].extend(r.wall_s for r in results)
        finally:
            for pool in pools.values():
                pool.close()
        row: dict = {"slots": slots, "executions": slots * jobs_per_slot, "rounds": rounds,
                     "ray_start_s": ray_start}
        for name in pools:
            row[name] = {"executions_per_s": _median(rates[name]), "round_rates": rates[name],
                         "program_wall_median_s": _median(walls[name])}
        row["ray_over_local"] = row["ray"]["executions_per_s"] / row["local"]["executions_per_s"]
        rows.append(row)
    base = rows[0]["local"]["executions_per_s"] / rows[0]["slots"] if rows else 1.0
    for row in rows:
        row["speedup_vs_1_slot_rate"] = row["local"]["executions_per_s"] / base
    return rows


def _commit_cost(work: Path, rounds: int, jobs_per_round: int) -> dict:
    """Pool executions/s with a store commit per execution as it finishes vs one commit per batch."""
    store = RunStore(work / "store.sqlite")
    slots = os.cpu_count() or 1
    rates: dict[str, list[float]] = {"each": [], "batch": []}
    commit_ms: list[float] = []

    def record(key: str, r) -> ExecutionRecord:
        return ExecutionRecord(key, "bench", 0, "t", r.status, 1.0 if r.status == "ok" else 0.0,
                               pickle.dumps((r.stdout, r.stderr, r.wall_s)), {"wall_s": r.wall_s})

    try:
        with SandboxPool(slots=slots, limits=LIMITS) as pool:
            d = work / "commits"
            d.mkdir()
            pool.run_many([Job(SKLEARN_SHORT, d) for _ in range(slots)])  # zygote start-up and warm-up
            for rnd in range(rounds):
                for mode in (("each", "batch") if rnd % 2 == 0 else ("batch", "each")):
                    jobs = [Job(SKLEARN_SHORT, d) for _ in range(jobs_per_round)]
                    t0 = time.perf_counter()
                    done = []
                    for i, r in pool.run_each(jobs):
                        if r.status != "ok":
                            raise RuntimeError(f"pool execution failed: {r.status} {r.detail}")
                        if mode == "each":
                            c0 = time.perf_counter()
                            store.put_executions([record(f"{rnd}/{mode}/{i}", r)])
                            commit_ms.append((time.perf_counter() - c0) * 1e3)
                        else:
                            done.append(record(f"{rnd}/{mode}/{i}", r))
                    store.put_executions(done)
                    rates[mode].append(jobs_per_round / (time.perf_counter() - t0))
    finally:
        store.close()
    each, batch = _median(rates["each"]), _median(rates["batch"])
    return {"slots": slots, "rounds": rounds, "executions_per_round": jobs_per_round,
            "each": {"executions_per_s": each, "round_rates": rates["each"]},
            "batch": {"executions_per_s": batch, "round_rates": rates["batch"]},
            "each_over_batch": each / batch, "commit_median_ms": _median(commit_ms),
            "commit_p90_ms": float(sorted(commit_ms)[int(0.9 * (len(commit_ms) - 1))])}


@dataclass
class SandboxOptions:
    repeats: int = field(default=3, metadata={"help": "rounds; the figure is the median over rounds"})
    n: int = field(default=10, metadata={"help": "executions per round and path"})
    pool_jobs: int = field(default=20, metadata={"help": "pool jobs per slot"})
    slots: str | None = field(default=None, metadata={"help": "comma-separated slot counts (default 1..cpu_count)"})
    commit_rounds: int = field(default=5, metadata={"help": "interleaved rounds of the pool and commit-cost "
                                                                    "comparisons"})
    out: str = field(default="bench/out/sandbox.json", metadata={"help": "JSON path"})

    def validate(self) -> None:
        if min(self.repeats, self.n, self.pool_jobs, self.commit_rounds) < 1:
            raise ValueError("repeats, n, pool_jobs and commit_rounds must be >= 1")


@register_benchmark("sandbox", options=SandboxOptions)
def run(opts: SandboxOptions, _: list[str]) -> Path:
    repeats, n = opts.repeats, opts.n
    cpus = os.cpu_count() or 1
    slot_list = [int(s) for s in opts.slots.split(",")] if opts.slots else list(range(1, cpus + 1))
    out = Path(opts.out)
    work = Path(tempfile.mkdtemp(prefix="wmrl-bench-sandbox-"))
    started = time.time()
    load_before = os.getloadavg()
    try:
        latency = _latency(work, repeats, n)
        throughput = _throughput(work, slot_list, opts.pool_jobs, opts.commit_rounds)
        commits = _commit_cost(work, opts.commit_rounds, opts.pool_jobs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import numpy
    import sklearn

    result = {
        "benchmark": "sandbox",
        "what": "end-to-end Sandbox.run latency (isolation included), zygote fork vs cold interpreter; "
                "pool throughput, local (one zygote) vs Ray (an actor and zygote per slot); cost of durable commits",
        "repeats": repeats,
        "executions_per_repeat": n,
        "latency": latency,
        "pool_throughput": throughput,
        "commit_cost": commits,
        "machine": {
            "cpu_count": cpus, "platform": platform.platform(), "python": sys.version.split()[0],
            "numpy": numpy.__version__, "sklearn": sklearn.__version__,
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        },
        "duration_s": time.time() - started,
    }
    return write_result(out, result, table)


def table(result: dict) -> str:
    lat = result["latency"]
    lines = [f"`wmrl bench sandbox`: {result['repeats']} rounds x {result['executions_per_repeat']} executions, "
             f"{result['machine']['cpu_count']} cores; end-to-end `Sandbox.run` latency, isolation included", "",
             "| script | zygote (ms) | cold start (ms) | cold / zygote |", "|---|---:|---:|---:|"]
    for name, label in (("trivial", "`print(1)`"), ("sklearn_fit", "digits LogisticRegression fit")):
        e = lat[name]
        lines.append(f"| {label} | {e['zygote']['median_s'] * 1e3:.0f} | {e['cold']['median_s'] * 1e3:.0f} "
                     f"| {e['cold_over_zygote']:.1f}x |")
    lines += ["", "| pool slots | local executions/s | vs 1 slot | Ray executions/s | Ray / local | Ray start (s) |",
              "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['slots']} | {r['local']['executions_per_s']:.1f} | {r['speedup_vs_1_slot_rate']:.2f}x | "
              f"{r['ray']['executions_per_s']:.1f} | {r['ray_over_local']:.2f}x | {r['ray_start_s']:.1f} |"
              for r in result["pool_throughput"]]
    c = result.get("commit_cost")
    if c:
        lines += ["", f"Durability: {c['slots']} slots, {c['executions_per_round']} executions a round, "
                  f"{c['rounds']} rounds interleaved; a commit is one SQLite transaction with an fsync", "",
                  "| store commits | executions/s | commit (ms, median / p90) |", "|---|---:|---:|",
                  f"| one per execution, as it finishes | {c['each']['executions_per_s']:.2f} | "
                  f"{c['commit_median_ms']:.2f} / {c['commit_p90_ms']:.2f} |",
                  f"| one per batch | {c['batch']['executions_per_s']:.2f} | |",
                  f"| per execution / per batch | {c['each_over_batch']:.3f}x | |"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    path = run(sys.argv[1:])
    res = json.loads(path.read_text())
    for name in ("trivial", "sklearn_fit"):
        e = res["latency"][name]
        print(f"{name}: zygote {e['zygote']['median_s'] * 1000:.0f} ms, cold {e['cold']['median_s'] * 1000:.0f} ms, "
              f"cold/zygote {e['cold_over_zygote']:.1f}x")
    for row in res["pool_throughput"]:
        print(f"slots {row['slots']}: local {row['local']['executions_per_s']:.1f}, ray "
              f"{row['ray']['executions_per_s']:.1f} executions/s")
    print(path)
