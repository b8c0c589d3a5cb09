"""The `autoresearch-mini` suite: small, offline ML tasks for AutoResearch agents.

An agent reads a task's `description`, writes experiment code that runs in a
sandbox holding the task's public files (`train.csv`, `test_features.csv`), and
leaves `submission.csv` behind; `grader.grade` scores it against hidden labels
that never enter the sandbox, and `ARTask.normalize` turns the score into a
reward in [0, 1].

This module defines the tasks and owns their data (specs, generation, the
cache, the hidden labels, descriptions); it never grades. `suite.load_suite`
loads the suite and pins each task's baseline and reference scores with the
grader, so the grader can read task data without an import cycle.

Every task is built deterministically from scikit-learn's bundled datasets or
its generators with fixed seeds, so the suite needs no network. Generated
arrays are cached (`~/.cache/wmrl/autoresearch-mini/<version>/<task id>/`);
the public CSVs are written there on the first `materialize`. The cache holds
the hidden labels: never mount it in the sandbox.

An `ARTask` is small plain data (the arrays stay on disk), so it pickles
cheaply into the run store as a `Task` payload.

Regenerate the pinned reference scores and the fit times quoted in
`docs/autoresearch_tasks.md` with
`python -m wmrl.domains.autoresearch.suite --measure`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from wmrl.core.types import SPLITS, Task

SUITE_NAME = "autoresearch-mini"
#: bump when a task's data, description or grading changes: the cache is keyed by it
SUITE_VERSION = "v1"
#: reward 1 needs the reference score plus this fraction of its gap to a perfect score
HEADROOM = 0.25
#: the reward of an attempt that fails (error, timeout, invalid submission)
FAILURE_REWARD = 0.0
SUBMISSION_FILE = "submission.csv"
PUBLIC_FILES = ("train.csv", "test_features.csv")


@dataclass(frozen=True)
class MetricInfo:
    name: str
    higher_is_better: bool
    perfect: float
    #: "label" (a class per row), "proba" (probabilities) or "value" (real numbers)
    kind: str
    explanation: str


METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in (
        MetricInfo("accuracy", True, 1.0, "label", "the fraction of test rows whose predicted class is the true class"),
        MetricInfo("macro_f1", True, 1.0, "label",
                   "the F1 score of each class, averaged over the classes with equal weight (rare classes count as "
                   "much as common ones)"),
        MetricInfo("roc_auc", True, 1.0, "proba",
                   "the area under the ROC curve of your predicted probabilities (only their ranking matters; 0.5 is "
                   "chance)"),
        MetricInfo("log_loss", False, 0.0, "proba",
                   "the mean negative log-likelihood of the true class under your predicted probabilities "
                   "(confident mistakes are punished hard)"),
        MetricInfo("r2", True, 1.0, "value",
                   "the coefficient of determination R^2 (1 is perfect, 0 is predicting the test mean)"),
        MetricInfo("rmse", False, 0.0, "value", "the root mean squared error"),
    )
}


def label_key(value: Any) -> str:
    """The canonical text of a class label, so that `1`, `1.0` and `" 1"` are the same class."""
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        return text
    if math.isfinite(number) and number.is_integer():
        return str(int(number))
    return repr(number)


@dataclass(frozen=True)
class ARTask:
    """One AutoResearch task: what the agent reads and what the grader needs.

    `baseline` is the score of the trivial solution (majority class, constant
    probability, train mean) on the hidden test rows; `reference` the score of a
    default HistGradientBoosting model. Hidden labels are read from `data_dir`
    by `hidden_labels` and never written to a work directory.
    """

    id: str
    family: str
    split: str
    metric: str
    budget_s: int
    description: str = field(repr=False)
    baseline: float
    reference: float
    #: "binary", "multiclass", "regression" or "multi-output"
    task_type: str
    feature_columns: tuple[str, ...] = field(repr=False)
    target_columns: tuple[str, ...]
    #: class labels in the order of the probability columns; None for regression
    classes: tuple[Any, ...] | None
    n_train: int
    n_test: int
    data_dir: str = field(repr=False)
    suite: str = SUITE_NAME
    source: str = ""
    public_files: tuple[str, ...] = PUBLIC_FILES
    failure_reward: float = FAILURE_REWARD

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"task {self.id!r}: unknown metric {self.metric!r}; expected one of {sorted(METRICS)}")
        if self.split not in SPLITS:
            raise ValueError(f"task {self.id!r}: unknown split {self.split!r}; expected one of {SPLITS}")

    # --- metric and reward -------------------------------------------------

    @property
    def metric_info(self) -> MetricInfo:
        return METRICS[self.metric]

    @property
    def higher_is_better(self) -> bool:
        return self.metric_info.higher_is_better

    @property
    def perfect_score(self) -> float:
        return self.metric_info.perfect

    @property
    def target_score(self) -> float:
        """The score that earns reward 1 (see `normalize`)."""
        return target_score(self.baseline, self.reference, self.metric)

    def normalize(self, score: float | None) -> float:
        """Reward in [0, 1]: 0 at or below the baseline, 1 at or beyond `target_score`.

        Linear in between; the same formula serves lower-is-better metrics. A
        missing or non-finite score (a failed attempt) gets `failure_reward`.
        """
        return normalize_score(score, self.baseline, self.reference, self.metric, self.failure_reward)

    # --- submission format -------------------------------------------------

    @property
    def positive_class(self) -> Any:
        if self.task_type != "binary" or not self.classes:
            raise ValueError(f"task {self.id!r} is not a binary classification task")
        return self.classes[-1]

    @property
    def submission_columns(self) -> tuple[str, ...]:
        kind = self.metric_info.kind
        if kind == "label":
            return ("prediction",)
        if kind == "proba":
            if self.metric == "roc_auc" and self.task_type == "binary":
                return ("prediction",)
            return tuple(f"p_{label_key(c)}" for c in self.classes or ())
        if len(self.target_columns) > 1:
            return tuple(self.target_columns)
        return ("prediction",)

    def to_task(self) -> Task:
        return Task(id=self.id, split=self.split, payload=self)


def target_score(baseline: float, reference: float, metric: str) -> float:
    """t = r + HEADROOM·(p − r) when the reference r beats the baseline b, else b + HEADROOM·(p − b)."""
    info = METRICS[metric]
    p = info.perfect
    better = reference > baseline if info.higher_is_better else reference < baseline
    anchor = reference if better and math.isfinite(reference) else baseline
    return anchor + HEADROOM * (p - anchor)


def normalize_score(score: float | None, baseline: float, reference: float, metric: str,
                    failure_reward: float = FAILURE_REWARD) -> float:
    if score is None:
        return failure_reward
    try:
        s = float(score)
    except (TypeError, ValueError):
        return failure_reward
    if not math.isfinite(s):
        return failure_reward
    info = METRICS[metric]
    t = target_score(baseline, reference, metric)
    gap = t - baseline
    if gap == 0:  # degenerate: the baseline is already perfect
        ok = s >= baseline if info.higher_is_better else s <= baseline
        return 1.0 if ok else 0.0
    return float(min(1.0, max(0.0, (s - baseline) / gap)))


def split(tasks: Sequence[ARTask], split: str) -> list[ARTask]:
    """The tasks of one split (one of SPLITS), in suite order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return [t for t in tasks if t.split == split]


# --- the suite -----------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    id: str
    family: str
    split: str
    metric: str
    budget_s: int
    blurb: str
    gen: str
    params: dict = field(default_factory=dict)
    test_size: float = 0.25
    seed: int = 0

    @property
    def classification(self) -> bool:
        return METRICS[self.metric].kind != "value"

    def fingerprint(self) -> str:
        blob = json.dumps([SUITE_VERSION, self.id, self.family, self.split, self.metric, self.budget_s, self.blurb,
                           self.gen, self.params, self.test_size, self.seed], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


_SMALL, _MEDIUM, _LARGE = 60, 180, 300

SPECS: tuple[_Spec, ...] = (
    # ---- tabular-binary (training family) ----
    _Spec("bc-diagnosis", "tabular-binary", "train", "roc_auc", _SMALL,
          "Predict whether a breast tumour is benign (1) or malignant (0) from 30 measurements of its cell nuclei "
          "(Wisconsin diagnostic breast cancer data).",
          "load", {"name": "breast_cancer"}, seed=11),
    _Spec("binary-synthetic", "tabular-binary", "train", "accuracy", _SMALL,
          "A synthetic binary classification problem: 20 numeric features, of which only some carry signal; the "
          "rest are noise or linear combinations of the informative ones.",
          "make_classification", {"n_samples": 2400, "n_features": 20, "n_informative": 6, "n_redundant": 4,
                                  "class_sep": 0.9, "flip_y": 0.01}, seed=12),
    _Spec("binary-moons", "tabular-binary", "train", "log_loss", _SMALL,
          "Two interleaving half-moons in the first two features, plus eight pure-noise features. The class boundary "
          "is strongly non-linear.",
          "moons", {"n_samples": 3000, "noise": 0.35, "n_noise_features": 8}, seed=13),
    _Spec("binary-large", "tabular-binary", "train", "roc_auc", _MEDIUM,
          "A larger synthetic binary classification problem (20,000 rows, 30 features, a few percent of labels "
          "flipped). Model fits take seconds here: budget your experiments.",
          "make_classification", {"n_samples": 20000, "n_features": 30, "n_informative": 10, "n_redundant": 5,
                                  "class_sep": 0.8, "flip_y": 0.03}, seed=14),
    _Spec("binary-hastie", "tabular-binary", "test_id", "accuracy", _SMALL,
          "Ten standard-normal features; the class is whether their squared norm exceeds a threshold (the classic "
          "Hastie et al. boosting benchmark).",
          "hastie", {"n_samples": 6000}, seed=15),
    # ---- tabular-multiclass (training family) ----
    _Spec("digits-8x8", "tabular-multiclass", "train", "accuracy", _SMALL,
          "Recognise handwritten digits 0-9 from 8x8 grey-level images, given as 64 pixel columns "
          "(`pixel_r_c`, values 0-16).",
          "load", {"name": "digits"}, seed=21),
    _Spec("wine-cultivar", "tabular-multiclass", "train", "macro_f1", _SMALL,
          "Identify which of three cultivars a wine comes from, given 13 results of its chemical analysis.",
          "load", {"name": "wine"}, seed=22),
    _Spec("multiclass-quantiles", "tabular-multiclass", "train", "accuracy", _SMALL,
          "Four classes formed by nested shells of a 6-dimensional Gaussian (the class is the quantile of the "
          "distance from the centre). No single feature separates the classes.",
          "gaussian_quantiles", {"n_samples": 3000, "n_features": 6, "n_classes": 4}, seed=23),
    _Spec("multiclass-5way", "tabular-multiclass", "train", "log_loss", _SMALL,
          "A synthetic 5-class problem with 25 numeric features and overlapping classes: well-calibrated "
          "probabilities matter more than hard decisions.",
          "make_classification", {"n_samples": 5000, "n_features": 25, "n_informative": 10, "n_redundant": 5,
                                  "n_classes": 5, "class_sep": 1.0}, seed=24),
    _Spec("multiclass-large", "tabular-multiclass", "train", "accuracy", _LARGE,
          "A larger synthetic 8-class problem (16,000 rows, 40 features). Each fit of a tree ensemble takes "
          "seconds: budget your experiments.",
          "make_classification", {"n_samples": 16000, "n_features": 40, "n_informative": 16, "n_redundant": 8,
                                  "n_classes": 8, "n_clusters_per_class": 2, "class_sep": 1.0}, seed=25),
    _Spec("iris-species", "tabular-multiclass", "test_id", "log_loss", _SMALL,
          "Classify iris flowers into three species from four measurements of their petals and sepals.",
          "load", {"name": "iris"}, seed=26),
    # ---- imbalanced (training family) ----
    _Spec("imbalanced-fraud", "imbalanced", "train", "roc_auc", _MEDIUM,
          "Fraud-like detection: about 3% of the 20,000 rows are positive. Accuracy would be meaningless here; "
          "the score is ROC AUC.",
          "make_classification", {"n_samples": 20000, "n_features": 24, "n_informative": 8, "n_redundant": 4,
                                  "weights": [0.97, 0.03], "class_sep": 0.8, "flip_y": 0.0}, seed=31),
    _Spec("imbalanced-multiclass", "imbalanced", "train", "macro_f1", _SMALL,
          "Four classes with very unequal frequencies (about 70%, 20%, 7% and 3%). Every class counts equally in "
          "the score, so the rare ones matter.",
          "make_classification", {"n_samples": 6000, "n_features": 20, "n_informative": 8, "n_redundant": 2,
                                  "n_classes": 4, "weights": [0.70, 0.20, 0.07, 0.03], "class_sep": 1.0}, seed=32),
    _Spec("imbalanced-rare-noisy", "imbalanced", "test_id", "log_loss", _SMALL,
          "A binary problem with about 10% positives and some mislabelled rows; the score rewards calibrated "
          "probabilities.",
          "make_classification", {"n_samples": 8000, "n_features": 16, "n_informative": 6, "n_redundant": 2,
                                  "weights": [0.9, 0.1], "flip_y": 0.05, "class_sep": 1.0}, seed=33),
    # ---- high-dim (training family) ----
    _Spec("highdim-genomics", "high-dim", "train", "accuracy", _MEDIUM,
          "Expression-like data: far more features (2,000) than rows (400), only about 20 of them informative.",
          "make_classification", {"n_samples": 400, "n_features": 2000, "n_informative": 20, "n_redundant": 10,
                                  "class_sep": 1.2}, seed=41),
    _Spec("highdim-counts", "high-dim", "train", "macro_f1", _MEDIUM,
          "Bag-of-words-like counts: 800 non-negative integer columns (mostly zeros); three classes, each making "
          "a few dozen of the columns more frequent.",
          "counts", {"n_samples": 1800, "n_features": 800, "n_classes": 3, "n_signal": 30}, seed=42),
    _Spec("highdim-wide", "high-dim", "test_id", "roc_auc", _MEDIUM,
          "A wide binary problem: 1,000 features for 600 rows, 15 informative.",
          "make_classification", {"n_samples": 600, "n_features": 1000, "n_informative": 15, "n_redundant": 5,
                                  "class_sep": 1.0}, seed=43),
    # ---- noisy-labels (training family) ----
    _Spec("noisy-binary", "noisy-labels", "train", "accuracy", _SMALL,
          "A binary problem where about 20% of the labels (train and test alike) are wrong: they were drawn at "
          "random.",
          "make_classification", {"n_samples": 4000, "n_features": 20, "n_informative": 8, "n_redundant": 2,
                                  "flip_y": 0.4, "class_sep": 1.2}, seed=51),
    _Spec("noisy-multiclass", "noisy-labels", "train", "macro_f1", _SMALL,
          "Four classes where about 30% of the labels (train and test alike) are wrong: they were drawn at "
          "random.",
          "make_classification", {"n_samples": 5000, "n_features": 20, "n_informative": 10, "n_redundant": 2,
                                  "n_classes": 4, "flip_y": 0.4, "class_sep": 1.2}, seed=52),
    _Spec("noisy-binary-large", "noisy-labels", "test_id", "log_loss", _MEDIUM,
          "A larger binary problem (20,000 rows) where about 10% of the labels are wrong. Fits take "
          "seconds: budget your experiments.",
          "make_classification", {"n_samples": 20000, "n_features": 30, "n_informative": 10, "n_redundant": 4,
                                  "flip_y": 0.2, "class_sep": 1.0}, seed=53),
    # ---- regression (held-out OOD family) ----
    _Spec("diabetes-progression", "regression", "test_ood", "r2", _SMALL,
          "Predict a quantitative measure of diabetes progression one year after baseline from age, sex, body "
          "mass index, blood pressure and six blood serum measurements (raw units).",
          "load", {"name": "diabetes"}, seed=61),
    _Spec("friedman1", "regression", "test_ood", "rmse", _SMALL,
          "A synthetic non-linear regression problem (Friedman #1): the target depends on five of the ten "
          "uniform features through sines, squares and products, plus Gaussian noise.",
          "friedman1", {"n_samples": 3000, "n_features": 10, "noise": 1.0}, seed=62),
    _Spec("friedman2-impedance", "regression", "test_ood", "r2", _SMALL,
          "A synthetic regression problem (Friedman #2, the impedance of an AC circuit): four features on very "
          "different scales, a strongly non-linear target.",
          "friedman2", {"n_samples": 2000, "noise": 50.0}, seed=63),
    _Spec("regression-sparse-linear", "regression", "test_ood", "r2", _SMALL,
          "A linear regression problem with 100 features, only 10 of which matter, and noisy targets.",
          "make_regression", {"n_samples": 2000, "n_features": 100, "n_informative": 10, "noise": 20.0}, seed=64),
    _Spec("regression-large", "regression", "test_ood", "rmse", _MEDIUM,
          "A larger non-linear regression problem (Friedman #1 form, 20 features of which 5 matter, 10,000 rows). "
          "Fits take seconds: budget your experiments.",
          "friedman1", {"n_samples": 10000, "n_features": 20, "noise": 1.0}, seed=65),
    # ---- multi-output (held-out OOD family) ----
    _Spec("bc-nuclei-worst", "multi-output", "test_ood", "r2", _SMALL,
          "From the mean measurements of a breast tumour's cell nuclei (10 features), predict four of their "
          "worst-case (largest) values: texture, smoothness, symmetry and fractal dimension (Wisconsin diagnostic "
          "breast cancer data).",
          "bc_worst", {}, seed=71),
    _Spec("multioutput-linear", "multi-output", "test_ood", "rmse", _SMALL,
          "Three correlated real-valued targets, each a noisy linear function of 30 features (10 informative).",
          "make_regression", {"n_samples": 3000, "n_features": 30, "n_informative": 10, "n_targets": 3,
                              "noise": 10.0}, seed=72),
    _Spec("multioutput-nonlinear", "multi-output", "test_ood", "r2", _SMALL,
          "Three non-linear targets of 8 uniform features (sines, squares, products, an exponential), with "
          "Gaussian noise.",
          "nonlinear_multi", {"n_samples": 3000}, seed=73),
    # ---- validation: one task per training family, disjoint from test_id (hyperparameters are chosen here) ----
    _Spec("binary-overlap", "tabular-binary", "validation", "roc_auc", _SMALL,
          "A synthetic binary classification problem: 12 numeric features, five of them informative; the two "
          "classes overlap.",
          "make_classification", {"n_samples": 3000, "n_features": 12, "n_informative": 5, "n_redundant": 2,
                                  "class_sep": 0.8, "flip_y": 0.02}, seed=16),
    _Spec("multiclass-6way", "tabular-multiclass", "validation", "accuracy", _SMALL,
          "A synthetic 6-class problem with 18 numeric features, eight of them informative.",
          "make_classification", {"n_samples": 4000, "n_features": 18, "n_informative": 8, "n_redundant": 3,
                                  "n_classes": 6, "class_sep": 1.1}, seed=27),
    _Spec("imbalanced-rare-binary", "imbalanced", "validation", "roc_auc", _SMALL,
          "A binary problem where only about 5% of the 10,000 rows are positive; the score is ROC AUC.",
          "make_classification", {"n_samples": 10000, "n_features": 16, "n_informative": 6, "n_redundant": 2,
                                  "weights": [0.95, 0.05], "class_sep": 0.9, "flip_y": 0.0}, seed=34),
    _Spec("highdim-sparse", "high-dim", "validation", "accuracy", _MEDIUM,
          "A wide binary problem: 1,200 features for 500 rows, about a dozen of them informative.",
          "make_classification", {"n_samples": 500, "n_features": 1200, "n_informative": 12, "n_redundant": 6,
                                  "class_sep": 1.1}, seed=44),
    _Spec("noisy-multiclass-3way", "noisy-labels", "validation", "macro_f1", _SMALL,
          "Three classes where about 20% of the labels (train and test alike) are wrong: they were drawn at "
          "random.",
          "make_classification", {"n_samples": 4000, "n_features": 16, "n_informative": 8, "n_redundant": 2,
                                  "n_classes": 3, "flip_y": 0.3, "class_sep": 1.2}, seed=54),
)

_SPEC_BY_ID = {s.id: s for s in SPECS}

#: HistGradientBoosting (default settings, random_state=0) scores on the hidden test rows, measured with
#: `python -m wmrl.domains.autoresearch.suite --measure` on scikit-learn 1.9.1. A task missing here gets its
#: reference computed at build time and cached in its meta.json.
_PINNED_REFERENCE: dict[str, float] = {
    'bc-diagnosis': 0.981132,
    'binary-synthetic': 0.908333,
    'binary-moons': 0.312557,
    'binary-large': 0.967612,
    'binary-hastie': 0.917333,
    'digits-8x8': 0.966667,
    'wine-cultivar': 0.932529,
    'multiclass-quantiles': 0.761333,
    'multiclass-5way': 0.64996,
    'multiclass-large': 0.77725,
    'iris-species': 0.177781,
    'imbalanced-fraud': 0.968973,
    'imbalanced-multiclass': 0.704442,
    'imbalanced-rare-noisy': 0.162139,
    'highdim-genomics': 0.89,
    'highdim-counts': 0.875556,
    'highdim-wide': 0.931556,
    'noisy-binary': 0.752,
    'noisy-multiclass': 0.553136,
    'noisy-binary-large': 0.422776,
    'diabetes-progression': 0.375198,
    'friedman1': 1.311753,
    'friedman2-impedance': 0.975185,
    'regression-sparse-linear': 0.893669,
    'regression-large': 1.169325,
    'bc-nuclei-worst': 0.615711,
    'multioutput-linear': 40.313682,
    'multioutput-nonlinear': 0.934411,
    'binary-overlap': 0.957553,
    'multiclass-6way': 0.803,
    'imbalanced-rare-binary': 0.962011,
    'highdim-sparse': 0.816,
    'noisy-multiclass-3way': 0.723579,
}


def _snake(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", str(name)).strip("_")


def _generate(spec: _Spec) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """X, Y (1-D, or 2-D for multi-output), feature names, target names."""
    from sklearn import datasets

    p, rs = spec.params, spec.seed
    if spec.gen == "load":
        name = p["name"]
        bunch = datasets.load_diabetes(scaled=False) if name == "diabetes" else getattr(datasets, f"load_{name}")()
        features = [_snake(n) for n in bunch.feature_names]
        return np.asarray(bunch.data, dtype=float), np.asarray(bunch.target), features, ["target"]
    if spec.gen == "bc_worst":
        bunch = datasets.load_breast_cancer()
        names = [_snake(n) for n in bunch.feature_names]
        targets = ["worst_texture", "worst_smoothness", "worst_symmetry", "worst_fractal_dimension"]
        features = names[:10]
        cols = [names.index(t) for t in targets]
        return np.asarray(bunch.data[:, :10], dtype=float), np.asarray(bunch.data[:, cols]), features, targets
    rng = np.random.default_rng(rs)
    if spec.gen == "make_classification":
        X, y = datasets.make_classification(random_state=rs, **p)
    elif spec.gen == "hastie":
        X, y = datasets.make_hastie_10_2(random_state=rs, **p)
        y = (y > 0).astype(int)
    elif spec.gen == "moons":
        X, y = datasets.make_moons(n_samples=p["n_samples"], noise=p["noise"], random_state=rs)
        X = np.hstack([X, rng.normal(size=(len(X), p["n_noise_features"]))])
    elif spec.gen == "gaussian_quantiles":
        X, y = datasets.make_gaussian_quantiles(random_state=rs, **p)
    elif spec.gen == "counts":
        n, d, k, s = p["n_samples"], p["n_features"], p["n_classes"], p["n_signal"]
        y = rng.integers(0, k, size=n)
        base = rng.gamma(0.3, 0.5, size=d)
        rates = np.tile(base, (k, 1))
        for c in range(k):
            rates[c, rng.choice(d, size=s, replace=False)] *= rng.uniform(2.0, 4.0, size=s)
        length = rng.poisson(1.0, size=(n, 1)) * 0.5 + 0.5
        X = rng.poisson(rates[y] * length).astype(float)
    elif spec.gen == "friedman1":
        X, y = datasets.make_friedman1(random_state=rs, **p)
    elif spec.gen == "friedman2":
        X, y = datasets.make_friedman2(random_state=rs, **p)
    elif spec.gen == "make_regression":
        X, y = datasets.make_regression(random_state=rs, **p)
    elif spec.gen == "nonlinear_multi":
        n = p["n_samples"]
        X = rng.uniform(size=(n, 8))
        y = np.column_stack([
            10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3],
            3 * X[:, 0] * X[:, 5] + 4 * X[:, 6] ** 2,
            np.exp(1.5 * X[:, 7]) - 2 * X[:, 1],
        ])
        y = y + rng.normal(scale=[1.0, 0.3, 0.3], size=y.shape)
    else:  # pragma: no cover - a spec typo
        raise ValueError(f"unknown generator {spec.gen!r}")
    y = np.asarray(y)
    features = [f"f{i}" for i in range(X.shape[1])]
    targets = ["target"] if y.ndim == 1 else [f"y{i}" for i in range(y.shape[1])]
    return np.asarray(X, dtype=float), y, features, targets


def _column_dtypes(X: np.ndarray) -> list[str]:
    integral = np.all(np.isfinite(X), axis=0) & np.all(X == np.round(X), axis=0)
    return ["int64" if i else "float64" for i in integral]


def _atomic_write(path: Path, write) -> None:
    """Write via a temporary file in the same folder, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _build_arrays(spec: _Spec, task_dir: Path) -> tuple[list[str], list[str]]:
    from sklearn.model_selection import train_test_split

    X, y, features, targets = _generate(spec)
    if spec.classification:
        y = y.astype(np.int64)
    else:
        y = y.astype(np.float64)
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=spec.test_size, random_state=spec.seed, stratify=y if spec.classification else None)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, X_train=X_tr, y_train=y_tr, X_test=X_te, y_test=y_te)

    _atomic_write(task_dir / "arrays.npz", write)
    return features, targets


def _read_meta(task_dir: Path) -> dict | None:
    try:
        return json.loads((task_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def _write_meta(task_dir: Path, meta: dict) -> None:
    _atomic_write(task_dir / "meta.json", lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=1)))


def _build(spec: _Spec, task_dir: Path) -> dict:
    """Generate a task's arrays and meta into `task_dir` (idempotent, safe to race)."""
    for stale in ("public/train.csv", "public/test_features.csv"):
        (task_dir / stale).unlink(missing_ok=True)
    features, targets = _build_arrays(spec, task_dir)
    a = _load_npz(task_dir / "arrays.npz")
    classes = sorted(int(c) for c in np.unique(a["y_train"])) if spec.classification else None
    if spec.classification:
        task_type = "binary" if len(classes) == 2 else "multiclass"
    else:
        task_type = "multi-output" if len(targets) > 1 else "regression"
    y_all = np.concatenate([a["y_train"], a["y_test"]]).astype(float)
    target_dtype = "int64" if spec.classification else _column_dtypes(y_all.reshape(len(y_all), -1))[0]
    meta = {
        "version": SUITE_VERSION, "fingerprint": spec.fingerprint(), "features": features,
        "feature_dtypes": _column_dtypes(np.vstack([a["X_train"], a["X_test"]])), "targets": targets,
        "target_dtype": target_dtype, "classes": classes, "task_type": task_type,
        "n_train": int(len(a["X_train"])), "n_test": int(len(a["X_test"])),
    }
    _write_meta(task_dir, meta)  # the scores come later, from the grader (suite.load_suite)
    return meta


def _task_from_meta(spec: _Spec, meta: dict, task_dir: Path) -> ARTask:
    """The task as its meta describes it; a score not measured yet is NaN."""
    classes = tuple(meta["classes"]) if meta["classes"] is not None else None
    b = meta.get("baseline", math.nan)
    r = _PINNED_REFERENCE.get(spec.id, meta.get("reference", math.nan))
    description = render_description(
        title=spec.id, blurb=spec.blurb, metric=spec.metric, budget_s=spec.budget_s, task_type=meta["task_type"],
        n_train=meta["n_train"], n_test=meta["n_test"], feature_columns=meta["features"],
        feature_dtypes=meta["feature_dtypes"], target_columns=meta["targets"], target_dtype=meta["target_dtype"],
        classes=classes, submission_columns=submission_columns_for(spec.metric, meta["task_type"], classes,
                                                                meta["targets"]))
    return ARTask(
        id=spec.id, family=spec.family, split=spec.split, metric=spec.metric, budget_s=spec.budget_s,
        description=description, baseline=float(b), reference=float(r), task_type=meta["task_type"],
        feature_columns=tuple(meta["features"]), target_columns=tuple(meta["targets"]), classes=classes,
        n_train=meta["n_train"], n_test=meta["n_test"], data_dir=str(task_dir), suite=SUITE_NAME,
        source=f"{spec.gen}:{spec.params.get('name', 'seed=' + str(spec.seed))}")


def submission_columns_for(metric: str, task_type: str, classes, targets) -> tuple[str, ...]:
    probe = ARTask(id="probe", family="", split="train", metric=metric, budget_s=1, description="", baseline=0.0,
                   reference=0.0, task_type=task_type, feature_columns=(), target_columns=tuple(targets),
                   classes=tuple(classes) if classes is not None else None, n_train=0, n_test=0, data_dir="")
    return probe.submission_columns


def default_cache_dir() -> Path:
    base = os.environ.get("WMRL_CACHE_DIR")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "wmrl"
    return root / SUITE_NAME / SUITE_VERSION


def task_for_spec(spec: _Spec, task_dir: Path) -> ARTask:
    """The task of `spec`, read back from `task_dir` or built into it (deterministic, safe to race)."""
    meta = _read_meta(task_dir)
    if (meta is None or meta.get("fingerprint") != spec.fingerprint() or meta.get("version") != SUITE_VERSION
            or not (task_dir / "arrays.npz").exists()):
        meta = _build(spec, task_dir)
    return _task_from_meta(spec, meta, task_dir)


def record_scores(task: ARTask, **scores: float) -> ARTask:
    """Keep measured `baseline` / `reference` scores in the task's meta; the task with them."""
    task_dir = Path(task.data_dir)
    meta = _read_meta(task_dir) or {}
    meta.update({k: float(v) for k, v in scores.items()})
    _write_meta(task_dir, meta)
    return replace(task, **{k: float(v) for k, v in scores.items()})


# --- data access (ours and the grader's; never the agent's) --------------------

_NPZ_CACHE: dict[tuple[str, int], dict[str, np.ndarray]] = {}


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    key = (str(path), path.stat().st_mtime_ns)
    hit = _NPZ_CACHE.get(key)
    if hit is None:
        with np.load(path, allow_pickle=False) as z:
            hit = {k: z[k] for k in z.files}
        if len(_NPZ_CACHE) >= 6:
            _NPZ_CACHE.pop(next(iter(_NPZ_CACHE)))
        _NPZ_CACHE[key] = hit
    return hit


def load_arrays(task: ARTask) -> dict[str, np.ndarray]:
    """X_train, y_train, X_test, y_test of a suite task (rebuilt if the cache was wiped)."""
    if task.suite != SUITE_NAME:
        raise ValueError(f"task {task.id!r} is not a {SUITE_NAME} task; use train_frame / hidden_labels")
    task_dir = Path(task.data_dir)
    path = task_dir / "arrays.npz"
    if not path.exists():  # deterministic: the same arrays again; the meta and its scores stay if still there
        spec = _SPEC_BY_ID[task.id]
        _build(spec, task_dir) if _read_meta(task_dir) is None else _build_arrays(spec, task_dir)
    return _load_npz(path)


def _read_csv(path: Path):
    import pandas as pd

    return pd.read_csv(path)


def train_frame(task: ARTask):
    """The public training table (features + target columns) as a DataFrame."""
    import pandas as pd

    if task.suite == SUITE_NAME:
        a = load_arrays(task)
        df = _features_frame(task, a["X_train"])
        y = a["y_train"].reshape(len(df), -1)
        for j, name in enumerate(task.target_columns):
            df[name] = y[:, j]
        return df
    df = _read_csv(Path(task.data_dir) / "train.csv")
    return pd.DataFrame(df)


def test_frame(task: ARTask):
    """The public test features as a DataFrame, in submission order."""
    if task.suite == SUITE_NAME:
        return _features_frame(task, load_arrays(task)["X_test"])
    return _read_csv(Path(task.data_dir) / "test_features.csv")


def hidden_labels(task: ARTask) -> np.ndarray:
    """The hidden test labels: shape (n_test,), or (n_test, n_targets) for multi-output. Grader-side only."""
    if task.suite == SUITE_NAME:
        y = load_arrays(task)["y_test"]
    else:
        df = _read_csv(Path(task.data_dir) / "test_labels.csv")
        y = df[list(task.target_columns)].to_numpy()
        if len(task.target_columns) == 1:
            y = y[:, 0]
    if task.task_type == "multi-output":
        return np.asarray(y, dtype=float).reshape(len(y), -1)
    if task.task_type == "regression":
        return np.asarray(y, dtype=float).reshape(-1)
    return np.asarray(y).reshape(-1)


def _features_frame(task: ARTask, X: np.ndarray):
    import pandas as pd

    meta = _read_meta(Path(task.data_dir)) or {}
    dtypes = meta.get("feature_dtypes") or ["float64"] * X.shape[1]
    cols = {name: (X[:, j].astype(np.int64) if dt == "int64" else X[:, j])
            for j, (name, dt) in enumerate(zip(task.feature_columns, dtypes))}
    return pd.DataFrame(cols)


def _write_table(path: Path, columns: Sequence[str], M: np.ndarray, dtypes: Sequence[str]) -> None:
    """A CSV with a header; int64 columns as integers, floats with 7 significant digits (fast: numpy)."""
    fmts = ["%d" if d == "int64" else "%.7g" for d in dtypes]

    def write(tmp: str) -> None:
        np.savetxt(tmp, M, fmt=fmts, delimiter=",", header=",".join(columns), comments="")

    _atomic_write(path, write)


def _ensure_public_csvs(task: ARTask) -> Path:
    public = Path(task.data_dir) / "public"
    train_csv, test_csv = public / "train.csv", public / "test_features.csv"
    if not (train_csv.exists() and test_csv.exists()):
        a = load_arrays(task)
        meta = _read_meta(Path(task.data_dir)) or {}
        fdt = meta.get("feature_dtypes") or ["float64"] * len(task.feature_columns)
        tdt = [meta.get("target_dtype", "float64")] * len(task.target_columns)
        y = a["y_train"].reshape(len(a["X_train"]), -1).astype(float)
        _write_table(train_csv, list(task.feature_columns) + list(task.target_columns),
                     np.hstack([a["X_train"], y]), list(fdt) + tdt)
        _write_table(test_csv, list(task.feature_columns), a["X_test"], fdt)
    return public


def materialize(task: ARTask, workdir: str | os.PathLike) -> None:
    """Write the task's public files (`train.csv`, `test_features.csv`, ...) into `workdir`.

    Nothing else: the hidden labels stay in the cache / task directory.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    src = _ensure_public_csvs(task) if task.suite == SUITE_NAME else Path(task.data_dir)
    for name in task.public_files:
        shutil.copyfile(src / name, workdir / name)


# --- descriptions ----------------------------------------------------------------

_TYPE_TEXT = {
    "binary": "binary classification",
    "multiclass": "multiclass classification",
    "regression": "regression",
    "multi-output": "multi-output regression",
}


def _column_summary(columns: Sequence[str], dtypes: Sequence[str]) -> str:
    if len(columns) <= 14:
        return ", ".join(f"`{c}` ({d})" for c, d in zip(columns, dtypes))
    kinds = sorted(set(dtypes))
    if len(kinds) == 1:
        kind_text = f"all {kinds[0]}"
    else:
        kind_text = ", ".join(f"{sum(d == k for d in dtypes)} {k}" for k in kinds)
    return f"{len(columns)} columns `{columns[0]}`, `{columns[1]}`, ..., `{columns[-1]}` ({kind_text})"


def render_description(*, title: str, blurb: str, metric: str, budget_s: int, task_type: str, n_train: int,
                       n_test: int, feature_columns: Sequence[str], feature_dtypes: Sequence[str],
                       target_columns: Sequence[str], target_dtype: str, classes: Sequence[Any] | None,
                       submission_columns: Sequence[str], extra_files: Sequence[tuple[str, str]] = ()) -> str:
    """The text the agent reads: the problem, the metric, the budget, the data inventory, the submission."""
    info = METRICS[metric]
    d, t = len(feature_columns), len(target_columns)
    direction = "higher is better" if info.higher_is_better else "lower is better"
    targets = ", ".join(f"`{c}`" for c in target_columns)
    if classes is not None:
        class_text = ", ".join(str(c) for c in classes)
        target_line = f"{targets} ({target_dtype}; {len(classes)} classes: {class_text})"
        problem = f"{_TYPE_TEXT.get(task_type, task_type)} ({len(classes)} classes)"
    else:
        target_line = f"{targets} ({target_dtype})"
        problem = _TYPE_TEXT.get(task_type, task_type) + (f" ({t} targets)" if t > 1 else "")
    lines = [
        f"# Task: {title}",
        "",
        blurb.strip(),
        "",
        "## Summary",
        "",
        f"- Problem: {problem}, tabular data.",
        f"- Rows: {n_train} training rows, {n_test} test rows; {d} feature columns.",
        f"- Target{'s' if t > 1 else ''}: {target_line}.",
        f"- Metric: `{metric}` ({direction}): {info.explanation}"
        + (f", computed for each target and averaged over the {t} targets" if t > 1 else "")
        + ". It is computed on the hidden labels of the test rows.",
        f"- Time budget: {budget_s} s of wall-clock time for your whole program, training and prediction "
        "included. A run that takes longer is killed and scores nothing.",
        "",
        "## Data inventory (in the working directory)",
        "",
        f"- `train.csv`: {n_train} rows × {d + t} columns (shape ({n_train}, {d + t})): the {d} feature columns, "
        f"then the target column{'s' if t > 1 else ''} {targets}.",
        f"- `test_features.csv`: {n_test} rows × {d} columns (shape ({n_test}, {d})): the same feature columns in "
        "the same order, without the target.",
    ]
    for name, what in extra_files:
        lines.append(f"- `{name}`: {what}")
    lines += [
        f"- Feature columns: {_column_summary(list(feature_columns), list(feature_dtypes))}.",
        "- Files are comma-separated with a header line.",
        "",
        "## Submission",
        "",
        f"Write `{SUBMISSION_FILE}` in the working directory: a header line, then exactly {n_test} rows, one per "
        "row of `test_features.csv`, in the same order, with "
        + ("exactly one column:" if len(submission_columns) == 1 else
           f"exactly these {len(submission_columns)} columns:"),
        "",
    ]
    kind = info.kind
    if kind == "label":
        lines.append(f"- `prediction`: the predicted class, one of {', '.join(str(c) for c in classes or ())}.")
    elif kind == "proba" and list(submission_columns) == ["prediction"]:
        pos = (classes or ("1",))[-1]
        lines.append(f"- `prediction`: the predicted probability (in [0, 1]) that {targets} is {pos}.")
    elif kind == "proba":
        lines.append("- " + ", ".join(f"`{c}`" for c in submission_columns)
                     + ": the predicted probability of each class (in [0, 1]; `p_<class>` is the probability of "
                       "that class). Each row is divided by its sum before scoring.")
    elif t > 1:
        lines.append("- " + ", ".join(f"`{c}`" for c in submission_columns)
                     + ": the predicted value of each target (finite numbers).")
    else:
        lines.append(f"- `prediction`: the predicted value of {targets} (a finite number).")
    lines += [
        "",
        "No index column (with pandas: `df.to_csv(\"submission.csv\", index=False)`), no missing or non-finite "
        "values. A missing or malformed submission scores nothing.",
    ]
    return "\n".join(lines) + "\n"
