"""Name -> factory registries, so a new domain, world model or estimator is one decorator.

A `type`/`name` key in the config selects the entry; an unknown name is an error
that lists what is registered, which is what a user mistyping a name needs.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            old = self._entries.get(name)
            if old is not None and old is not obj and _qualname(old) != _qualname(obj):
                raise ValueError(f"{self.kind} {name!r} is already registered to {_qualname(old)}")
            # the same definition run again (a notebook cell, a reload) replaces itself
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: Any) -> bool:
        return name in self._entries


#: modes of the reward estimator (real, wm, wmrl)
ESTIMATORS: Registry[type] = Registry("estimator mode")
#: domains: name -> Domain subclass
DOMAINS: Registry[type] = Registry("domain")
#: world models usable by several domains
WORLD_MODELS: Registry[Callable[..., Any]] = Registry("world model")
