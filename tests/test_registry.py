"""Registries: unknown names list the known ones; a re-run definition replaces itself."""

import pytest

from wmrl.core.registry import Registry


def test_unknown_name_lists_registered_and_conflicts_are_errors():
    reg = Registry("widget")

    @reg.register("a")
    class A:
        pass

    assert reg.get("a") is A and "a" in reg
    with pytest.raises(KeyError, match="registered: a"):
        reg.get("b")

    class Other:
        pass

    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(Other)

    def redefine():  # the same class definition run again, e.g. a notebook cell
        class A:
            pass

        A.__qualname__ = "test_unknown_name_lists_registered_and_conflicts_are_errors.<locals>.A"
        return reg.register("a")(A)

    new = redefine()
    assert reg.get("a") is new and new is not A
