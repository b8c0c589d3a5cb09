"""Benchmarks: each a module here with `run(overrides) -> Path` (JSON out), selected by name."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Sequence

BENCHMARKS = ("speedup", "estimators", "sandbox", "hostile", "wm", "rollout", "results")


def run_benchmark(name: str, overrides: Sequence[str] = ()) -> Path:
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; available: {', '.join(BENCHMARKS)}")
    return importlib.import_module(f"wmrl.bench.{name}").run(list(overrides))
