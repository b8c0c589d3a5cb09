"""Where a run's real executions live in its store, and how to read them back as trajectories.

Every real episode the trainer pays for is stored under a key that says where
in the run it happened: `s{step}g{group}m{member}` for training groups and
`eval/{step}/{split}/{task}/{sample}` for held-out evaluation during training
(`eval-{tag}/...` for a later `wmrl eval`, kept apart from the run's own). The same records
later warm-start a world model in another run and are the ground truth a world
model's fidelity is measured against (`wmrl eval-wm`), so the key format is
defined here once and parsed back here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from wmrl.core.archive import load_trajectories
from wmrl.core.store import RunStore
from wmrl.core.types import Trajectory

_TRAIN_KEY = re.compile(r"^s(\d+)g(\d+)m(\d+)$")
EVAL_PREFIX = "eval/"


def group_id(step: int, group: int) -> str:
    return f"s{step}g{group}"


def train_key(group: str, member: int) -> str:
    return f"{group}m{member}"


def eval_key(step: int, split: str, task_id: str, sample: int, tag: str = "") -> str:
    """`tag` names an evaluation outside training (`wmrl eval`): its keys never meet the run's own."""
    return f"{EVAL_PREFIX if not tag else f'eval-{tag}/'}{step}/{split}/{task_id}/{sample}"


def batch_name(first_key: str) -> str:
    """A file-name-safe name for a batch of executions, from its first key (keys are unique in a run)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", first_key)


@dataclass
class StoredTrajectory:
    """A real trajectory read back from a store, with where it happened in its run."""

    step: int
    group: str  # trajectories of one group share it: GRPO's comparison set
    split: str  # "train" or the held-out split it was evaluated on
    trajectory: Trajectory


def read_trajectories(store: RunStore | str | Path, run_id: str | None = None, *,
                      include_eval: bool = False) -> list[StoredTrajectory]:
    """The real trajectories of a run (or of every run in the store) in the order they were executed.

    Records with an unknown grade (infrastructure failures) are skipped: they say
    nothing about the outcome. Evaluation episodes are grouped by (step, split, task).
    """
    own = not isinstance(store, RunStore)
    db = RunStore(store) if own else store
    try:
        records = db.executions(run_id)
    finally:
        if own:
            db.close()
    kept, where = [], []
    for rec in records:
        if rec.reward is None:
            continue
        m = _TRAIN_KEY.match(rec.key)
        if m:
            step, group, split = int(m[1]), group_id(int(m[1]), int(m[2])), "train"
        elif include_eval and rec.key.startswith(EVAL_PREFIX):
            _, step_s, split, rest = rec.key.split("/", 3)
            step, group = int(step_s), f"{EVAL_PREFIX}{step_s}/{split}/{rest.rsplit('/', 1)[0]}"
        else:
            continue
        kept.append(rec)
        where.append((step, group, split))
    trajs = load_trajectories([r.payload for r in kept], db.path.parent, names=[r.key for r in kept])
    return [StoredTrajectory(step, group, split, traj) for (step, group, split), traj in zip(where, trajs)]
