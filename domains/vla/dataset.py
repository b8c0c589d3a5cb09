"""Demonstrations as a LeRobotDataset (lerobot 0.4.4's own format), checked against what a policy needs.

Writing goes through `LeRobotDataset.create` / `add_frame` / `save_episode` /
`finalize`, so the result is an ordinary lerobot dataset any lerobot tool reads.
Images are stored as PNG images by default (lossless, no codec); `use_videos=True`
writes AV1 video as most Hub datasets are, decoded on read by torchcodec (lerobot's
default backend; it needs ffmpeg's shared libraries, which `make` installs).

Reading is offline only (a local root); before any data is loaded, the dataset's
features are checked against the policy's (`check_features`), because a wrong image
size or dtype otherwise surfaces as a shape error deep inside a conv layer.

Behaviour cloning of action chunks uses lerobot's `delta_timestamps`: with the
config's `action_delta_indices` (0..k-1), each item carries the next k actions and
`action_is_pad`, past the episode's end lerobot repeats the last action and marks
it padded, and the loss masks those steps. `chunk_samples` stacks every item in
memory once, since a demonstration set here is small and PNG decoding per epoch
would dominate training.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no Hub here: fail fast instead of retrying the network

from lerobot.configs.policies import PreTrainedConfig  # noqa: E402
from lerobot.configs.types import FeatureType  # noqa: E402
from lerobot.datasets.factory import resolve_delta_timestamps  # noqa: E402
from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata  # noqa: E402
from lerobot.utils.constants import HF_LEROBOT_HOME  # noqa: E402

log = logging.getLogger(__name__)

IMAGE_KEY = "observation.images.agentview"
STATE_KEY = "observation.state"
#: the camera encoder's output in place of the image: what an embodied world model's imagined observation holds
FEATURES_KEY = "observation.features"
ACTION_KEY = "action"
STATE_NAMES = ["eef_x", "eef_y", "eef_z", "eef_qx", "eef_qy", "eef_qz", "eef_qw", "gripper_l", "gripper_r"]
ACTION_NAMES = ["dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper"]


def features(image_size: int = 64, use_videos: bool = False) -> dict[str, dict]:
    """The contract's dataset features for an `image_size` x `image_size` RGB camera."""
    return {
        IMAGE_KEY: {"dtype": "video" if use_videos else "image", "shape": (image_size, image_size, 3),
                    "names": ["height", "width", "channels"]},
        STATE_KEY: {"dtype": "float32", "shape": (len(STATE_NAMES),), "names": list(STATE_NAMES)},
        ACTION_KEY: {"dtype": "float32", "shape": (len(ACTION_NAMES),), "names": list(ACTION_NAMES)},
    }


FEATURES = features()


def create_dataset(root: str | Path, repo_id: str, fps: int = 20, image_size: int = 64,
                   use_videos: bool = False) -> LeRobotDataset:
    """An empty dataset at `root` (which must not exist yet: lerobot refuses to overwrite)."""
    return LeRobotDataset.create(repo_id, fps, features(image_size, use_videos), root=root, use_videos=use_videos)


def record_episode(ds: LeRobotDataset, frames: Sequence[dict[str, Any]]) -> None:
    """Append one episode of `{"image", "state", "action", "instruction"}` frames and save it.

    Call `ds.finalize()` once after the last episode: lerobot writes the parquet
    footers there, and a dataset not finalized cannot be opened again.
    """
    if not frames:
        raise ValueError("record_episode got no frames; an episode needs at least one")
    for f in frames:
        ds.add_frame({
            IMAGE_KEY: np.asarray(f["image"], dtype=np.uint8),
            STATE_KEY: np.asarray(f["state"], dtype=np.float32),
            ACTION_KEY: np.asarray(f["action"], dtype=np.float32),
            "task": str(f["instruction"]),
        })
    ds.save_episode()


def expected_features(config: PreTrainedConfig) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """What a policy config needs from a dataset: key -> (accepted dtypes, dataset shape).

    Policy image features are channel-first (C, H, W); datasets store (H, W, C).
    """
    out: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}
    for key, ft in {**config.input_features, **config.output_features}.items():
        if ft.type is FeatureType.VISUAL:
            c, h, w = ft.shape
            out[key] = (("image", "video"), (h, w, c))
        else:
            out[key] = (("float32",), tuple(ft.shape))
    return out


def check_features(found: dict[str, dict], expected: dict[str, tuple[tuple[str, ...], tuple[int, ...]]],
                   where: str = "the dataset") -> None:
    """ValueError naming the first key that is missing or has the wrong dtype or shape."""
    for key, (dtypes, shape) in expected.items():
        if key not in found:
            raise ValueError(f"{where} has no feature {key!r} (it has {sorted(found)}); the policy needs it with "
                             f"dtype {dtypes[0]!r} and shape {shape}: record the demonstrations with "
                             "wmrl.domains.vla.dataset.create_dataset, or rename the feature")
        ft = found[key]
        if ft["dtype"] not in dtypes:
            raise ValueError(f"{where}'s feature {key!r} has dtype {ft['dtype']!r}, expected {' or '.join(dtypes)}; "
                             "re-record it with that dtype or convert the column")
        if tuple(ft["shape"]) != shape:
            raise ValueError(f"{where}'s feature {key!r} has shape {tuple(ft['shape'])}, expected {shape}; "
                             "re-record the demonstrations at that size, or build the policy for this one "
                             "(its input/output features come from the dataset with WmrlVLAConfig.from_dataset)")


def _local_root(root_or_repo_id: str | Path) -> Path:
    path = Path(root_or_repo_id)
    root = path if path.is_dir() else HF_LEROBOT_HOME / str(root_or_repo_id)
    if not (root / "meta" / "info.json").is_file():
        raise FileNotFoundError(f"no LeRobotDataset at {root} (no meta/info.json); datasets are read offline: "
                                "record one with create_dataset/record_episode, or download it there first")
    return root


def load_dataset(root_or_repo_id: str | Path, config: PreTrainedConfig | None = None, *,
                 episodes: list[int] | None = None) -> LeRobotDataset:
    """Open a local dataset, checked against `config`'s features (the contract's if None).

    With a config, items carry the action chunk its `action_delta_indices` ask for
    (lerobot's `resolve_delta_timestamps`) and `action_is_pad`.
    """
    root = _local_root(root_or_repo_id)
    repo_id = str(root_or_repo_id) if not Path(root_or_repo_id).is_dir() else f"local/{root.name}"
    meta = LeRobotDatasetMetadata(repo_id, root=root)
    if config is None:
        expected = {k: ((ft["dtype"], "video") if ft["dtype"] == "image" else (ft["dtype"],), tuple(ft["shape"]))
                    for k, ft in FEATURES.items()}
        delta = None
    else:
        expected = expected_features(config)
        delta = resolve_delta_timestamps(config, meta)
    check_features(meta.features, expected, where=f"the dataset at {root}")
    return LeRobotDataset(repo_id, root=root, episodes=episodes, delta_timestamps=delta)


def normalization_stats(meta: LeRobotDatasetMetadata, min_std: float = 1e-2) -> dict[str, list[float]]:
    """State and action mean/std from the dataset's `meta.stats`, the std floored at `min_std`.

    The floor keeps a dimension the demonstrations never vary (a rotation the
    scripted expert holds at zero) from dividing by ~0.
    """
    out: dict[str, list[float]] = {}
    for name, key in (("state", STATE_KEY), ("action", ACTION_KEY)):
        stats = meta.stats.get(key) if meta.stats else None
        if stats is None:
            raise ValueError(f"the dataset has no stats for {key!r}; it was not finalized by lerobot "
                             "(record it with record_episode and call ds.finalize())")
        out[f"{name}_mean"] = np.asarray(stats["mean"], dtype=np.float64).reshape(-1).tolist()
        out[f"{name}_std"] = np.maximum(np.asarray(stats["std"], dtype=np.float64).reshape(-1), min_std).tolist()
    return out


def chunk_samples(ds: LeRobotDataset, batch_size: int = 256) -> dict[str, Any]:
    """Every item of `ds` stacked: tensors for the features and `action_is_pad`, a list for `task`."""
    keep = [k for k in ds.features if k not in ("timestamp", "frame_index", "index", "task_index")]
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=0)
    parts: dict[str, list] = {}
    for batch in loader:
        for key in keep + ["task", f"{ACTION_KEY}_is_pad"]:
            if key in batch:
                parts.setdefault(key, []).append(batch[key])
    out: dict[str, Any] = {k: (sum(v, []) if k == "task" else torch.cat(v)) for k, v in parts.items()}
    log.info("loaded %d BC samples from %s", len(out["task"]), ds.root)
    return out


def take(samples: dict[str, Any], index: torch.Tensor | Sequence[int]) -> dict[str, Any]:
    """The rows `index` of `chunk_samples` output, as one batch."""
    idx = torch.as_tensor(index, dtype=torch.long)
    return {k: ([v[i] for i in idx.tolist()] if isinstance(v, list) else v[idx]) for k, v in samples.items()}
