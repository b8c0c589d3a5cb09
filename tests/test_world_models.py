"""The domain-agnostic learned predictor pieces: hashed code features, ridge ensemble."""

import numpy as np

from wmrl.world_models.ensemble import RidgeEnsemble
from wmrl.world_models.features import hashed_ngrams, tokens


def test_hashed_ngrams_separate_hyperparameters_and_are_deterministic():
    a = "clf = RandomForestClassifier(n_estimators=10, max_depth=3)"
    b = "clf = RandomForestClassifier(n_estimators=300, max_depth=3)"
    assert "n_estimators=10" in tokens(a)
    va, vb = hashed_ngrams(a), hashed_ngrams(b)
    assert np.array_equal(va, hashed_ngrams(a))
    assert np.isclose(np.linalg.norm(va), 1.0)
    assert not np.allclose(va, vb) and va @ vb > 0.5  # similar scripts, not the same
    assert not hashed_ngrams("").any()


def test_ensemble_prior_then_learns_with_uncertainty_larger_off_data():
    ens = RidgeEnsemble(members=8, l2=1e-3, seed=0)
    m0, v0 = ens.predict(np.zeros((3, 4)))
    assert np.allclose(m0, 0.5) and np.allclose(v0, ens.prior_var)
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, size=(200, 4)) * np.array([1, 1, 0, 0])  # two directions never vary
    y = 0.2 + 0.5 * X[:, 0] + 0.05 * rng.normal(size=200)
    ens.add(X, y)
    ens.fit()
    m, v = ens.predict(X[:50])
    assert np.mean(np.abs(m - (0.2 + 0.5 * X[:50, 0]))) < 0.03
    far = np.array([[8.0, 8.0, 0.0, 0.0]])
    assert ens.predict(far)[1][0] > 1.5 * v.mean()  # members disagree when extrapolating
    clone = RidgeEnsemble(members=8, l2=1e-3, seed=0)
    clone.load_state_dict(ens.state_dict())
    assert clone.n == ens.n
