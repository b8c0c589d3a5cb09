"""A domain bundles what the trainer needs from one problem: tasks, a policy, the real environment.

A new domain is a file of subclasses of the interfaces plus a `Domain` subclass
registered by name (`@wmrl.register_domain("name")`) with its own typed config
dataclass; `docs/new_domain.md` walks through one. World models are registered
separately (`@wmrl.register_world_model("name", domains=[...], config=...)` on
a factory taking the domain and the world model's config), each naming the
domains it serves, so one domain can have several and a config picks one with
`world_model.type`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Sequence

from pathlib import Path

from wmrl.core.archive import EpisodeArchive, PickleArchive
from wmrl.core.interfaces import Policy, RealEnv, WorldModel
from wmrl.core.types import SPLITS, Task, Trajectory
from wmrl.core.wm_spec import spec_of

__all__ = ["Domain", "SPLITS"]


class Domain(ABC):
    #: the dataclass of this domain's `domain:` config section
    config_class: ClassVar[type]
    #: the world model a config gets when it names none (`world_model.type`); None: the domain has none
    default_world_model: ClassVar[str | None] = None
    #: per `estimator.mode`, a world model that mode gets instead of `default_world_model` when none is named
    mode_world_models: ClassVar[dict[str, str]] = {}

    def __init__(self, cfg: Any):
        self.cfg = cfg

    #: the longest episode the trainer will roll out
    max_turns: int = 1

    @abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """The tasks of one of SPLITS."""

    @abstractmethod
    def make_policy(self, seed: int) -> Policy:
        """A fresh policy whose initial weights depend on `seed` alone (no process-wide RNG)."""

    @abstractmethod
    def make_real_env(self) -> RealEnv: ...

    def make_archive(self, run_dir: Path) -> EpisodeArchive:
        """Where real episodes' observations are kept (`core/archive.py`); by default pickled into the store."""
        return PickleArchive(run_dir)

    def make_world_model(self, cfg: Any) -> WorldModel:
        """The world model `cfg` configures, built by its registered factory from this domain and `cfg`."""
        return spec_of(cfg).factory(self, cfg)

    def episode_stats(self, trajectory: Trajectory) -> dict[str, float]:
        """Per-episode numbers worth a column in `wmrl eval`'s per-task table (e.g. a parse rate); none by default."""
        return {}

    def provenance(self) -> dict[str, str]:
        """What the config names without pinning it (a model built on first use, whose build changes with the
        code): a benchmark reuses a stored run only if this is unchanged too. None by default."""
        return {}

    def report(self, run_dir: Path, cfg: Any) -> list[str]:
        """Markdown lines (and figures written under `run_dir`) this domain adds to a finished run's report,
        given the run's config; none by default."""
        return []

    def prior_examples(self, n: int, seed: Sequence[int]) -> list[tuple[Any, Any]] | None:
        """`n` (observation, action) pairs drawn from the data the policy was fine-tuned on, deterministic in
        `seed`, for `trainer.objective.ptx`; None where the domain has none (the default)."""
        return None

    def oracle_reward(self, trajectory: Trajectory) -> float | None:
        """The true reward when it is free to compute (synthetic domains); None elsewhere.

        Logged as `reward_oracle` for diagnosis only; it never enters training.
        """
        return None
