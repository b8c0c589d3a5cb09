"""One validation style for every config: a dataclass checks itself in `validate()`, run at load.

A config is a tree of dataclasses (`RunConfig` holds the sections, a section
may hold sub-sections such as `estimator.debias`). `validate_config` walks the
tree and calls each node's `validate()`, children first, so a section's own
check may rely on its parts being valid. `load_config` runs it on the whole
tree; the trainer, the engine and `build_estimator` run it again on the
sections they are given, for configs built by hand (the checks are cheap and
pure). Checks raise `ValueError` naming the key and what is allowed; they look
at values only, never the file system, except where a path is the value being
checked.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any


def validate_config(cfg: Any) -> None:
    """Run every `validate()` in the dataclass tree under `cfg` (a ValueError says what to fix)."""
    if not is_dataclass(cfg):
        return
    for f in fields(cfg):
        validate_config(getattr(cfg, f.name))
    check = getattr(cfg, "validate", None)
    if callable(check):
        check()


def at_least(cfg: Any, section: str, minimum: float, *keys: str) -> None:
    """Refuse any of `keys` below `minimum`, naming it as `section.key`."""
    for key in keys:
        value = getattr(cfg, key)
        if not value >= minimum:
            raise ValueError(f"{section}.{key} must be >= {minimum:g}, got {value!r}")
