"""`world_model.runtime.executor: ray`: the world model in a Ray actor grades as it does in the trainer's
process, and one that dies costs the call in progress, never what the model had learned.

The latent-dynamics model of the control domain (a learning model with seeded
fits), on a local Ray instance (loopback only).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from test_durability import assert_same_run, fingerprint, train_with_kills
from wmrl.core.rollout import rollout
from wmrl.core.wm_remote import RemoteWorldModel
from wmrl.core.wm_runtime import RuntimeConfig, WorldModelRuntime
from wmrl.domains.synthetic.control import ControlConfig, ControlDomain, LatentConfig

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

DOMAIN = ControlDomain(ControlConfig(n_train=24, n_test_id=12))


def _cfg(**runtime) -> LatentConfig:
    return LatentConfig(type="latent-dynamics", epochs=5, refit_epochs=5, runtime=RuntimeConfig(**runtime))


def _episodes(split: str, seed: int):
    env = DOMAIN.make_real_env()
    trajs = rollout(DOMAIN.make_policy(seed), env, DOMAIN.tasks(split), source="real", max_turns=DOMAIN.max_turns,
                    generator=torch.Generator().manual_seed(seed))
    for t in trajs:
        t.real = env.outcome(t)
    return trajs


def _means(wm, trajs) -> list[float]:
    return [p.mean for p in wm.predict(trajs)]


def test_a_remote_world_model_grades_as_the_local_one_and_a_dead_actor_is_restored_to_its_state():
    batches = [_episodes("train", seed) for seed in (1, 2, 3)]
    held = _episodes("test_id", 4)
    local = DOMAIN.make_world_model(_cfg())
    remote = RemoteWorldModel(DOMAIN, _cfg(executor="ray"))
    try:
        for wm in (local, remote):
            wm.fit(batches[0])
        assert _means(remote, held) == _means(local, held)
        state = remote.state_dict()  # a checkpoint: what a fresh actor starts from
        assert state.keys() == local.state_dict().keys()
        for wm in (local, remote):
            wm.fit(batches[1])
            wm.fit(batches[2])
        expected = _means(local, held)
        assert _means(remote, held) == expected

        import ray

        ray.kill(remote.slots.actors[0], no_restart=True)  # the node is lost
        runtime = WorldModelRuntime(remote, RuntimeConfig())
        runtime.grade(held)  # the call in flight: unknown grades, not a crash
        assert all(t.wm is not None and not t.wm.known for t in held)
        assert remote.restarts == 1 and remote.slots.replaced == 1
        # the fresh actor loaded the checkpoint and re-fitted the two batches since: the same model
        assert _means(remote, held) == expected
        remote.load_state_dict(state)  # a resume: back to the checkpoint, in the actor
        local.load_state_dict(state)
        assert _means(remote, held) == _means(local, held)

        broken = [replace(held[0], actions=["not an action"] * held[0].turns)]
        with pytest.raises(RuntimeError, match="failed in its Ray actor"):  # the model's own error
            remote.predict(broken)
        assert remote.restarts == 1 and remote.slots.replaced == 1  # ... did not cost the actor
        assert _means(remote, held) == _means(local, held)
    finally:
        remote.close()


def test_an_actor_ray_cannot_place_fails_the_start_with_what_it_asked_for():
    from wmrl.core.ray_slots import RaySlots
    from wmrl.core.wm_remote import WorldModelHost

    with pytest.raises(RuntimeError, match=r"the world model \(Ray actor\) was not placed within 2 s: it asks Ray "
                                           r"for 1 CPU and 1 GPU and Ray has .* CPU and 0 GPU free"):
        RaySlots(WorldModelHost, 1, args=(DOMAIN, _cfg()), num_gpus=1, name="world model", start_timeout_s=2,
                 must_start=True)  # no GPU here


def test_a_training_run_with_the_world_model_on_ray_stores_what_the_local_run_stores(tmp_path):
    def args(run_dir, executor):
        return ["train", "synthetic-control", f"run_dir={run_dir}", "world_model.type=latent-dynamics",
                f"world_model.runtime.executor={executor}", "world_model.runtime.background_fit=true",
                "trainer.steps=3", "trainer.eval_every=3", "trainer.eval_samples=1", "trainer.groups_per_step=4",
                "trainer.group_size=4", "anchors.fraction=0.5", "tensorboard=false", "--no-progress", "--no-report"]

    train_with_kills([], args(tmp_path / "local", "local"))
    train_with_kills([], args(tmp_path / "ray", "ray"))
    local = fingerprint(tmp_path / "local")
    ray = fingerprint(tmp_path / "ray", ("world_model.runtime.executor=local",))
    assert local["pairs"] and len({p[5] for p in local["pairs"]}) > 1  # the model graded, and not as a constant
    assert_same_run(local, ray)


def test_the_executor_key_is_checked():
    with pytest.raises(ValueError, match="world_model.runtime.executor must be local or ray"):
        RuntimeConfig(executor="slurm").validate()
    with pytest.raises(ValueError, match="set world_model.runtime.executor=ray"):
        RuntimeConfig(ray_address="auto").validate()
    assert replace(RuntimeConfig(), executor="ray").validate() is None
