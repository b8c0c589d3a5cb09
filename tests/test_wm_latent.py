"""The latent-dynamics world model on the synthetic control domain: a policy is rolled out
inside it with the real rollout loop, and its rewards, variances and checkpoints hold up
against real episodes it never saw."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from wmrl.core.rollout import rollout, wm_prediction
from wmrl.core.types import Outcome, Trajectory
from wmrl.domains.synthetic.control import ControlConfig, ControlDomain, LatentConfig
from wmrl.world_models.latent import LatentDynamicsEnsemble, LatentWorldModel

CFG = ControlConfig(n_train=300, n_test_id=150)


def latent_wm(seed: int = CFG.seed, **keys) -> LatentWorldModel:
    """The control domain's registered latent-dynamics world model (`keys`: its config's)."""
    return ControlDomain(replace(CFG, seed=seed)).make_world_model(LatentConfig(type="latent-dynamics", **keys))


def real_episodes(domain: ControlDomain, split: str, policy_seed: int) -> list[Trajectory]:
    """Episodes of the domain's own (untrained) policy in the real env, graded like anchors."""
    env = domain.make_real_env()
    trajs = rollout(domain.make_policy(policy_seed), env, domain.tasks(split), source="real",
                    max_turns=CFG.horizon, generator=torch.Generator().manual_seed(policy_seed))
    for t in trajs:
        t.real = env.outcome(t)
    return trajs


@pytest.fixture(scope="module")
def setup():
    domain = ControlDomain(CFG)
    train, held = real_episodes(domain, "train", 1), real_episodes(domain, "test_id", 2)
    wm = latent_wm()
    wm.fit(train)
    return domain, wm, train, held


def graded(wm: LatentWorldModel, trajs: list[Trajectory]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    preds = wm.predict(trajs)
    assert all(p.known for p in preds)
    return (np.array([p.mean for p in preds]), np.array([p.var for p in preds]),
            np.array([t.real.reward for t in trajs]))


def test_unfitted_model_holds_still_and_gives_the_prior():
    domain = ControlDomain(CFG)
    wm = latent_wm()
    tasks = domain.tasks("test_id")[:4]
    trajs = rollout(domain.make_policy(0), wm, tasks, source="wm", max_turns=CFG.horizon)
    first = domain.make_real_env().reset(tasks)
    for t, o in zip(trajs, first):
        assert t.turns == CFG.horizon
        assert all(np.array_equal(x, o) for x in t.observations)
        p = wm_prediction(t)
        assert p.mean == pytest.approx(wm.prior_mean) and p.var == pytest.approx(wm.prior_var)


def test_policy_rolls_out_inside_the_model_like_in_the_real_env(setup):
    domain, wm, _, held = setup
    tasks = domain.tasks("test_id")
    policy = domain.make_policy(2)
    sim = rollout(policy, wm, tasks, source="wm", max_turns=CFG.horizon, generator=torch.Generator().manual_seed(5))
    assert all(t.turns == CFG.horizon for t in sim)
    assert np.array_equal(sim[0].observations[0], held[0].observations[0])  # the real first observation
    preds = [wm_prediction(t) for t in sim]
    assert all(p.known and 0.0 <= p.mean <= 1.0 and p.var > 0 for p in preds)
    assert all(v == 0.0 for t in sim for v in t.step_reward_vars[:-1])  # uncertainty sits on the final reward
    # the model stands in for the env: same policy, same tasks, close mean reward
    real_mean = np.mean([t.real.reward for t in held])
    assert abs(np.mean([p.mean for p in preds]) - real_mean) < 0.05

    # the simulated observations follow the real ones for the same actions
    wm.reset([t.task for t in held])
    errs, scale = [], []
    for k in range(CFG.horizon - 1):
        out = wm.step([t.actions[k] for t in held])
        assert all(o.observation.shape == (4,) and o.observation.dtype == np.float32 for o in out)
        real = np.stack([t.observations[k + 1] for t in held])
        errs.append(np.abs(np.stack([o.observation for o in out]) - real).mean())
        scale.append(np.abs(real - real.mean(0)).mean())
    assert max(errs) < 0.25 * np.mean(scale)


def test_predicted_rewards_follow_real_rewards_on_held_out_episodes(setup):
    _, wm, _, held = setup
    mean, _, real = graded(wm, held)
    assert spearmanr(mean, real)[0] > 0.5  # measured 0.79
    assert np.mean(np.abs(mean - real)) < 0.5 * real.std()


def test_variance_is_larger_where_the_model_is_wrong(setup):
    _, wm, _, held = setup
    mean, var, real = graded(wm, held)
    err = np.abs(mean - real)
    rho = spearmanr(np.sqrt(var), err)[0]
    assert rho > 0.4  # measured 0.90
    rng = np.random.default_rng(0)
    assert np.mean([spearmanr(rng.permutation(var), err)[0] for _ in range(20)]) < 0.4 < rho


def test_state_dict_round_trip_reproduces_predictions(setup):
    _, wm, _, held = setup
    clone = latent_wm(seed=99)  # the state, not the seed, decides
    clone.load_state_dict(pickle.loads(pickle.dumps(wm.state_dict())))
    assert clone.model.n == wm.model.n
    for a, b in zip(graded(clone, held[:40]), graded(wm, held[:40])):
        assert np.array_equal(a, b)


def test_fit_learns_only_from_complete_real_graded_episodes_and_is_deterministic():
    domain = ControlDomain(CFG)
    trajs = real_episodes(domain, "train", 3)[:20]
    bad = [Trajectory(**{**vars(t), "source": "wm"}) for t in trajs[:2]]  # simulated observations
    bad += [Trajectory(**{**vars(t), "real": Outcome(None, "infra")}) for t in trajs[2:4]]  # unknown grade
    bad += [Trajectory(**{**vars(t), "actions": t.actions[:5], "observations": t.observations[:5]}) for t in trajs[4:6]]
    a = latent_wm(epochs=5)
    a.fit(bad)
    assert a.model.n == 0 and not a.model.fitted
    a.fit(trajs)
    b = latent_wm(epochs=5)
    b.fit(trajs)
    assert a.model.n == 20
    for x, y in zip(graded(a, trajs), graded(b, trajs)):
        assert np.array_equal(x, y)
    # a second fit continues from the current weights: predictions move
    before = graded(a, trajs)[0]
    a.fit(real_episodes(domain, "train", 4)[:20])
    assert a.model.n == 40 and not np.array_equal(graded(a, trajs)[0], before)


def test_episode_shape_is_checked():
    m = LatentDynamicsEnsemble(obs_dim=4, action_dim=2)
    m.add_episode(np.zeros((13, 4)), np.zeros((12, 2)), 0.5)  # the final observation may be included
    with pytest.raises(ValueError, match="T or T\\+1 observations"):
        m.add_episode(np.zeros((5, 4)), np.zeros((12, 2)), 0.5)
    with pytest.raises(RuntimeError, match="not been fit"):
        m.encode(np.zeros((1, 4)))


def test_a_config_without_its_type_still_builds_its_world_model():
    # a hand-built config names its world model by its class (one registered type uses LatentConfig)
    assert isinstance(ControlDomain(CFG).make_world_model(LatentConfig(epochs=1)), LatentWorldModel)
