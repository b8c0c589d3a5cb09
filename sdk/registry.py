"""The public registries, and the import of the built-in domains that fill them.

Registries live in `wmrl.core.registry` (core code registers estimators there);
this module is the public face: `wmrl.register_domain("name")` on a `Domain`
subclass makes it selectable by `domain.name` in any config.
"""

from __future__ import annotations

import importlib

from wmrl.core.registry import DOMAINS, ESTIMATORS, WORLD_MODELS

#: modules whose import registers a built-in domain
BUILTIN_DOMAINS = ("wmrl.domains.synthetic.program", "wmrl.domains.synthetic.control")
#: domains whose dependencies are an extra: name -> (module, extra)
OPTIONAL_DOMAINS = {"autoresearch": ("wmrl.domains.autoresearch.domain", "autoresearch")}
#: optional domains that could not be imported: name -> what to do
UNAVAILABLE: dict[str, str] = {}


def load_builtin_domains() -> None:
    for mod in BUILTIN_DOMAINS:
        importlib.import_module(mod)
    for name, (mod, extra) in OPTIONAL_DOMAINS.items():
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            UNAVAILABLE[name] = f"domain {name!r} needs `pip install wmrl[{extra}]` ({exc})"


def register_domain(name: str):
    return DOMAINS.register(name)


def register_world_model(name: str):
    return WORLD_MODELS.register(name)


def register_estimator(name: str):
    return ESTIMATORS.register(name)
