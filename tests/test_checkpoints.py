"""Checkpoints are verified before they are loaded; a damaged one falls back to the one before it."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from wmrl.core.engine import Engine, EngineConfig
from wmrl.core.errors import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _engine() -> Engine:
    torch.manual_seed(0)
    return Engine(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)), EngineConfig())


def _train_and_save(engine: Engine, directory, tags, keep=0) -> dict:
    saved = {}
    for i, tag in enumerate(tags):
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(i))
        engine.step(engine.module(x).pow(2).mean())
        engine.save(directory, tag, {"tag": tag}, keep=keep)
        saved[tag] = [p.detach().clone() for p in engine.module.parameters()]
    return saved


def _weights_file(folder):
    return max((p for p in folder.rglob("*.pt")), key=lambda p: p.stat().st_size)


def _damage(folder, how):
    f = _weights_file(folder)
    data = f.read_bytes()
    if how == "truncated":
        f.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        f.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif how == "missing":
        f.unlink()
    elif how == "manifest":
        (folder / "manifest.json").write_text("{not json")


@pytest.mark.parametrize("how", ["truncated", "flipped", "missing", "manifest"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_good_one(tmp_path, how, caplog):
    saved = _train_and_save(_engine(), tmp_path, ["step000001", "step000002", "step000003"])
    _damage(tmp_path / "step000003", how)
    fresh = _engine()
    with caplog.at_level(logging.WARNING, logger="wmrl"):
        assert fresh.load(tmp_path) == {"tag": "step000002"}
    assert all(torch.equal(a, b) for a, b in zip(fresh.module.parameters(), saved["step000002"]))
    assert "step000003 is damaged" in caplog.text
    assert "resumed from checkpoint step000002 instead of step000003" in caplog.text
    with pytest.raises(CheckpointError, match="step000003 is damaged"):  # asked for by name: no fallback
        fresh.load(tmp_path, "step000003")


def test_a_checkpoint_deepspeed_cannot_read_is_damaged_too(tmp_path, caplog):
    """A checkpoint written before manifests existed is trusted until DeepSpeed fails on it."""
    _train_and_save(_engine(), tmp_path, ["step000001", "step000002"])
    (tmp_path / "step000002" / "manifest.json").unlink()
    _damage(tmp_path / "step000002", "truncated")
    with caplog.at_level(logging.WARNING, logger="wmrl"):
        assert _engine().load(tmp_path) == {"tag": "step000001"}
    assert "DeepSpeed cannot load it" in caplog.text


def test_every_checkpoint_damaged_is_one_clear_error(tmp_path):
    _train_and_save(_engine(), tmp_path, ["step000001", "step000002"])
    for tag in ("step000001", "step000002"):
        _damage(tmp_path / tag, "flipped")
    with pytest.raises(CheckpointError, match=r"every checkpoint in .* is damaged \(step000002, step000001\); "
                                              r"move the folder aside to train again from step 0"):
        _engine().load(tmp_path)


def test_only_the_newest_checkpoints_are_kept_and_each_has_a_manifest(tmp_path):
    _train_and_save(_engine(), tmp_path, [f"step{i:06d}" for i in range(1, 6)], keep=2)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "latest", "step000004", "step000005"]
    manifest = json.loads((tmp_path / "step000005" / "manifest.json").read_text())["files"]
    assert manifest and all(size > 0 and len(digest) == 64 for size, digest in manifest.values())
    (tmp_path / "step000005").rename(tmp_path / "gone")  # latest names a folder that is not there: the newest other
    assert Engine.latest_tag(tmp_path) == "step000004"
