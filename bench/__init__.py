"""Benchmarks, registered like domains and world models, each with typed options and `--help`.

A benchmark is a function `run(opts, run_overrides) -> Path` (JSON out)
registered with `@wmrl.register_benchmark(name, options=Dataclass)`.
`wmrl bench NAME key=value ...` types the keys that are fields of the options
dataclass exactly like a run config (wrong types and values are a
`ConfigError` naming the key); the rest, run-config keys such as
`trainer.steps=40`, go to every run of a benchmark that trains
(`run_config=True`) and are refused by the others. `wmrl bench NAME --help`
lists the options with their defaults and help. The built-in benchmarks are
the modules of this package named in `BUILTIN_BENCHMARKS`.
"""

from __future__ import annotations

import importlib
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Sequence

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from wmrl.config import ConfigError
from wmrl.core.registry import BENCHMARKS
from wmrl.core.validation import validate_config
from wmrl.registry import BenchmarkSpec, register_benchmark

__all__ = ["BUILTIN_BENCHMARKS", "help_text", "parse_options", "register_benchmark", "run_benchmark"]

#: modules of this package whose import registers a built-in benchmark
BUILTIN_BENCHMARKS = ("speedup", "estimators", "wm", "sandbox", "hostile", "rollout", "scaling", "vla", "results")


def _spec(name: str) -> BenchmarkSpec:
    for module in BUILTIN_BENCHMARKS:
        importlib.import_module(f"wmrl.bench.{module}")
    return BENCHMARKS.get(name)


def parse_options(spec: BenchmarkSpec, args: Sequence[str]) -> tuple[Any, list[str]]:
    """The benchmark's typed, validated options, and the run-config overrides it passes on."""
    own = {f.name for f in fields(spec.options)}
    mine, rest = [], []
    for arg in args:
        key, eq, _ = str(arg).partition("=")
        if not eq or not key:
            raise ConfigError(f"bad benchmark option {arg!r}: write key=value (see `wmrl bench NAME --help`)")
        (mine if key in own else rest).append(str(arg))
    if rest and not spec.run_config:
        raise ConfigError(f"unknown option {rest[0].partition('=')[0]!r}; this benchmark's options are: "
                          f"{', '.join(sorted(own))}")
    try:
        opts = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(spec.options), OmegaConf.from_dotlist(mine)))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ConfigError(f"benchmark option {key!r}: {str(exc).splitlines()[0]}") from None
    try:
        validate_config(opts)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return opts, rest


def help_text(name: str) -> str:
    """What `wmrl bench NAME --help` prints: the benchmark's docstring and its options."""
    spec = _spec(name)
    lines = [f"wmrl bench {name} [option=value ...]" + (" [run-config key=value ...]" if spec.run_config else ""),
             "", spec.doc.strip(), "", "options:"]
    for f in fields(spec.options):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        lines.append(f"  {f.name}={default}  ({getattr(f.type, '__name__', f.type)}) {f.metadata.get('help', '')}".rstrip())
    return "\n".join(lines) + "\n"


def run_benchmark(name: str, args: Sequence[str] = ()) -> Path:
    spec = _spec(name)
    opts, run_overrides = parse_options(spec, args)
    return spec.run(opts, run_overrides)
