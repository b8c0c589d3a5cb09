"""A domain bundles what the trainer needs from one problem: tasks, a policy, the two scorers.

A new domain is a file of subclasses of the four interfaces plus a `Domain`
subclass registered by name (`@wmrl.register_domain("name")`) with its own typed
config dataclass; `docs/new_domain.md` walks through one. World models are
registered separately (`@wmrl.register_world_model("name")` on a factory taking
the domain), so one domain can offer several and a config picks one by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from wmrl.core.interfaces import Policy, RealEnv, WorldModel
from wmrl.core.registry import WORLD_MODELS
from wmrl.core.types import Task, Trajectory

#: task splits every domain provides: train, held-out in-distribution, held-out out-of-distribution
SPLITS = ("train", "test_id", "test_ood")


class Domain(ABC):
    #: the dataclass of this domain's `domain:` config section
    config_class: ClassVar[type]

    def __init__(self, cfg: Any):
        self.cfg = cfg

    #: the longest episode the trainer will roll out
    max_turns: int = 1
    #: the built-in world models of this domain (names in WORLD_MODELS); the config's
    #: `world_model` key picks one, or any factory a user registered for this domain
    world_models: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """The tasks of one of SPLITS."""

    @abstractmethod
    def make_policy(self, seed: int) -> Policy: ...

    @abstractmethod
    def make_real_env(self) -> RealEnv: ...

    def make_world_model(self) -> WorldModel:
        """The WM named by `domain.world_model`, built by its registered factory from this domain.

        A domain with a single, fixed world model may override this instead.
        """
        return WORLD_MODELS.get(self.cfg.world_model)(self)

    def oracle_reward(self, trajectory: Trajectory) -> float | None:
        """The true reward when it is free to compute (synthetic domains); None elsewhere.

        Logged as `reward_oracle` for diagnosis only; it never enters training.
        """
        return None
