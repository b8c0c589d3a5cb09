"""Where the bulky part of a real episode lives, so the run store keeps keys, outcomes and references.

The run store (SQLite) is the durable ledger of real executions. Pickling a whole
trajectory into it is right for a code agent (a program and a few lines of
feedback) and wrong for a robot (a camera frame per action chunk): a domain with
large observations gives the trainer an `EpisodeArchive` that writes them in the
domain's own format next to the store (for VLA, a LeRobotDataset), and the store
payload becomes an `ArchivedEpisode`: the trajectory without its observations
plus where they are.

Write order is what makes this crash-safe: a batch is written to the archive
first, all of it or nothing (`write` publishes it atomically), then committed to
the store in one transaction. A crash between the two leaves archived data that
no stored record refers to; `recover` removes it at the next start, and those
episodes are executed again, as any batch the store did not commit is. Data the
store refers to is never touched.

Payloads decode without knowing which domain wrote them (`load_trajectories`): an
`ArchivedEpisode` names the archive class that reads it back (pickled by
reference, so unpickling imports the domain's module, as for any trajectory).
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Iterable, Sequence

from wmrl.core.types import Trajectory

__all__ = ["ArchivedEpisode", "EpisodeArchive", "PickleArchive", "load_trajectories", "referenced", "skeleton"]


@dataclass(frozen=True)
class ArchivedEpisode:
    """A store payload for an episode whose observations live in an archive under the run directory."""

    archive: type  # the EpisodeArchive subclass that wrote it and reads it back
    location: str  # where in the archive, relative to the run directory (e.g. a dataset folder)
    skeleton: Trajectory  # the trajectory with `observations` empty
    ref: dict[str, Any] = field(default_factory=dict)  # what the archive needs to find the episode there


class EpisodeArchive(ABC):
    """Writes batches of real episodes under `root` (the run directory) and reads them back."""

    #: whether it writes anything outside the store (then the trainer calls `recover` at start)
    writes_files: ClassVar[bool] = True

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @abstractmethod
    def write(self, name: str, trajectories: Sequence[Trajectory]) -> list[bytes]:
        """Archive one batch atomically under `name` (unique in the run); one store payload per trajectory."""

    @classmethod
    @abstractmethod
    def restore(cls, root: Path, episodes: Sequence[ArchivedEpisode]) -> list[Trajectory]:
        """The trajectories, observations filled back in, in the order given (a class method: reading
        needs only the run directory, not how the archive was configured to write)."""

    def recover(self, keep: set[str]) -> list[str]:
        """Remove what a crash left behind: archived data whose location is not in `keep`; what was removed."""
        return []


class PickleArchive(EpisodeArchive):
    """The default: the whole trajectory pickled into the store payload; nothing outside the store."""

    writes_files = False

    def write(self, name: str, trajectories: Sequence[Trajectory]) -> list[bytes]:
        return [pickle.dumps(t) for t in trajectories]

    @classmethod
    def restore(cls, root: Path, episodes: Sequence[ArchivedEpisode]) -> list[Trajectory]:
        raise TypeError("the pickle archive never writes ArchivedEpisode payloads")


def _decode(payload: bytes, where: str) -> Trajectory | ArchivedEpisode:
    obj = pickle.loads(payload)
    if not isinstance(obj, (Trajectory, ArchivedEpisode)):
        raise ValueError(f"store record {where} holds a {type(obj).__name__}, not a trajectory; "
                         "is this a wmrl run store?")
    return obj


def load_trajectories(payloads: Sequence[bytes], root: str | Path, *, names: Sequence[str] | None = None) -> list[Trajectory]:
    """Store payloads back as full trajectories; archived ones are read from their archive under `root`.

    `names` (the records' keys) only make errors say which record was bad.
    """
    names = list(names) if names is not None else [f"#{i}" for i in range(len(payloads))]
    decoded = [_decode(p, n) for p, n in zip(payloads, names)]
    out: list[Trajectory | None] = [d if isinstance(d, Trajectory) else None for d in decoded]
    by_archive: dict[type, list[int]] = {}
    for i, d in enumerate(decoded):
        if isinstance(d, ArchivedEpisode):
            by_archive.setdefault(d.archive, []).append(i)
    for archive, idx in by_archive.items():
        restored = archive.restore(Path(root), [decoded[i] for i in idx])
        for i, traj in zip(idx, restored):
            out[i] = traj
    return out  # type: ignore[return-value]


def referenced(payloads: Iterable[bytes]) -> set[str]:
    """The archive locations stored payloads refer to (what `recover` must keep)."""
    return {d.location for d in (pickle.loads(p) for p in payloads) if isinstance(d, ArchivedEpisode)}


def skeleton(traj: Trajectory) -> Trajectory:
    """The trajectory without its observations (what an `ArchivedEpisode` keeps in the store)."""
    return replace(traj, observations=[])
