"""The `world_model:` section: which world model a run uses, typed like a policy config in LeRobot.

`world_model.type` selects a registered world model; its own dataclass, a
subclass of `WorldModelConfig`, types the rest of the section, so a world
model's knobs are checked like every other key instead of living on the
domain's config. Every registered world model names the domains it serves
(`WorldModelSpec.domains`; a subclass of a named domain is served too), so a
config that pairs a domain with a world model made for another is refused when
it is loaded, with the list of what fits.
How the trainer runs the model (deadline, background fitting, warm start) is
the same for every type: `world_model.runtime` (`wm_runtime.RuntimeConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, is_dataclass
from typing import Any, Callable

from wmrl.core.registry import DOMAINS, WORLD_MODELS
from wmrl.core.wm_runtime import RuntimeConfig


@dataclass
class WorldModelConfig:
    """Base of every world model's config: its registered name and how the trainer runs it."""

    type: str = ""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)


@dataclass(frozen=True)
class WorldModelSpec:
    #: builds the model: (domain, its config) -> WorldModel
    factory: Callable[[Any, Any], Any]
    config_class: type
    #: names of the domains whose tasks, actions and observations it understands
    domains: tuple[str, ...]

    def serves(self, domain: str) -> bool:
        """Whether it serves `domain`: one it names, or a subclass of one (which inherits its tasks)."""
        cls = DOMAINS.get(domain)
        return any(d in DOMAINS and issubclass(cls, DOMAINS.get(d)) for d in self.domains)


def register_world_model(name: str, *, domains: tuple[str, ...] | list[str], config: type = WorldModelConfig):
    """Decorator on a factory `(domain, cfg) -> WorldModel`: selectable as `world_model.type=name`
    for the listed domains, with `config` (a `WorldModelConfig` dataclass) typing its section."""
    if not (is_dataclass(config) and issubclass(config, WorldModelConfig)):
        raise TypeError(f"world model {name!r}: config must be a dataclass subclassing WorldModelConfig, got {config!r}")
    if isinstance(domains, str) or not domains:
        raise TypeError(f"world model {name!r}: domains must be a non-empty list of domain names, got {domains!r}")

    def deco(factory):
        WORLD_MODELS.register(name)(WorldModelSpec(factory, config, tuple(domains)))
        return factory

    return deco


def default_config(name: str) -> WorldModelConfig:
    """The config of the registered world model `name`, every key at its default."""
    return WORLD_MODELS.get(name).config_class(type=name)


def spec_of(cfg: WorldModelConfig) -> WorldModelSpec:
    """The registered world model `cfg` configures: by `cfg.type`, or, left empty, by its config class."""
    if cfg.type:
        return WORLD_MODELS.get(cfg.type)
    names = [n for n in WORLD_MODELS.names() if WORLD_MODELS.get(n).config_class is type(cfg)]
    if len(names) != 1:
        raise ValueError(f"set world_model.type: {type(cfg).__name__} configures {', '.join(names) or 'none'} "
                         "of the registered world models")
    return WORLD_MODELS.get(names[0])


def world_models_for(domain: str) -> list[str]:
    """Names of the registered world models that serve `domain`."""
    return [n for n in WORLD_MODELS.names() if WORLD_MODELS.get(n).serves(domain)]
