"""Name -> entry registries, so a new domain, world model, estimator or benchmark is one decorator.

A `name`/`type` key in the config selects the entry; an unknown name is an error
that lists what is registered, which is what a user mistyping a name needs.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


class Registry(Generic[T]):
    def __init__(self, kind: str, identity: Callable[[T], Any] = lambda entry: entry):
        self.kind = kind
        self._identity = identity  # what makes two registrations the same definition
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            old = self._entries.get(name)
            if old is not None:
                was, new = self._identity(old), self._identity(obj)
                if was is not new and _qualname(was) != _qualname(new):
                    raise ValueError(f"{self.kind} {name!r} is already registered to {_qualname(was)}")
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
#: world models: name -> WorldModelSpec (factory, typed config, the domains it serves)
WORLD_MODELS: Registry[Any] = Registry("world model", identity=lambda spec: spec.factory)
#: benchmarks: name -> BenchmarkSpec (run function, typed options)
BENCHMARKS: Registry[Any] = Registry("benchmark", identity=lambda spec: spec.run)
