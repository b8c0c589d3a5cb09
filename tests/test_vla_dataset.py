"""Demonstrations written as real lerobot 0.4.4 datasets and read back, and the feature checks on load."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from lerobot.datasets.lerobot_dataset import LeRobotDataset
from wmrl.domains.vla.dataset import (FEATURES, IMAGE_KEY, STATE_KEY, chunk_samples, create_dataset, load_dataset,
                                      normalization_stats, record_episode)
from wmrl.domains.vla.policy.configuration_wmrl_vla import WmrlVLAConfig

INSTRUCTIONS = ["lift the red cube", "push the blue block left", "open the drawer"]


def episode(rng: np.random.Generator, n: int, instruction: str, size: int = 64) -> list[dict]:
    return [{"image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
             "state": rng.normal(size=9).astype(np.float32),
             "action": rng.uniform(-1, 1, 7).astype(np.float32),
             "instruction": instruction} for _ in range(n)]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("demos") / "ds"
    ds = create_dataset(root, "local/demos")
    episodes = [episode(rng, n, INSTRUCTIONS[i]) for i, n in enumerate([5, 9, 4])]
    for frames in episodes:
        record_episode(ds, frames)
    ds.finalize()
    return root, episodes


def test_round_trip_preserves_every_frame_and_episode_boundary(recorded):
    root, episodes = recorded
    ds = load_dataset(root)
    assert ds.num_episodes == 3 and len(ds) == sum(len(e) for e in episodes)
    assert ds.meta.features[IMAGE_KEY]["dtype"] == "image"  # images by default, no video codec needed
    i = 0
    for ep, frames in enumerate(episodes):
        assert ds.meta.episodes[ep]["dataset_from_index"] == i
        assert ds.meta.episodes[ep]["dataset_to_index"] == i + len(frames)
        for t, frame in enumerate(frames):
            item = ds[i]
            image = (item[IMAGE_KEY].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
            np.testing.assert_array_equal(image, frame["image"])
            np.testing.assert_array_equal(item[STATE_KEY].numpy(), frame["state"])
            np.testing.assert_array_equal(item["action"].numpy(), frame["action"])
            assert item["task"] == frame["instruction"]
            assert (item["episode_index"].item(), item["frame_index"].item()) == (ep, t)
            i += 1


def test_chunks_come_from_the_same_episode_and_are_padded_with_its_last_action(recorded):
    root, episodes = recorded
    cfg = WmrlVLAConfig(chunk_size=4, n_action_steps=4, device="cpu")
    samples = chunk_samples(load_dataset(root, cfg))
    first = np.stack([f["action"] for f in episodes[0]])  # 5 frames: frame 3 sees 2 real actions, then padding
    np.testing.assert_array_equal(samples["action"][3].numpy(), np.stack([first[3], first[4], first[4], first[4]]))
    assert samples["action_is_pad"][3].tolist() == [False, False, True, True]
    assert samples["action_is_pad"][0].tolist() == [False] * 4
    second = np.stack([f["action"] for f in episodes[1]])
    np.testing.assert_array_equal(samples["action"][5].numpy(), second[:4])  # episode 1 starts at index 5
    assert samples["task"][5] == INSTRUCTIONS[1]


def test_normalization_stats_are_the_recorded_mean_and_std(recorded):
    root, episodes = recorded
    stats = normalization_stats(load_dataset(root).meta)
    actions = np.stack([f["action"] for frames in episodes for f in frames])
    np.testing.assert_allclose(stats["action_mean"], actions.mean(0), atol=1e-5)
    np.testing.assert_allclose(stats["action_std"], actions.std(0), atol=1e-5)
    assert len(stats["state_mean"]) == 9


def write(root, feats, frame):
    ds = LeRobotDataset.create("local/odd", 20, feats, root=root, use_videos=False)
    for _ in range(2):
        ds.add_frame(dict(frame, task="lift the cube"))
    ds.save_episode()
    ds.finalize()


def test_a_missing_feature_is_named(tmp_path):
    feats = {k: v for k, v in FEATURES.items() if k != STATE_KEY}
    write(tmp_path / "ds", feats, {IMAGE_KEY: np.zeros((64, 64, 3), np.uint8), "action": np.zeros(7, np.float32)})
    with pytest.raises(ValueError, match=r"no feature 'observation.state'.*shape \(9,\)"):
        load_dataset(tmp_path / "ds")


def test_a_wrong_image_size_is_named_with_found_and_expected(tmp_path):
    ds = create_dataset(tmp_path / "ds", "local/big", image_size=84)
    record_episode(ds, episode(np.random.default_rng(1), 2, "lift the cube", size=84))
    ds.finalize()
    with pytest.raises(ValueError, match=r"'observation.images.agentview' has shape \(84, 84, 3\), "
                                         r"expected \(64, 64, 3\)"):
        load_dataset(tmp_path / "ds", WmrlVLAConfig(device="cpu"))


def test_a_wrong_dtype_is_named(tmp_path):
    feats = dict(FEATURES, **{STATE_KEY: dict(FEATURES[STATE_KEY], dtype="float64")})
    write(tmp_path / "ds", feats, {IMAGE_KEY: np.zeros((64, 64, 3), np.uint8), STATE_KEY: np.zeros(9, np.float64),
                                   "action": np.zeros(7, np.float32)})
    with pytest.raises(ValueError, match=r"'observation.state' has dtype 'float64', expected float32"):
        load_dataset(tmp_path / "ds")


def test_a_dataset_that_is_not_there_is_not_fetched(tmp_path):
    with pytest.raises(FileNotFoundError, match="no LeRobotDataset"):
        load_dataset(tmp_path / "nothing-here")


def test_a_video_dataset_is_written_and_decoded_as_hub_datasets_are(tmp_path):
    # most Hub datasets store cameras as AV1 video: lossy, so frames come back close, not equal
    yy, xx = np.mgrid[0:64, 0:64]
    frames = [{"image": np.stack([(xx * 3 + 4 * t) % 256, (yy * 3) % 256, np.full((64, 64), 40 + 8 * t)], -1)
               .astype(np.uint8), "state": np.full(9, t, np.float32), "action": np.full(7, t / 10, np.float32),
               "instruction": "lift the cube"} for t in range(12)]
    ds = create_dataset(tmp_path / "vid", "local/vid", use_videos=True)
    record_episode(ds, frames)
    ds.finalize()
    assert list((tmp_path / "vid" / "videos").rglob("*.mp4"))
    cfg = WmrlVLAConfig(chunk_size=4, n_action_steps=4, device="cpu")
    loaded = load_dataset(tmp_path / "vid", cfg)
    assert loaded.meta.features[IMAGE_KEY]["dtype"] == "video"
    samples = chunk_samples(loaded)
    images = (samples[IMAGE_KEY].permute(0, 2, 3, 1) * 255).numpy()
    err = np.abs(images - np.stack([f["image"] for f in frames]).astype(np.float32))
    print(f"\nAV1 round trip: mean abs error {err.mean():.2f}, p99 {np.percentile(err, 99):.1f} (of 255)")
    assert images.shape == (12, 64, 64, 3) and err.mean() < 4 and np.percentile(err, 99) < 16
    np.testing.assert_array_equal(samples[STATE_KEY][:, 0].numpy(), np.arange(12, dtype=np.float32))
    np.testing.assert_allclose(samples["action"][10].numpy(), [[1.0] * 7, [1.1] * 7, [1.1] * 7, [1.1] * 7], atol=1e-6)
