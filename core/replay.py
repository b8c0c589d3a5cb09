"""Where a run's real executions live in its store, and how to read them back as trajectories or play them again.

Every real episode the trainer pays for is stored under a key that says where
in the run it happened: `s{step}g{group}m{member}` for training groups and
`eval/{step}/{split}/{task}/{sample}` for held-out evaluation during training
(`eval-{tag}/...` for a later `wmrl eval`, kept apart from the run's own). The same records
later warm-start a world model in another run and are the ground truth a world
model's fidelity is measured against (`wmrl eval-wm`), so the key format is
defined here once and parsed back here.

A resumed run re-plays the steps after its checkpoint. `StoredReplay` is the
real environment for such a step: episodes already stored are played back from
their records, the others run for real. The policy acts on the whole batch as it
did before the crash, so it draws the same random numbers and the step comes out
the same, whichever of its executions had finished.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from wmrl.core.archive import load_trajectories
from wmrl.core.interfaces import RealEnv, gather_steps
from wmrl.core.store import RunStore
from wmrl.core.types import Task, Trajectory, Transition

log = logging.getLogger(__name__)

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


class StoredReplay(RealEnv):
    """`env` for a batch some of whose episodes (`stored`: batch index -> trajectory) were already executed.

    Stored episodes get their recorded observations and transitions back, whatever
    the policy acts; the rest go to `env`, which sees only them. Their outputs are
    the caller's to keep or ignore: the stored records stay the truth.
    """

    def __init__(self, env: RealEnv, stored: Mapping[int, Trajectory]):
        self.env, self.stored = env, dict(stored)
        self.capacity = env.capacity
        self._fresh: list[int] = []
        self._turn = 0
        self._warned = False

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        if any(t.turns == 0 for t in self.stored.values()):
            # a reset that failed fails a whole batch: the first run drew nothing for it either
            raise RuntimeError("stored episodes of this batch never started (their reset failed)")
        self._fresh = [i for i in range(len(tasks)) if i not in self.stored]
        self._turn = 0
        obs: list[Any] = [None] * len(tasks)
        for i, first in zip(self._fresh, self.env.reset([tasks[i] for i in self._fresh]) if self._fresh else []):
            obs[i] = first
        for i, traj in self.stored.items():
            obs[i] = traj.observations[0] if traj.observations else None
        return obs

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        return gather_steps(self.step_each(actions), len(actions))

    def step_each(self, actions: Sequence[Any | None]) -> Iterator[list[tuple[int, Transition]]]:
        t, self._turn = self._turn, self._turn + 1
        played = [(i, self._played(traj, t, actions[i])) for i, traj in self.stored.items()
                  if actions[i] is not None and t < traj.turns]
        if played:
            yield played
        if any(actions[i] is not None for i in self._fresh):
            for arrived in self.env.step_each([actions[i] for i in self._fresh]):
                yield [(self._fresh[j], tr) for j, tr in arrived]

    def _played(self, traj: Trajectory, t: int, action: Any) -> Transition:
        if not self._warned and not _same(action, traj.actions[t]):
            self._warned = True
            log.warning("resume: the policy did not reproduce a stored execution's action (a policy not "
                        "deterministic given its generator, or an archive that does not return observations "
                        "exactly); the stored execution is kept, but this step may differ from the first run's")
        nxt = traj.observations[t + 1] if t + 1 < len(traj.observations) else None
        return Transition(nxt, traj.step_rewards[t], t == traj.turns - 1, reward_var=traj.step_reward_vars[t],
                          info=traj.infos[t])

    def close(self) -> None:
        """The wrapped environment belongs to the caller."""


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b))) if isinstance(a, np.ndarray) else bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable actions are not evidence of a difference
        return True
