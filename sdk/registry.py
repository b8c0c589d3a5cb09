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


def load_builtin_domains() -> None:
    for mod in BUILTIN_DOMAINS:
        importlib.import_module(mod)


def register_domain(name: str):
    return DOMAINS.register(name)


def register_world_model(name: str):
    return WORLD_MODELS.register(name)


def register_estimator(name: str):
    return ESTIMATORS.register(name)
