"""The same tuning budget for every mode: a learning-rate grid chosen on the validation split.

A speed-up over a baseline tuned less carefully than the method is no
speed-up. Before the final runs, `wmrl bench speedup lrs=a,b,c` trains every
mode at every learning rate of one grid, on the same tuning seeds (disjoint
from the final runs' seeds, so the final numbers are fresh draws, not the
selected ones), and keeps per mode the rate with the highest mean final reward
on `validation`, a split in-distribution like `test_id` and disjoint from it
(`core/types.py`). `test_id` and `test_ood` are never evaluated while tuning.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from wmrl.bench.harness import RunRecord

#: tuning seeds start here: the final runs use 0, 1, ... so no final run repeats a tuning run
TUNING_SEED_BASE = 1000
SPLIT = "validation"
#: how a tuning run evaluates: on validation only, at the start and the end
EVALUATION = [f"trainer.eval_splits=[{SPLIT}]", "trainer.eval_every=0"]


def parse_grid(text: str) -> list[float]:
    """`"0.01,0.03,0.1"` -> the grid; at least two distinct positive rates, or a ValueError saying what to write."""
    try:
        grid = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"lrs={text!r}: write comma-separated learning rates, e.g. lrs=0.01,0.03,0.1") from None
    if len(set(grid)) < 2 or not all(math.isfinite(x) and x > 0 for x in grid):
        raise ValueError(f"lrs={text!r}: give at least two distinct positive learning rates, e.g. lrs=0.01,0.03,0.1")
    return sorted(set(grid))


def _means(scores: dict[float, list[float | None]]) -> dict[float, float | None]:
    """Per rate, the mean final validation reward of its runs that left one (None: none did)."""
    return {lr: float(np.mean([x for x in v if x is not None])) if any(x is not None for x in v) else None
            for lr, v in scores.items()}


def choose(scores: dict[float, list[float | None]]) -> float | None:
    """The rate whose mean final validation reward is highest (the smaller rate on a tie); a run that left no
    score is left out of its rate's mean, not counted as 0. None when no rate has a score."""
    means = {lr: m for lr, m in _means(scores).items() if m is not None}
    if not means:
        return None
    best = max(means.values())
    return min(lr for lr, m in means.items() if m == best)


def tune(runner_for: Callable[[str], Callable[..., RunRecord]], run_config: str, overrides: Sequence[str],
         modes: dict[str, list[str]], grid: Sequence[float], seeds: int, work: Path, reuse: bool) -> dict:
    """Every mode at every rate of `grid` on `seeds` tuning seeds (modes interleaved within a seed and rate, so
    machine drift hits them alike); per mode the validation scores, the chosen rate and the wall it cost."""
    records: dict[str, dict[float, list[RunRecord]]] = {m: {lr: [] for lr in grid} for m in modes}
    for s in range(seeds):
        seed = TUNING_SEED_BASE + s
        for lr in grid:
            for mode, mode_overrides in modes.items():
                run_dir = work / mode / f"lr{lr:g}" / f"seed{seed}"
                record = runner_for(mode)(run_config, [*overrides, *mode_overrides, f"engine.lr={lr:g}", *EVALUATION],
                                          run_dir, mode, seed, reuse=reuse)
                records[mode][lr].append(record)
    out: dict = {"split": SPLIT, "grid": list(grid), "seeds": [TUNING_SEED_BASE + s for s in range(seeds)],
                 "modes": {}}
    for mode, by_lr in records.items():
        scores = {lr: [r.history[-1].get(f"eval_{SPLIT}") for r in rs] for lr, rs in by_lr.items()}
        chosen = choose(scores)
        out["modes"][mode] = {
            "validation_final": {f"{lr:g}": v for lr, v in scores.items()},
            "validation_final_mean": {f"{lr:g}": m for lr, m in _means(scores).items()},
            "chosen_lr": chosen,
            # a rate chosen at the grid's edge says the grid should reach further that way
            "chosen_at_grid_edge": chosen in (min(grid), max(grid)),
            "tuning_wall": float(sum(r.wall for rs in by_lr.values() for r in rs)),
        }
    return out
