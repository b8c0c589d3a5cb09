"""`wmrl train vla-rl`: GRPO in the simulator and WMRL with the embodied world model, from a saved VLA policy,
durable across a SIGKILL.

Real episodes land in LeRobotDatasets under RUN_DIR/experience, the store keeping references.

Real MuJoCo episodes and a real lerobot-layout policy, nothing mocked. The policy
is behaviour-cloned for a few seconds on a LeRobotDataset of four scripted lift demos
(`vla_bc` in conftest.py): enough that sampled chunks sometimes lift the cube on those
training scenes, so GRPO groups see both grades (an untrained policy never succeeds,
and a sparse reward then gives all-zero advantages and no gradient).
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import signal  # noqa: E402
import sqlite3  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("robosuite")
pytest.importorskip("lerobot")

import torch  # noqa: E402

from wmrl.api import build_trainer  # noqa: E402
from wmrl.config import ConfigError, load_config, to_yaml  # noqa: E402
from wmrl.core.archive import referenced  # noqa: E402
from wmrl.core.metrics import read_jsonl  # noqa: E402
from wmrl.core.replay import read_trajectories  # noqa: E402
from wmrl.core.store import RunStore  # noqa: E402

STEPS, GROUPS, G = 3, 2, 4  # groups of 4: on a borderline scene some group then sees both grades
NAMES: list[str] = []  # the policy's parameter names, in order (filled by the first run)


@pytest.fixture(scope="module")
def policy_dir(vla_bc):
    return vla_bc / "policy"


def _overrides(policy, run_dir, mode="real"):
    """`mode` wmrl: one of the two groups of a step is an anchor (anchors.fraction=0.5), the other imagined."""
    return [f"run_dir={run_dir}", f"domain.policy={policy}", "domain.families=[lift]", "domain.n_train=2",
            "domain.n_test_id=1", "domain.n_test_ood=1", "domain.env.horizon_steps.lift=56", f"estimator.mode={mode}",
            f"trainer.steps={STEPS}", f"trainer.groups_per_step={GROUPS}", f"trainer.group_size={G}",
            "trainer.eval_every=0", "trainer.eval_samples=1", "trainer.checkpoint_every=1", "tensorboard=false",
            "engine.lr=1e-2", "anchors.fraction=0.5", f"world_model.demos={policy.parent / 'demos'}"]


def _keys(db):
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as c:
        return [r[0] for r in c.execute("SELECT key FROM executions ORDER BY rowid")]


def _grades(db):
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as c:
        return dict(c.execute("SELECT key, reward FROM executions").fetchall())


def _experience(run_dir):
    """The experience datasets on disk, as the store names them (temporary folders included)."""
    return {f"experience/{p.name}" for p in (run_dir / "experience").iterdir()}


def _train_keys(keys):
    return {k for k in keys if not k.startswith("eval/")}


def _straight(policy_dir, run_dir, mode):
    cfg = load_config("vla-rl", _overrides(policy_dir, run_dir, mode))
    (run_dir / "config.yaml").write_text(to_yaml(cfg))  # what `wmrl train` saves: `export` reads it
    trainer = build_trainer(cfg)
    names = [n for n, _ in trainer.policy.module.named_parameters()]
    NAMES[:] = NAMES or names
    assert names == NAMES
    before = [p.detach().clone() for p in trainer.policy.module.parameters()]
    try:
        trainer.train()
        after = [p.detach().clone() for p in trainer.policy.module.parameters()]
        records = trainer.store.executions()
    finally:
        trainer.close()
    return run_dir, before, after, records


@pytest.fixture(scope="module")
def straight(policy_dir, tmp_path_factory):
    """An uninterrupted GRPO run: the reference for the kill test, and the training check itself."""
    return _straight(policy_dir, tmp_path_factory.mktemp("vla-straight"), "real")


@pytest.fixture(scope="module")
def straight_wmrl(policy_dir, tmp_path_factory):
    """An uninterrupted WMRL run with the embodied world model."""
    return _straight(policy_dir, tmp_path_factory.mktemp("vla-straight-wmrl"), "wmrl")


def test_real_grpo_trains_and_stores_every_real_episode(straight):
    run_dir, before, after, records = straight
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["real_executions"] == GROUPS * G and r["trained_trajectories"] == GROUPS * G for r in rows)
    train = [r for r in records if not r.key.startswith("eval/")]
    assert sorted(r.key for r in train) == sorted(f"s{s}g{g}m{m}" for s in range(1, STEPS + 1)
                                                  for g in range(GROUPS) for m in range(G))
    assert all(r.status in ("ok", "truncated") and r.reward in (0.0, 1.0) for r in records)
    assert {r.key for r in records if r.key.startswith("eval/")} >= {"eval/0/test_id/test_id-lift-0/0",
                                                                     f"eval/{STEPS}/test_ood/test_ood-lift-0/0"}
    # GRPO moves the weights exactly when some group's members were graded differently: with a sparse
    # success reward, a group that all failed has zero advantages and contributes no gradient
    mixed = any(len({r.reward for r in train if r.key.startswith(f"s{s}g{g}m")}) > 1
                for s in range(1, STEPS + 1) for g in range(GROUPS))
    moved = any(not torch.equal(a, b) for a, b in zip(before, after))
    turns = sum(r.info["turns"] for r in records)
    # the frames are in the run's LeRobotDatasets, the store holds references (a frame alone is 12 kB)
    assert sum(len(r.payload) for r in records) / turns < 1_000
    assert _experience(run_dir) == referenced(r.payload for r in records)
    back = read_trajectories(run_dir / "store.sqlite")
    assert len(back) == len(train) and all(
        len(b.trajectory.observations) == b.trajectory.turns and b.trajectory.observations[0]["image"].shape == (64, 64, 3)
        for b in back)
    print(f"\nstore: {len(records)} real episodes, {sum(len(r.payload) for r in records) / len(records) / 1e3:.1f} kB "
          f"per episode, {sum(len(r.payload) for r in records) / turns / 1e3:.1f} kB per turn; "
          f"{(run_dir / 'store.sqlite').stat().st_size / 1e3:.0f} kB file; successes "
          f"{sum(r.reward == 1.0 for r in train)}/{len(train)}")
    assert mixed and moved
    assert any(r.reward == 1.0 for r in train)


@pytest.mark.parametrize("mode", ["real", "wmrl"])
def test_killed_run_resumes_with_the_same_store_as_an_uninterrupted_one(mode, policy_dir, request, tmp_path):
    ref_dir = request.getfixturevalue("straight" if mode == "real" else "straight_wmrl")[0]
    run_dir = tmp_path / "killed"
    cmd = [sys.executable, "-m", "wmrl.cli", "train", "vla-rl", *_overrides(policy_dir, run_dir, mode),
           "--no-progress", "--no-report"]
    dist_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    env = {**{k: v for k, v in os.environ.items() if k not in dist_vars}, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # kill inside step 2's real batch: step 1 is logged and checkpointed, step 2's batch is not stored yet
    deadline = time.time() + 120
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
        if rows and (run_dir / "checkpoints" / "step000001").is_dir():
            break
        time.sleep(0.02)
    time.sleep(0.5)  # a batch of 7-turn episodes takes 2-3 s
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_keys = _keys(run_dir / "store.sqlite")
    assert any(k.startswith("s1g") for k in killed_keys) and not any(k.startswith("s3g") for k in killed_keys)

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    keys = _keys(run_dir / "store.sqlite")
    assert not [k for k, n in Counter(keys).items() if n > 1]  # nothing stored twice
    assert set(killed_keys) <= set(keys)  # nothing the killed run stored is lost
    ref = _keys(ref_dir / "store.sqlite")
    assert _train_keys(keys) == _train_keys(ref) and set(keys) == set(ref)
    assert _grades(run_dir / "store.sqlite") == _grades(ref_dir / "store.sqlite")  # the same episodes, replayed exactly
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # the batch the kill cut off was archived again under its own name; nothing unreferenced is left
    with RunStore(run_dir / "store.sqlite") as store:
        assert _experience(run_dir) == referenced(r.payload for r in store.executions()) == _experience(ref_dir)
    print(f"\nkill test: killed run stored {len(killed_keys)} episodes ({sorted(killed_keys)}); resumed run executed "
          f"{len(set(keys) - set(killed_keys))} more; total {len(keys)} = uninterrupted {len(ref)}")


def test_the_trained_policy_exports_as_a_lerobot_policy_folder(straight, tmp_path):
    from wmrl.api import export
    from wmrl.domains.vla.policy.modeling_wmrl_vla import WmrlVLAPolicy

    run_dir, before, after, _ = straight
    loaded = WmrlVLAPolicy.from_pretrained(str(export(run_dir, tmp_path / "exported")))
    got = [p.detach() for p in loaded.parameters()]
    assert len(got) == len(after) and all(torch.equal(a, b) for a, b in zip(after, got))  # the last checkpoint


def test_wmrl_runs_anchors_in_the_simulator_and_every_other_group_in_the_world_model(straight_wmrl):
    run_dir, before, after, records = straight_wmrl
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # one anchor group of G per step in the simulator, the other group imagined; both trained on
    assert all(r["real_executions"] == G and r["anchor_fraction"] == 0.5 for r in rows)
    assert all(r["trained_trajectories"] == GROUPS * G for r in rows)
    train = [r for r in records if not r.key.startswith("eval/")]
    # exactly the anchors are stored, each once, as the core draws and stores them for every domain
    assert len(train) == STEPS * G and len({r.key for r in train}) == len(train)
    assert all(r.status in ("ok", "truncated") and r.reward in (0.0, 1.0) for r in train)
    assert all(r["unknown_wm"] == 0 for r in rows)
    # the camera encoder is frozen (the world model imagines in its feature space); the rest moved
    moved = {n for n, a, b in zip(NAMES, before, after) if not torch.equal(a, b)}
    assert moved and not [n for n in moved if n.startswith("model.vision.")]


def test_eval_wm_and_the_report_show_the_embodied_world_model_against_the_simulator(straight_wmrl):
    from wmrl.report import write_report
    from wmrl.wm_eval import evaluate_world_model

    run_dir = straight_wmrl[0]
    result = evaluate_world_model(run_dir, warmup=0)
    assert result["world_model"] == "embodied" and result["stream"]["n"] == STEPS * G
    # open-loop error of the imagined observations on the held-out episodes, per turn after the first
    errors = result["open_loop_error"]
    assert set(errors) == {"test_id", "test_ood"} and all(
        len(e) >= 1 and all(x >= 0 for x in e) for e in errors.values())
    for section in ("stream", "test_id"):
        assert "success_auc" in result[section] and result[section]["coverage"]
    text = write_report(run_dir).read_text()
    assert "## Imagined vs real: the last anchor group" in text and (run_dir / "imagined_vs_real.png").stat().st_size


def test_a_moving_camera_encoder_is_refused_for_the_embodied_world_model(policy_dir, tmp_path):
    from wmrl.api import build_trainer as build

    cfg = load_config("vla-rl", [*_overrides(policy_dir, tmp_path / "run", "wmrl"), "domain.vision_lr_scale=0.5"])
    with pytest.raises(ValueError, match="domain.vision_lr_scale=0"):
        build(cfg)
    with pytest.raises(ConfigError, match="wmrl vla bc"):
        load_config("vla-rl", [f"run_dir={tmp_path}"])
