"""Real VLA episodes archived as LeRobotDatasets: exact round trip, crash leftovers removed, one merged dataset.

Real lerobot datasets are written and read back; the trajectories are built here
(random frames of the simulator's shapes) so every field is known exactly. The
trainer-level path (real MuJoCo episodes, SIGKILL and resume) is in test_vla_train.py.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip("lerobot")

from wmrl.core.archive import ArchivedEpisode, load_trajectories, referenced  # noqa: E402
from wmrl.core.replay import read_trajectories  # noqa: E402
from wmrl.core.store import ExecutionRecord, RunStore  # noqa: E402
from wmrl.core.types import Outcome, Task, Trajectory  # noqa: E402
from wmrl.domains.vla.experience import DIRNAME, LeRobotArchive, merge_experience  # noqa: E402


def _trajectory(rng, i: int, turns: int, *, chunk: int = 8, unknown_last: bool = False) -> Trajectory:
    t = Trajectory(task=Task(f"lift-{i}", seed=i), source="real")
    for j in range(turns):
        t.observations.append({"image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
                               "state": rng.standard_normal(9).astype(np.float32),
                               "instruction": f"pick up the cube ({i % 2})"})
        t.actions.append(rng.uniform(-1, 1, (chunk, 7)).astype(np.float32))
        t.log_probs.append(float(rng.standard_normal()))
        last = j == turns - 1
        t.step_rewards.append(None if last and unknown_last else float(last and i % 2 == 0))
        t.step_reward_vars.append(None)
        t.infos.append({"status": "infra" if last and unknown_last else "ok", "steps": chunk * (j + 1)})
    t.real = Outcome(None, "infra") if unknown_last else Outcome(float(i % 2 == 0), "ok")
    return t


def _same(a: Trajectory, b: Trajectory) -> bool:
    obs = len(a.observations) == len(b.observations) and all(
        np.array_equal(x["image"], y["image"]) and y["image"].dtype == np.uint8
        and np.array_equal(x["state"], y["state"]) and y["state"].dtype == np.float32
        and x["instruction"] == y["instruction"] and set(x) == set(y)
        for x, y in zip(a.observations, b.observations))
    acts = len(a.actions) == len(b.actions) and all(np.array_equal(x, y) for x, y in zip(a.actions, b.actions))
    return (obs and acts and a.log_probs == b.log_probs and a.step_rewards == b.step_rewards and a.infos == b.infos
            and a.real == b.real and a.task == b.task and a.source == b.source)


def test_episodes_round_trip_exactly_and_the_store_keeps_only_references(tmp_path):
    rng = np.random.default_rng(0)
    batch = [_trajectory(rng, i, turns=3 + i) for i in range(4)]
    lost = _trajectory(rng, 9, turns=2, unknown_last=True)  # a failed simulator: no outcome, stays pickled
    never = Trajectory(task=Task("lift-10"), source="real", step_rewards=[None], infos=[{"status": "infra"}],
                       real=Outcome(None, "infra"))  # the reset failed: no turn at all
    trajs = [*batch[:2], lost, *batch[2:], never]
    payloads = LeRobotArchive(tmp_path, fps=2.5).write("s1g0m0", trajs)

    kinds = [type(pickle.loads(p)).__name__ for p in payloads]
    assert kinds == ["ArchivedEpisode"] * 2 + ["Trajectory"] + ["ArchivedEpisode"] * 2 + ["Trajectory"]
    archived = [p for p, k in zip(payloads, kinds) if k == "ArchivedEpisode"]
    # the store holds chunks and bookkeeping, not frames: 64x64x3 bytes per turn would be >= 12 kB each
    assert max(len(p) / t.turns for p, t in zip(archived, batch)) < 1_000
    assert referenced(payloads) == {f"{DIRNAME}/s1g0m0"}
    back = load_trajectories(payloads, tmp_path)
    assert all(_same(a, b) for a, b in zip(trajs, back))

    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("wmrl/s1g0m0", root=tmp_path / DIRNAME / "s1g0m0")
    assert ds.num_episodes == 4 and ds.num_frames == sum(t.turns for t in batch) and ds.fps == 2.5
    item = ds[batch[0].turns]  # the first frame of the second episode
    assert item["task"] == batch[1].observations[0]["instruction"]
    assert np.allclose(item["action"].numpy(), batch[1].actions[0].reshape(-1))
    assert float(item["log_prob"]) == pytest.approx(batch[1].log_probs[0])
    ends = [float(ds[sum(t.turns for t in batch[: k + 1]) - 1]["next.reward"]) for k in range(4)]
    assert ends == [t.step_rewards[-1] for t in batch]


def test_recover_removes_what_a_crash_left_and_keeps_what_the_store_refers_to(tmp_path):
    rng = np.random.default_rng(1)
    archive = LeRobotArchive(tmp_path, fps=2.5)
    kept = archive.write("s1g0m0", [_trajectory(rng, 0, 2)])
    archive.write("s2g0m0", [_trajectory(rng, 1, 2)])  # archived, then the run died before the store commit
    (tmp_path / DIRNAME / ".tmp-s3g0m0" / "meta").mkdir(parents=True)  # died inside a write
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the run's")
    (tmp_path / DIRNAME / "s4g0m0").symlink_to(outside)  # not the archive's own: removed, never followed
    removed = archive.recover(referenced(kept))
    assert removed == [f"{DIRNAME}/.tmp-s3g0m0", f"{DIRNAME}/s2g0m0", f"{DIRNAME}/s4g0m0"]
    assert (outside / "keep.txt").read_text() == "not the run's"
    assert sorted(p.name for p in (tmp_path / DIRNAME).iterdir()) == ["s1g0m0"]
    assert pickle.loads(kept[0]).skeleton.observations == []
    assert len(load_trajectories(kept, tmp_path)[0].observations) == 2  # its frames are still there
    archive.write("s2g0m0", [_trajectory(rng, 1, 2)])  # the re-executed batch takes the same name again
    with pytest.raises(FileExistsError, match="unique"):
        archive.write("s1g0m0", [_trajectory(rng, 2, 2)])


def test_a_missing_or_changed_experience_folder_is_a_clear_error(tmp_path):
    rng = np.random.default_rng(2)
    payloads = LeRobotArchive(tmp_path, fps=2.5).write("s1g0m0", [_trajectory(rng, 0, 3)])
    ep = pickle.loads(payloads[0])
    assert isinstance(ep, ArchivedEpisode)
    longer = pickle.dumps(ArchivedEpisode(ep.archive, ep.location, _trajectory(rng, 0, 5), ep.ref))
    with pytest.raises(ValueError, match="holds 3 frames .* 5 turns"):
        load_trajectories([longer], tmp_path)
    (tmp_path / DIRNAME / "s1g0m0" / "meta" / "info.json").unlink()
    with pytest.raises(FileNotFoundError, match="moved or deleted"):
        load_trajectories(payloads, tmp_path)


def test_a_store_reads_back_through_replay_and_the_batches_merge_into_one_dataset(tmp_path):
    rng = np.random.default_rng(3)
    archive = LeRobotArchive(tmp_path, fps=2.5)
    written = {}
    with RunStore(tmp_path / "store.sqlite") as store:
        for step in (1, 2):
            trajs = [_trajectory(rng, 10 * step + m, 2 + m) for m in range(2)]
            payloads = archive.write(f"s{step}g0m0", trajs)
            store.put_executions([ExecutionRecord(key=f"s{step}g0m{m}", run_id="run", step=step, task_id=t.task.id,
                                                  status=t.real.status, reward=t.real.reward, payload=p)
                                  for m, (t, p) in enumerate(zip(trajs, payloads))])
            written.update({f"s{step}g0m{m}": t for m, t in enumerate(trajs)})
    got = read_trajectories(tmp_path / "store.sqlite")
    assert [g.group for g in got] == ["s1g0", "s1g0", "s2g0", "s2g0"]
    assert all(_same(written[f"{g.group}m{m % 2}"], g.trajectory) for m, g in enumerate(got))

    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    out = merge_experience(tmp_path, tmp_path / "merged")
    merged = LeRobotDataset("wmrl/merged", root=out)
    assert merged.num_episodes == 4 and merged.num_frames == sum(t.turns for t in written.values())
    with pytest.raises(FileExistsError, match="new folder"):
        merge_experience(tmp_path, out)
    with pytest.raises(FileNotFoundError, match="no experience"):
        merge_experience(tmp_path / "elsewhere", tmp_path / "m2")
