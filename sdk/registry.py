"""The public registration decorators, and the import of the built-in domains that fill the registries.

Registries live in `wmrl.core.registry` (core code registers estimators there);
this module is the public face: `wmrl.register_domain("name")` on a `Domain`
subclass makes it selectable by `domain.name` in any config,
`wmrl.register_world_model("name", domains=[...], config=...)` on a factory
makes a world model selectable by `world_model.type` for those domains, and
`wmrl.register_benchmark("name", options=...)` on a run function makes it
`wmrl bench name`.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, is_dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from wmrl.core.registry import BENCHMARKS, DOMAINS, ESTIMATORS
from wmrl.core.wm_spec import register_world_model

__all__ = ["BenchmarkSpec", "load_builtin_domains", "register_benchmark", "register_domain", "register_estimator",
           "register_world_model"]

#: modules whose import registers a built-in domain
BUILTIN_DOMAINS = ("wmrl.domains.synthetic.program", "wmrl.domains.synthetic.control")
#: domains whose dependencies are an extra: name -> (module, extra)
OPTIONAL_DOMAINS = {"autoresearch": ("wmrl.domains.autoresearch.domain", "autoresearch"),
                    "vla": ("wmrl.domains.vla.domain", "vla")}


def load_builtin_domains() -> dict[str, str]:
    """Import the built-in domains; returns the optional ones that could not be imported -> what to do."""
    for mod in BUILTIN_DOMAINS:
        importlib.import_module(mod)
    unavailable = {}
    for name, (mod, extra) in OPTIONAL_DOMAINS.items():
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            unavailable[name] = f"domain {name!r} needs `pip install wmrl[{extra}]` ({exc})"
    return unavailable


def vla_pipeline() -> ModuleType:
    """The VLA pipeline module (`wmrl vla ...`); a missing extra is an ImportError that says what to install."""
    try:
        return importlib.import_module("wmrl.domains.vla.pipeline")
    except ImportError as exc:
        raise ImportError(f"`wmrl vla` needs `pip install wmrl[vla]` and `pip install --no-deps lerobot==0.4.4` ({exc})") from exc


def register_domain(name: str):
    return DOMAINS.register(name)


def register_estimator(name: str):
    return ESTIMATORS.register(name)


@dataclass(frozen=True)
class BenchmarkSpec:
    #: `run(options, run_overrides) -> Path` of the JSON it wrote
    run: Callable[[Any, list[str]], Path]
    #: the dataclass of its `key=value` options
    options: type
    #: whether keys that are not options go to its runs as run-config overrides (else they are refused)
    run_config: bool
    #: what `--help` prints above the options: the benchmark module's docstring
    doc: str


def register_benchmark(name: str, *, options: type, run_config: bool = False):
    """Decorator on `run(options, run_overrides) -> Path`: `wmrl bench name`, its options typed by `options`."""
    if not is_dataclass(options):
        raise TypeError(f"benchmark {name!r}: options must be a dataclass, got {options!r}")

    def deco(run):
        doc = sys.modules[run.__module__].__doc__ or run.__doc__ or ""
        BENCHMARKS.register(name)(BenchmarkSpec(run, options, run_config, doc))
        return run

    return deco
