"""The VLA world models on real physics: the embodied model ranks held-out real outcomes, imagines whole
episodes without a simulator step, starts them from the task's real first observation and ends them on
predicted success; the progress model (the fused baseline's) scores successes above failures.

Nothing mocked: the BC policy of `vla_bc` (conftest.py) acts in robosuite, the models fit on its
demonstrations and on real episodes of other initial states, and are judged on episodes never fitted on.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("robosuite")
pytest.importorskip("lerobot")

import torch  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from wmrl.config import load_config  # noqa: E402
from wmrl.core.registry import DOMAINS  # noqa: E402
from wmrl.core.rollout import rollout  # noqa: E402
from wmrl.domains.vla.env import VLAEnv  # noqa: E402

G = 3  # episodes per task


def _config(vla_bc, *extra):
    return load_config("vla-rl", [f"domain.policy={vla_bc / 'policy'}", "domain.families=[lift]", "domain.n_train=12",
                                  "domain.n_test_id=12", "domain.env.horizon_steps.lift=56", "estimator.mode=wmrl",
                                  f"world_model.demos={vla_bc / 'demos'}", *extra])


@pytest.fixture(scope="module")
def setup(vla_bc):
    """The domain, its policy, and real episodes: G per task on the train and the test_id scenes."""
    cfg = _config(vla_bc)
    domain = DOMAINS.get("vla")(cfg.domain)
    policy = domain.make_policy(0)
    with domain.make_real_env() as env:
        def real(split, seed):
            trajs = rollout(policy, env, [t for t in domain.tasks(split) for _ in range(G)], source="real",
                            max_turns=domain.max_turns, generator=torch.Generator().manual_seed(seed))
            for t in trajs:
                t.real = env.outcome(t)
            return trajs

        return cfg, domain, policy, real("train", 1), real("test_id", 2)


@pytest.fixture()
def embodied(setup):
    cfg, domain = setup[0], setup[1]
    wm = domain.make_world_model(cfg.world_model)
    yield wm
    wm.close()


def _auc(trajs, preds):
    y = [t.real.reward for t in trajs]
    assert 0 < sum(y) < len(y), "the held-out episodes need both outcomes"
    return roc_auc_score(y, [p.mean for p in preds])


def test_predicted_success_ranks_held_out_real_outcomes(setup, embodied):
    _, _, _, train, held = setup
    before = _auc(held, embodied.predict(held))  # from the four demonstrations alone
    embodied.fit(train)
    preds = embodied.predict(held)
    after = _auc(held, preds)
    print(f"\nembodied WM on {len(held)} held-out episodes (success {np.mean([t.real.reward for t in held]):.2f}): "
          f"AUC {before:.3f} from the demos, {after:.3f} after fitting {len(train)} real episodes")
    assert before > 0.6 and after > 0.7
    assert all(p.known and 0 <= p.mean <= 1 and p.var > 0 for p in preds)


def test_imagined_episodes_start_from_the_real_first_observation_and_never_step_a_simulator(
        setup, embodied, monkeypatch):
    _, domain, policy, train, _ = setup
    embodied.fit(train)
    calls = {"reset": 0, "step": 0}
    for name in calls:
        original = getattr(VLAEnv, name)

        def counted(self, *args, _name=name, _original=original):
            calls[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(VLAEnv, name, counted)
    tasks = [t for t in domain.tasks("test_id") for _ in range(G)]
    for seed in (3, 4):
        imagined = rollout(policy, embodied, tasks, source="wm", max_turns=domain.max_turns,
                           generator=torch.Generator().manual_seed(seed))
    # each task's first observation rendered once (a reset, cached), and not one simulator step
    assert calls == {"reset": 1, "step": 0}
    assert embodied.first.rendered == len(domain.tasks("test_id"))
    with domain.make_real_env() as env:
        real_first = env.reset(domain.tasks("test_id"))
    first = embodied.reset(domain.tasks("test_id"))
    codec = embodied.codec
    for f, r in zip(first, real_first):
        assert np.array_equal(f["state"], r["state"]) and np.array_equal(f["image"], r["image"])
    # imagined observations are camera features + state, as the policy reads them
    obs = imagined[0].observations[1]
    assert set(obs) == {"features", "state", "instruction"} and obs["features"].shape == (128,)
    # an episode ends at predicted success, before the horizon, as a real one ends at success
    limit = domain.max_turns
    early = [t for t in imagined if t.turns < limit]
    assert early and all(t.step_rewards[-1] >= embodied.success_threshold for t in early)
    assert all(r == 0.0 for t in imagined for r in t.step_rewards[:-1])
    # open-loop error of the imagined observations, relative to the data's variance, per turn
    errors = embodied.open_loop_error(train[:6])
    assert len(errors) == limit - 1 and all(np.isfinite(e) and e >= 0 for e in errors)
    assert codec.vectors(first).shape == (len(first), 128 + 9)


def test_the_policy_acts_the_same_on_a_real_observation_and_on_its_features(setup, embodied):
    _, _, policy, train, _ = setup
    real = train[0].observations[:3]
    imagined = embodied.codec.observations(embodied.codec.vectors(real), real)
    chunks = train[0].actions[:3]
    a = policy.log_prob(real, chunks)
    b = policy.log_prob(imagined, chunks)
    mixed = policy.log_prob([real[0], imagined[1], real[2]], chunks)
    assert torch.allclose(a, b, atol=1e-5) and torch.allclose(a, mixed, atol=1e-5)


def test_the_progress_model_scores_real_successes_above_failures(setup, vla_bc):
    _, domain, _, train, held = setup
    cfg = _config(vla_bc, "estimator.mode=fused")
    assert cfg.world_model.type == "progress"  # the fused mode's model, without naming it
    wm = domain.make_world_model(cfg.world_model)
    wm.fit(train)
    preds = wm.predict(held)
    auc = _auc(held, preds)
    print(f"\nprogress model: AUC {auc:.3f} on {len(held)} held-out episodes")
    assert auc > 0.7 and all(p.known and 0 <= p.mean <= 1 for p in preds)
    with pytest.raises(NotImplementedError, match="estimator.mode=fused"):
        wm.reset(domain.tasks("train"))
