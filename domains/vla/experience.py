"""A VLA run's real experience as LeRobotDatasets; the run store keeps keys, outcomes and references.

Every batch of real episodes the trainer stores (a step's anchor groups, one
split of an evaluation) becomes one LeRobotDataset under `RUN_DIR/experience/`,
written with lerobot's own API. A frame is a turn, one action chunk, so the
dataset's fps is control_freq / chunk: the camera image and proprioception the
policy saw (`observation.images.agentview`, `observation.state`), the chunk it
sent (`action`, k x 7 flattened step-major: lerobot's tools, aggregation among them,
expect 1-D features), `next.reward`, `next.done`, and the behaviour
log-probability of the chunk (`log_prob`); the instruction is the frame's task.
That is the data an embodied world model conditioned on action chunks fits on.
`merge_experience` aggregates the batches into one dataset (lerobot's
`aggregate_datasets`).

Why one dataset per batch: lerobot writes parquet files whose footer appears only
at `finalize()`, and rewrites `meta/info.json` in place, so a run appending to one
dataset could lose everything already in it to a crash mid-write. A batch is
instead written into `experience/.tmp-NAME`, finalized, fsynced and renamed into
place (atomic on one filesystem) before the store commits the records that point
at it; a crash leaves at most a temporary folder or an unreferenced dataset,
which `recover` removes at the next start (`core/archive.py`).

Episodes that cannot be frames (no turn at all, or a step with an unknown reward:
the simulator failed, so the grade is unknown) stay pickled in the store payload,
as every trajectory is by default; there are few and they carry no outcome.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from wmrl.core.archive import ArchivedEpisode, EpisodeArchive, skeleton
from wmrl.core.files import fsync_dir, fsync_tree
from wmrl.core.types import Trajectory
from wmrl.domains.vla.dataset import ACTION_KEY, ACTION_NAMES, IMAGE_KEY, STATE_KEY, STATE_NAMES

log = logging.getLogger(__name__)

DIRNAME = "experience"
REWARD_KEY, DONE_KEY, LOG_PROB_KEY = "next.reward", "next.done", "log_prob"
_OBS_KEYS = {"image", "state", "instruction"}


def _features(traj: Trajectory) -> dict[str, dict]:
    obs, action = traj.observations[0], np.asarray(traj.actions[0])
    h, w, c = np.asarray(obs["image"]).shape
    scalar = {"shape": (1,), "names": None}
    return {
        IMAGE_KEY: {"dtype": "image", "shape": (h, w, c), "names": ["height", "width", "channels"]},
        STATE_KEY: {"dtype": "float32", "shape": (len(obs["state"]),),
                    "names": list(STATE_NAMES) if len(obs["state"]) == len(STATE_NAMES) else None},
        ACTION_KEY: {"dtype": "float32", "shape": (action.size,),
                     "names": [f"t{t}_{n}" for t in range(len(action)) for n in ACTION_NAMES]
                     if action.ndim == 2 and action.shape[1] == len(ACTION_NAMES) else None},
        REWARD_KEY: {"dtype": "float32", **scalar},
        DONE_KEY: {"dtype": "bool", **scalar},
        LOG_PROB_KEY: {"dtype": "float32", **scalar},
    }


def _fits(traj: Trajectory, features: dict[str, dict]) -> bool:
    """Whether every turn of `traj` is a frame of these features (else it stays pickled)."""
    if not traj.observations or any(r is None for r in traj.step_rewards):
        return False
    for obs, action in zip(traj.observations, traj.actions):
        if not isinstance(obs, dict) or set(obs) != _OBS_KEYS:
            return False
        image, state = np.asarray(obs["image"]), np.asarray(obs["state"])
        if (image.dtype != np.uint8 or image.shape != features[IMAGE_KEY]["shape"]
                or state.dtype != np.float32 or state.shape != features[STATE_KEY]["shape"]):
            return False
        action = np.asarray(action)
        if action.dtype != np.float32 or action.ndim != 2 or action.shape[1] != len(ACTION_NAMES) \
                or (action.size,) != features[ACTION_KEY]["shape"]:
            return False
    return True


class LeRobotArchive(EpisodeArchive):
    """Writes each stored batch of real VLA episodes as a LeRobotDataset at `fps` frames (chunks) per second."""

    def __init__(self, root: str | Path, fps: float):
        super().__init__(root)
        if not fps > 0:
            raise ValueError(f"LeRobotArchive needs fps > 0 (control_freq / chunk), got {fps!r}")
        self.fps = fps
        self.dir = self.root / DIRNAME

    def write(self, name: str, trajectories: Sequence[Trajectory]) -> list[bytes]:
        first = next((t for t in trajectories if t.observations), None)
        features = _features(first) if first is not None else None
        framed = [features is not None and _fits(t, features) for t in trajectories]
        payloads = [b""] * len(trajectories)
        location = f"{DIRNAME}/{name}"
        if any(framed):
            self._write_dataset(name, [t for t, f in zip(trajectories, framed) if f], features)
        episode = 0
        for i, (traj, f) in enumerate(zip(trajectories, framed)):
            if f:
                payloads[i] = pickle.dumps(ArchivedEpisode(LeRobotArchive, location, skeleton(traj), {"episode": episode}))
                episode += 1
            else:
                payloads[i] = pickle.dumps(traj)
        return payloads

    def _write_dataset(self, name: str, trajs: Sequence[Trajectory], features: dict[str, dict]) -> None:
        import datasets
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        final, tmp = self.dir / name, self.dir / f".tmp-{name}"
        if final.exists():
            raise FileExistsError(f"{final} exists already: batch names must be unique in a run "
                                  "(an unreferenced one is removed by recover() at start)")
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        datasets.disable_progress_bars()  # one bar per episode otherwise, in the training log
        with warnings.catch_warnings():
            # lerobot's own conventions, which its dependencies warn about: bool stats, (1,)-shaped scalars
            warnings.filterwarnings("ignore", message="Converting input from bool", category=RuntimeWarning)
            warnings.filterwarnings("ignore", message="Conversion of an array with ndim > 0", category=DeprecationWarning)
            ds = LeRobotDataset.create(f"wmrl/{name}", self.fps, features, root=tmp, use_videos=False)
            for traj in trajs:
                last = len(traj.actions) - 1
                for t, (obs, action, reward) in enumerate(zip(traj.observations, traj.actions, traj.step_rewards)):
                    ds.add_frame({
                        IMAGE_KEY: np.asarray(obs["image"]),
                        STATE_KEY: np.asarray(obs["state"]),
                        ACTION_KEY: np.asarray(action).reshape(-1),
                        REWARD_KEY: np.array([reward], dtype=np.float32),
                        DONE_KEY: np.array([t == last]),
                        LOG_PROB_KEY: np.array([traj.log_probs[t]], dtype=np.float32),
                        "task": str(obs["instruction"]),
                    })
                ds.save_episode()
            ds.finalize()
        fsync_tree(tmp)
        os.rename(tmp, final)
        fsync_dir(self.dir)

    def recover(self, keep: set[str]) -> list[str]:
        removed = []
        if self.dir.is_dir():
            for path in sorted(self.dir.iterdir()):
                location = f"{DIRNAME}/{path.name}"
                if path.name.startswith(".tmp-") or location not in keep:
                    # a link or file is removed itself, never followed
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
                    removed.append(location)
        return removed

    @classmethod
    def restore(cls, root: Path, episodes: Sequence[ArchivedEpisode]) -> list[Trajectory]:
        by_location: dict[str, list[int]] = {}
        for i, e in enumerate(episodes):
            by_location.setdefault(e.location, []).append(i)
        out: list[Trajectory | None] = [None] * len(episodes)
        for location, idx in by_location.items():
            frames = _read_frames(root / location, [int(episodes[i].ref["episode"]) for i in idx])
            for i in idx:
                e = episodes[i]
                obs = frames.get(int(e.ref["episode"]), [])
                if len(obs) != e.skeleton.turns:
                    raise ValueError(f"{root / location} holds {len(obs)} frames for episode {e.ref['episode']}, "
                                     f"the store says {e.skeleton.turns} turns: the experience folder was changed "
                                     "after the run wrote it")
                traj = skeleton(e.skeleton)
                traj.observations = obs
                out[i] = traj
        return out  # type: ignore[return-value]


def _read_frames(path: Path, episodes: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Observations of `episodes` of the dataset at `path`, in frame order, exactly as recorded."""
    import pyarrow.parquet as pq
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
    from PIL import Image

    if not (path / "meta" / "info.json").is_file():
        raise FileNotFoundError(f"the run store refers to {path}, which holds no LeRobotDataset: "
                                "the run's experience folder was moved or deleted")
    meta = LeRobotDatasetMetadata(f"wmrl/{path.name}", root=path)
    tasks = {int(row.task_index): str(task) for task, row in meta.tasks.iterrows()}
    wanted = set(episodes)
    files = sorted({meta.get_data_file_path(ep) for ep in wanted})
    out: dict[int, list[tuple[int, dict]]] = {}
    for rel in files:
        cols = [IMAGE_KEY, STATE_KEY, "task_index", "episode_index", "frame_index"]
        for row in pq.read_table(path / rel, columns=cols).to_pylist():
            ep = int(row["episode_index"])
            if ep not in wanted:
                continue
            image = np.asarray(Image.open(io.BytesIO(row[IMAGE_KEY]["bytes"])).convert("RGB"), dtype=np.uint8)
            obs = {"image": image, "state": np.asarray(row[STATE_KEY], dtype=np.float32),
                   "instruction": tasks[int(row["task_index"])]}
            out.setdefault(ep, []).append((int(row["frame_index"]), obs))
    return {ep: [o for _, o in sorted(rows, key=lambda r: r[0])] for ep, rows in out.items()}


def experience_roots(run_dir: str | Path) -> list[Path]:
    """The run's experience datasets, by name (each is named for the first key of its batch)."""
    d = Path(run_dir) / DIRNAME
    return sorted(p for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else []


def merge_experience(run_dir: str | Path, out: str | Path) -> Path:
    """One LeRobotDataset at `out` with every episode of the run's experience (lerobot's aggregate_datasets)."""
    from lerobot.datasets.aggregate import aggregate_datasets

    roots = experience_roots(run_dir)
    if not roots:
        raise FileNotFoundError(f"{Path(run_dir) / DIRNAME} holds no experience datasets: was this run "
                                "trained with `wmrl train vla-rl` and did it store any real episode?")
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; give a new folder (lerobot does not merge into an existing dataset)")
    aggregate_datasets([f"wmrl/{p.name}" for p in roots], f"wmrl/{out.name}", roots=roots, aggr_root=out)
    return out
