"""The heteroscedastic deep ensemble: prior, fit, both kinds of variance, checkpoints, and that its variance is useful where it is consumed (per-trajectory denoising)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from wmrl.core.denoise import DenoiseConfig
from wmrl.core.estimators import EstimatorConfig, build_estimator
from wmrl.core.types import Group, Outcome, Prediction, Task, Trajectory
from wmrl.domains.synthetic.program import ProgramConfig, ProgramDomain
from wmrl.world_models.gaussian_ensemble import GaussianEnsemble


def truth(x: np.ndarray) -> np.ndarray:
    return 0.5 + 0.3 * np.sin(3 * x)


def noisy_1d(n: int, noise, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, n)
    return x[:, None], truth(x) + noise(x) * rng.normal(size=n)


@pytest.fixture(scope="module")
def fitted() -> GaussianEnsemble:
    X, y = noisy_1d(400, lambda x: 0.03)
    ens = GaussianEnsemble(seed=0)
    ens.add(X, y)
    ens.fit()
    return ens


def test_prior_before_any_fit_and_below_two_rows():
    ens = GaussianEnsemble(prior_mean=0.4, prior_var=0.05)
    m, v = ens.predict(np.zeros((3, 2)))
    assert np.allclose(m, 0.4) and np.allclose(v, 0.05)
    ens.add(np.zeros((1, 2)), [0.9])
    ens.fit()  # one row is not a model
    assert np.allclose(ens.predict(np.zeros((3, 2)))[0], 0.4)


def test_learns_a_noisy_function(fitted):
    x = np.linspace(-0.9, 0.9, 50)[:, None]
    m, _ = fitted.predict(x)
    assert np.mean(np.abs(m - truth(x[:, 0]))) < 0.04
    assert np.mean(np.abs(m - m.mean())) > 0.1  # not a constant


def test_variance_is_larger_where_the_data_are_noisier():
    X, y = noisy_1d(400, lambda x: np.where(x > 0, 0.15, 0.02), seed=1)
    ens = GaussianEnsemble(seed=1)
    ens.add(X, y)
    ens.fit()
    _, v_quiet = ens.predict(np.linspace(-0.9, -0.1, 20)[:, None])
    _, v_noisy = ens.predict(np.linspace(0.1, 0.9, 20)[:, None])
    assert np.sqrt(v_noisy).mean() > 3 * np.sqrt(v_quiet).mean()


def test_variance_is_larger_off_the_data(fitted):
    _, v_in = fitted.predict(np.linspace(-0.9, 0.9, 20)[:, None])
    _, v_out = fitted.predict(np.array([[-4.0], [4.0], [6.0]]))
    assert v_out.min() > 100 * v_in.mean()
    # above max_var (0.25), the most the aleatoric head can say: the members disagree (measured >= 0.5)
    assert v_out.min() > 0.25


def test_synchronous_fit_is_deterministic_given_the_seed_and_state_round_trips(fitted):
    X, y = noisy_1d(400, lambda x: 0.03)
    again = GaussianEnsemble(seed=0)
    again.add(X, y)
    again.fit()
    probe = np.linspace(-2, 2, 30)[:, None]
    assert np.array_equal(again.predict(probe)[0], fitted.predict(probe)[0])
    other = GaussianEnsemble(seed=7)
    other.add(X, y)
    other.fit()
    assert not np.allclose(other.predict(probe)[0], fitted.predict(probe)[0])

    clone = GaussianEnsemble(seed=123)  # the state, not the constructor's seed, decides
    clone.load_state_dict(pickle.loads(pickle.dumps(fitted.state_dict())))
    assert clone.n == fitted.n
    for a, b in zip(clone.predict(probe), fitted.predict(probe)):
        assert np.array_equal(a, b)


def test_window_keeps_the_most_recent_rows():
    ens = GaussianEnsemble(window=5)
    ens.add(np.arange(8.0)[:, None], np.arange(8) / 10)
    assert ens.n == 5
    assert np.allclose(ens.state_dict()["y"], [0.3, 0.4, 0.5, 0.6, 0.7])


# ---------------------------------------------------------------- on a real domain
PCFG = ProgramConfig(n_train=400)


def program_features(task: Task, action: np.ndarray) -> np.ndarray:
    """Task features, one-hot choices, and their products (the worth of a choice depends on the task)."""
    onehot = np.zeros((PCFG.n_slots, PCFG.n_choices))
    onehot[np.arange(PCFG.n_slots), action] = 1.0
    return np.concatenate([task.payload, onehot.ravel(), np.kron(onehot.ravel(), task.payload)])


def program_outcomes(domain: ProgramDomain, tasks: list[Task], n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    env = domain.make_real_env()
    picked = [tasks[i] for i in rng.integers(0, len(tasks), n)]
    actions = [rng.integers(0, PCFG.n_choices, PCFG.n_slots) for _ in picked]
    env.reset(picked)
    rewards = [t.reward for t in env.step(actions)]
    return np.stack([program_features(t, a) for t, a in zip(picked, actions)]), np.array(rewards)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_variance_tracks_the_error_on_held_out_program_outcomes(seed):
    domain = ProgramDomain(PCFG)
    rng = np.random.default_rng(seed)
    X, y = program_outcomes(domain, domain.tasks("train"), 500, rng)
    held = [program_outcomes(domain, domain.tasks(s), 300, rng) for s in ("test_id", "test_ood")]
    Xh, yh = np.concatenate([h[0] for h in held]), np.concatenate([h[1] for h in held])
    ens = GaussianEnsemble(seed=seed)
    ens.add(X, y)
    ens.fit()
    mean, var = ens.predict(Xh)
    err = np.abs(mean - yh)
    assert err.mean() < 0.5 * yh.std()  # it is a model of the outcome at all
    std = np.sqrt(var)
    # measured over seeds 0-7: Spearman 0.12-0.30, Pearson 0.19-0.38
    assert spearmanr(std, err)[0] > 0.08 and pearsonr(std, err)[0] > 0.12
    scrambled = [rng.permutation(std) for _ in range(20)]  # the same checks fail on shuffled variances
    assert np.mean([spearmanr(s, err)[0] for s in scrambled]) < 0.08
    assert np.mean([pearsonr(s, err)[0] for s in scrambled]) < 0.12


def test_per_trajectory_denoising_weights_follow_the_ensemble_variances():
    domain = ProgramDomain(PCFG)
    rng = np.random.default_rng(3)
    X, y = program_outcomes(domain, domain.tasks("train"), 500, rng)
    ens = GaussianEnsemble(seed=3)
    ens.add(X, y)
    ens.fit()
    est = build_estimator(EstimatorConfig(denoise=DenoiseConfig(warmup=1, per_trajectory=True, w_max=10)), 0.5)

    def group(gid: str, task: Task, anchor: bool) -> Group:
        actions = [rng.integers(0, PCFG.n_choices, PCFG.n_slots) for _ in range(8)]
        mean, var = ens.predict(np.stack([program_features(task, a) for a in actions]))
        trajs = [Trajectory(task, [task.payload], [a], wm=Prediction.checked(m, v))
                 for a, m, v in zip(actions, mean, var)]
        if anchor:
            env = domain.make_real_env()
            env.reset([task] * len(actions))
            for t, tr in zip(trajs, env.step(actions)):
                t.real, t.source = Outcome(tr.reward), "real"
        return Group(gid, task, trajs, anchor=anchor)

    anchor = group("a", domain.tasks("train")[0], True)  # its disagreement freezes the scale first
    wm_group = group("w", domain.tasks("test_ood")[0], False)
    weights = np.array(est.estimate([anchor, wm_group]).weights[1])
    var = np.array([t.wm.var for t in wm_group.trajectories])
    assert est.denoiser.scale is not None and np.ptp(var) > 0
    assert np.array_equal(np.argsort(weights), np.argsort(-var))  # more variance, less weight
    assert weights.max() > 1.05 * weights.min()
    assert np.allclose(weights, est.denoiser.trajectory_weights(var))
