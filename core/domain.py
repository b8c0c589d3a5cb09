"""A domain bundles what the trainer needs from one problem: tasks, a policy, the two scorers.

A new domain is a file of subclasses of the four interfaces plus a `Domain`
subclass registered by name (`@wmrl.register_domain("name")`) with its own typed
config dataclass; `docs/new_domain.md` walks through one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from wmrl.core.interfaces import Policy, RealEnv, WorldModel
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

    @abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """The tasks of one of SPLITS."""

    @abstractmethod
    def make_policy(self, seed: int) -> Policy: ...

    @abstractmethod
    def make_real_env(self) -> RealEnv: ...

    @abstractmethod
    def make_world_model(self) -> WorldModel: ...

    def oracle_reward(self, trajectory: Trajectory) -> float | None:
        """The true reward when it is free to compute (synthetic domains); None elsewhere.

        Logged as `reward_oracle` for diagnosis only; it never enters training.
        """
        return None
