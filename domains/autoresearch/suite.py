"""Loading the `autoresearch-mini` suite: every task built or read back, and its scores pinned by the grader.

`tasks.py` defines the tasks and owns their data; a task's baseline score (the
trivial submission's) and reference score (a default HistGradientBoosting
model's) are what turn a raw score into a reward, and only the grader can
measure them. This module is where the two meet: it loads each task and, when
a score is not known yet (not pinned, not cached in the task's meta), has the
grader measure it and keeps it in the cache. `python -m
wmrl.domains.autoresearch.suite --measure` regenerates the pinned references
and the fit times quoted in `docs/autoresearch_tasks.md`.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

from wmrl.domains.autoresearch import grader
from wmrl.domains.autoresearch.tasks import (
    SPECS, SUITE_NAME, ARTask, default_cache_dir, record_scores, task_for_spec, train_frame,
)

__all__ = ["load_suite"]


def load_suite(name: str = SUITE_NAME, cache_dir: str | os.PathLike | None = None) -> list[ARTask]:
    """The tasks of the suite, built (or read back from `cache_dir`) deterministically.

    `cache_dir` defaults to `~/.cache/wmrl/autoresearch-mini/<version>` (`$WMRL_CACHE_DIR` replaces
    `~/.cache/wmrl`). It holds the hidden labels: keep it out of the sandbox.
    """
    if name != SUITE_NAME:
        raise ValueError(f"unknown AutoResearch suite {name!r}; available: {SUITE_NAME!r} (task directories on disk "
                         "load with wmrl.domains.autoresearch.external.load_task_root)")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    tasks = []
    for spec in SPECS:
        task = task_for_spec(spec, root / spec.id)
        if not math.isfinite(task.baseline):
            task = record_scores(task, baseline=grader.baseline_score(task))
        if not math.isfinite(task.reference):
            task = record_scores(task, reference=grader.reference_score(task))
        tasks.append(task)
    return tasks


def _measure(cache_dir: str | None) -> None:  # pragma: no cover - a maintenance tool
    import time

    from sklearn.ensemble import (
        HistGradientBoostingClassifier, HistGradientBoostingRegressor, RandomForestClassifier, RandomForestRegressor,
    )
    from sklearn.multioutput import MultiOutputRegressor
    from threadpoolctl import threadpool_limits

    rows, pins = [], {}
    with threadpool_limits(limits=1):
        for task in load_suite(cache_dir=cache_dir):
            tr = train_frame(task)
            X = grader.feature_matrix(task, tr)
            clf = task.classes is not None
            y = tr[list(task.target_columns)].to_numpy().astype(str if clf else float)
            y = y[:, 0] if y.shape[1] == 1 else y
            ref = grader.reference_score(task)  # measured afresh, whatever is pinned
            hgb = (HistGradientBoostingClassifier if clf else HistGradientBoostingRegressor)(random_state=0)
            if y.ndim == 2:
                hgb = MultiOutputRegressor(hgb)
            rf = (RandomForestClassifier if clf else RandomForestRegressor)(n_estimators=100, n_jobs=1, random_state=0)
            times = []
            for model in (hgb, rf):
                t0 = time.perf_counter()
                model.fit(X, y)
                times.append(time.perf_counter() - t0)
            pins[task.id] = round(ref, 6)
            t = replace(task, reference=ref)
            rows.append(f"| `{t.id}` | {t.family} | {t.split} | {t.metric} | {t.n_train} / {t.n_test} × "
                        f"{len(t.feature_columns)} | {t.budget_s} | {t.baseline:.4g} | {ref:.4g} | "
                        f"{t.target_score:.4g} | {t.normalize(ref):.2f} | {times[0]:.2f} | {times[1]:.2f} |")
            print(rows[-1], flush=True)
    print("\n_PINNED_REFERENCE = {")
    for k, v in pins.items():
        print(f"    {k!r}: {v!r},")
    print("}")


if __name__ == "__main__":  # pragma: no cover
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measure", action="store_true", help="recompute references and time fits on one core")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()
    if args.measure:
        _measure(args.cache_dir)
    else:
        for task in load_suite(cache_dir=args.cache_dir):
            print(task)
