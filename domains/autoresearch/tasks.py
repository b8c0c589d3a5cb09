"""The `autoresearch-mini` suite: small, offline ML tasks for AutoResearch agents.

An agent reads a task's `description`, writes experiment code that runs in a
sandbox holding the task's public files (`train.csv`, `test_features.csv`,
`sample_submission.csv`), and leaves `submission.csv` behind; `grader.grade` scores it against hidden labels
that never enter the sandbox, and `ARTask.normalize` turns the score into a
reward in [0, 1].

This module defines the tasks and owns their data (specs, generation, the
cache, the hidden labels, descriptions); it never grades. `suite.load_suite`
loads the suite and pins each task's baseline and reference scores with the
grader, so the grader can read task data without an import cycle.

Every task is built deterministically from scikit-learn's bundled datasets or
its generators with fixed seeds, so the suite needs no network. The tables look
like a competition's rather than a generator's: an id column, the target named
as the data names it (class labels as words where the data has them), varied
feature names, text categories and empty cells in some tasks, and a submission
of `<id>,<target>` rows matched by id. Generated
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

import dataclasses
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
SUITE_VERSION = "v2"
#: reward 1 needs the reference score plus this fraction of its gap to a perfect score
HEADROOM = 0.25
#: the reward of an attempt that fails (error, timeout, invalid submission)
FAILURE_REWARD = 0.0
SUBMISSION_FILE = "submission.csv"
PUBLIC_FILES = ("train.csv", "test_features.csv")
SAMPLE_SUBMISSION = "sample_submission.csv"
#: a feature column's dtype when its values are text categories
TEXT = "text"


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
    #: the column that names each row; set, the submission is `<id>,<target>` rows matched by id (any order)
    id_column: str | None = None

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
    def value_columns(self) -> tuple[str, ...]:
        """The submission's columns that hold predictions (all of them but the id column)."""
        return value_columns_for(self.metric, self.task_type, self.classes, self.target_columns, self.id_column)

    @property
    def submission_columns(self) -> tuple[str, ...]:
        return ((self.id_column,) if self.id_column else ()) + self.value_columns

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
    #: the target column's name (a tuple for multi-output); None keeps the generator's
    target: str | tuple[str, ...] | None = None
    #: the label of each class code 0..k-1 (words where the data has them); None keeps the codes
    class_names: tuple[Any, ...] | None = None
    id_column: str = "id"
    #: the first id; train rows take the first ids, test rows the next ones
    id_start: int = 0
    #: feature names: a prefix for `<prefix><i>`, or the names; None keeps the generator's
    features: str | tuple[str, ...] | None = None
    #: how many feature columns hold text categories (a numeric column binned into named levels)
    categorical: int = 0
    #: the share of empty cells in a quarter of the numeric feature columns (train and test alike)
    missing: float = 0.0

    @property
    def classification(self) -> bool:
        return METRICS[self.metric].kind != "value"

    def fingerprint(self) -> str:
        blob = json.dumps([SUITE_VERSION, dataclasses.asdict(self)], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


_SMALL, _MEDIUM, _LARGE = 60, 180, 300

SPECS: tuple[_Spec, ...] = (
    # ---- tabular-binary (training family) ----
    _Spec("bc-diagnosis", "tabular-binary", "train", "roc_auc", _SMALL,
          "Predict whether a breast tumour is malignant or benign from 30 measurements of its cell nuclei "
          "(Wisconsin diagnostic breast cancer data).",
          "load", {"name": "breast_cancer"}, seed=11,
          target="diagnosis", class_names=("malignant", "benign"), id_column="patient_id", id_start=842),
    _Spec("binary-synthetic", "tabular-binary", "train", "accuracy", _SMALL,
          "A synthetic binary classification problem: 20 numeric features, of which only some carry signal; the "
          "rest are noise or linear combinations of the informative ones.",
          "make_classification", {"n_samples": 2400, "n_features": 20, "n_informative": 6, "n_redundant": 4,
                                  "class_sep": 0.9, "flip_y": 0.01}, seed=12,
          target="label", features="f_", categorical=3, missing=0.05),
    _Spec("binary-moons", "tabular-binary", "train", "log_loss", _SMALL,
          "Two interleaving half-moons in the first two features, plus eight pure-noise features. The class boundary "
          "is strongly non-linear.",
          "moons", {"n_samples": 3000, "noise": 0.35, "n_noise_features": 8}, seed=13,
          target="side", class_names=("left", "right"), features="coord_", id_column="point_id"),
    _Spec("binary-large", "tabular-binary", "train", "roc_auc", _MEDIUM,
          "A larger synthetic binary classification problem (20,000 rows, 30 features, a few percent of labels "
          "flipped). Model fits take seconds here: budget your experiments.",
          "make_classification", {"n_samples": 20000, "n_features": 30, "n_informative": 10, "n_redundant": 5,
                                  "class_sep": 0.8, "flip_y": 0.03}, seed=14,
          target="converted", class_names=("no", "yes"), id_column="session_id", id_start=100000,
          features="feature_", categorical=4, missing=0.02),
    _Spec("binary-hastie", "tabular-binary", "test_id", "accuracy", _SMALL,
          "Ten standard-normal features; the class is whether their squared norm exceeds a threshold (the classic "
          "Hastie et al. boosting benchmark).",
          "hastie", {"n_samples": 6000}, seed=15, target="outcome", id_column="row_id", features="x"),
    # ---- tabular-multiclass (training family) ----
    _Spec("digits-8x8", "tabular-multiclass", "train", "accuracy", _SMALL,
          "Recognise handwritten digits 0-9 from 8x8 grey-level images, given as 64 pixel columns "
          "(`pixel_r_c`, values 0-16).",
          "load", {"name": "digits"}, seed=21, target="digit", id_column="image_id", id_start=1),
    _Spec("wine-cultivar", "tabular-multiclass", "train", "macro_f1", _SMALL,
          "Identify which of three cultivars a wine comes from, given 13 results of its chemical analysis.",
          "load", {"name": "wine"}, seed=22,
          target="cultivar", class_names=("barolo", "grignolino", "barbera"), id_column="Id", id_start=1),
    _Spec("multiclass-quantiles", "tabular-multiclass", "train", "accuracy", _SMALL,
          "Four classes formed by nested shells of a 6-dimensional Gaussian (the class is the quantile of the "
          "distance from the centre). No single feature separates the classes.",
          "gaussian_quantiles", {"n_samples": 3000, "n_features": 6, "n_classes": 4}, seed=23,
          target="shell", class_names=("core", "inner", "middle", "outer"), features="dim_"),
    _Spec("multiclass-5way", "tabular-multiclass", "train", "log_loss", _SMALL,
          "A synthetic 5-class problem with 25 numeric features and overlapping classes: well-calibrated "
          "probabilities matter more than hard decisions.",
          "make_classification", {"n_samples": 5000, "n_features": 25, "n_informative": 10, "n_redundant": 5,
                                  "n_classes": 5, "class_sep": 1.0}, seed=24,
          target="category", class_names=("A", "B", "C", "D", "E"), features="var_", categorical=2, missing=0.03),
    _Spec("multiclass-large", "tabular-multiclass", "train", "accuracy", _LARGE,
          "A larger synthetic 8-class problem (16,000 rows, 40 features). Each fit of a tree ensemble takes "
          "seconds: budget your experiments.",
          "make_classification", {"n_samples": 16000, "n_features": 40, "n_informative": 16, "n_redundant": 8,
                                  "n_classes": 8, "n_clusters_per_class": 2, "class_sep": 1.0}, seed=25,
          target="cover_type", class_names=(1, 2, 3, 4, 5, 6, 7, 8), id_column="Id", id_start=1, features="attr_",
          categorical=3, missing=0.02),
    _Spec("iris-species", "tabular-multiclass", "test_id", "log_loss", _SMALL,
          "Classify iris flowers into three species from four measurements of their petals and sepals.",
          "load", {"name": "iris"}, seed=26,
          target="species", class_names=("setosa", "versicolor", "virginica"), id_column="Id", id_start=1),
    # ---- imbalanced (training family) ----
    _Spec("imbalanced-fraud", "imbalanced", "train", "roc_auc", _MEDIUM,
          "Fraud-like detection: about 3% of the 20,000 rows are positive. Accuracy would be meaningless here; "
          "the score is ROC AUC.",
          "make_classification", {"n_samples": 20000, "n_features": 24, "n_informative": 8, "n_redundant": 4,
                                  "weights": [0.97, 0.03], "class_sep": 0.8, "flip_y": 0.0}, seed=31,
          target="is_fraud", id_column="transaction_id", id_start=300000, features="V", categorical=3, missing=0.02),
    _Spec("imbalanced-multiclass", "imbalanced", "train", "macro_f1", _SMALL,
          "Four classes with very unequal frequencies (about 70%, 20%, 7% and 3%). Every class counts equally in "
          "the score, so the rare ones matter.",
          "make_classification", {"n_samples": 6000, "n_features": 20, "n_informative": 8, "n_redundant": 2,
                                  "n_classes": 4, "weights": [0.70, 0.20, 0.07, 0.03], "class_sep": 1.0}, seed=32,
          target="severity", class_names=("none", "minor", "major", "critical"), features="m_"),
    _Spec("imbalanced-rare-noisy", "imbalanced", "test_id", "log_loss", _SMALL,
          "A binary problem with about 10% positives and some mislabelled rows; the score rewards calibrated "
          "probabilities.",
          "make_classification", {"n_samples": 8000, "n_features": 16, "n_informative": 6, "n_redundant": 2,
                                  "weights": [0.9, 0.1], "flip_y": 0.05, "class_sep": 1.0}, seed=33,
          target="churned", class_names=("no", "yes"), id_column="customer_id", id_start=5000, features="usage_",
          categorical=2, missing=0.05),
    # ---- high-dim (training family) ----
    _Spec("highdim-genomics", "high-dim", "train", "accuracy", _MEDIUM,
          "Expression-like data: far more features (2,000) than rows (400), only about 20 of them informative.",
          "make_classification", {"n_samples": 400, "n_features": 2000, "n_informative": 20, "n_redundant": 10,
                                  "class_sep": 1.2}, seed=41,
          target="phenotype", class_names=("control", "case"), id_column="sample_id", features="gene_"),
    _Spec("highdim-counts", "high-dim", "train", "macro_f1", _MEDIUM,
          "Bag-of-words-like counts: 800 non-negative integer columns (mostly zeros); three classes, each making "
          "a few dozen of the columns more frequent.",
          "counts", {"n_samples": 1800, "n_features": 800, "n_classes": 3, "n_signal": 30}, seed=42,
          target="topic", class_names=("sports", "politics", "science"), id_column="doc_id", features="word_"),
    _Spec("highdim-wide", "high-dim", "test_id", "roc_auc", _MEDIUM,
          "A wide binary problem: 1,000 features for 600 rows, 15 informative.",
          "make_classification", {"n_samples": 600, "n_features": 1000, "n_informative": 15, "n_redundant": 5,
                                  "class_sep": 1.0}, seed=43, target="response", features="feature_"),
    # ---- noisy-labels (training family) ----
    _Spec("noisy-binary", "noisy-labels", "train", "accuracy", _SMALL,
          "A binary problem where about 20% of the labels (train and test alike) are wrong: they were drawn at "
          "random.",
          "make_classification", {"n_samples": 4000, "n_features": 20, "n_informative": 8, "n_redundant": 2,
                                  "flip_y": 0.4, "class_sep": 1.2}, seed=51,
          target="label", features="x", missing=0.05),
    _Spec("noisy-multiclass", "noisy-labels", "train", "macro_f1", _SMALL,
          "Four classes where about 30% of the labels (train and test alike) are wrong: they were drawn at "
          "random.",
          "make_classification", {"n_samples": 5000, "n_features": 20, "n_informative": 10, "n_redundant": 2,
                                  "n_classes": 4, "flip_y": 0.4, "class_sep": 1.2}, seed=52,
          target="annotation", class_names=("a", "b", "c", "d"), features="f", categorical=2),
    _Spec("noisy-binary-large", "noisy-labels", "test_id", "log_loss", _MEDIUM,
          "A larger binary problem (20,000 rows) where about 10% of the labels are wrong. Fits take "
          "seconds: budget your experiments.",
          "make_classification", {"n_samples": 20000, "n_features": 30, "n_informative": 10, "n_redundant": 4,
                                  "flip_y": 0.2, "class_sep": 1.0}, seed=53,
          target="clicked", id_column="impression_id", id_start=1, features="c", categorical=3, missing=0.03),
    # ---- regression (held-out OOD family) ----
    _Spec("diabetes-progression", "regression", "test_ood", "r2", _SMALL,
          "Predict a quantitative measure of diabetes progression one year after baseline from age, sex, body "
          "mass index, blood pressure and six blood serum measurements (raw units).",
          "load", {"name": "diabetes"}, seed=61, target="progression", id_column="patient_id", id_start=1),
    _Spec("friedman1", "regression", "test_ood", "rmse", _SMALL,
          "A synthetic non-linear regression problem (Friedman #1): the target depends on five of the ten "
          "uniform features through sines, squares and products, plus Gaussian noise.",
          "friedman1", {"n_samples": 3000, "n_features": 10, "noise": 1.0}, seed=62, target="y", features="x"),
    _Spec("friedman2-impedance", "regression", "test_ood", "r2", _SMALL,
          "A synthetic regression problem (Friedman #2, the impedance of an AC circuit): four features on very "
          "different scales, a strongly non-linear target.",
          "friedman2", {"n_samples": 2000, "noise": 50.0}, seed=63,
          target="impedance", features=("resistance", "frequency", "inductance", "capacitance")),
    _Spec("regression-sparse-linear", "regression", "test_ood", "r2", _SMALL,
          "A linear regression problem with 100 features, only 10 of which matter, and noisy targets.",
          "make_regression", {"n_samples": 2000, "n_features": 100, "n_informative": 10, "noise": 20.0}, seed=64,
          features="var_", missing=0.03),
    _Spec("regression-large", "regression", "test_ood", "rmse", _MEDIUM,
          "A larger non-linear regression problem (Friedman #1 form, 20 features of which 5 matter, 10,000 rows). "
          "Fits take seconds: budget your experiments.",
          "friedman1", {"n_samples": 10000, "n_features": 20, "noise": 1.0}, seed=65,
          target="energy", id_column="row_id", features="sensor_", categorical=3, missing=0.02),
    # ---- multi-output (held-out OOD family) ----
    _Spec("bc-nuclei-worst", "multi-output", "test_ood", "r2", _SMALL,
          "From the mean measurements of a breast tumour's cell nuclei (10 features), predict four of their "
          "worst-case (largest) values: texture, smoothness, symmetry and fractal dimension (Wisconsin diagnostic "
          "breast cancer data).",
          "bc_worst", {}, seed=71, id_column="patient_id", id_start=842),
    _Spec("multioutput-linear", "multi-output", "test_ood", "rmse", _SMALL,
          "Three correlated real-valued targets, each a noisy linear function of 30 features (10 informative).",
          "make_regression", {"n_samples": 3000, "n_features": 30, "n_informative": 10, "n_targets": 3,
                              "noise": 10.0}, seed=72,
          target=("sales_north", "sales_south", "sales_west"), id_column="store_id", features="f", missing=0.02),
    _Spec("multioutput-nonlinear", "multi-output", "test_ood", "r2", _SMALL,
          "Three non-linear targets of 8 uniform features (sines, squares, products, an exponential), with "
          "Gaussian noise.",
          "nonlinear_multi", {"n_samples": 3000}, seed=73, target=("y1", "y2", "y3"), features="x", categorical=1),
    # ---- validation: one task per training family, disjoint from test_id (hyperparameters are chosen here) ----
    _Spec("binary-overlap", "tabular-binary", "validation", "roc_auc", _SMALL,
          "A synthetic binary classification problem: 12 numeric features, five of them informative; the two "
          "classes overlap.",
          "make_classification", {"n_samples": 3000, "n_features": 12, "n_informative": 5, "n_redundant": 2,
                                  "class_sep": 0.8, "flip_y": 0.02}, seed=16,
          target="approved", class_names=("no", "yes"), id_column="application_id", features="f_", categorical=2,
          missing=0.03),
    _Spec("multiclass-6way", "tabular-multiclass", "validation", "accuracy", _SMALL,
          "A synthetic 6-class problem with 18 numeric features, eight of them informative.",
          "make_classification", {"n_samples": 4000, "n_features": 18, "n_informative": 8, "n_redundant": 3,
                                  "n_classes": 6, "class_sep": 1.1}, seed=27,
          target="segment", class_names=("s1", "s2", "s3", "s4", "s5", "s6"), features="x"),
    _Spec("imbalanced-rare-binary", "imbalanced", "validation", "roc_auc", _SMALL,
          "A binary problem where only about 5% of the 10,000 rows are positive; the score is ROC AUC.",
          "make_classification", {"n_samples": 10000, "n_features": 16, "n_informative": 6, "n_redundant": 2,
                                  "weights": [0.95, 0.05], "class_sep": 0.9, "flip_y": 0.0}, seed=34,
          target="defect", id_column="part_id", features="sensor_", missing=0.03),
    _Spec("highdim-sparse", "high-dim", "validation", "accuracy", _MEDIUM,
          "A wide binary problem: 1,200 features for 500 rows, about a dozen of them informative.",
          "make_classification", {"n_samples": 500, "n_features": 1200, "n_informative": 12, "n_redundant": 6,
                                  "class_sep": 1.1}, seed=44,
          target="label", class_names=("neg", "pos"), id_column="sample_id", features="probe_"),
    _Spec("noisy-multiclass-3way", "noisy-labels", "validation", "macro_f1", _SMALL,
          "Three classes where about 20% of the labels (train and test alike) are wrong: they were drawn at "
          "random.",
          "make_classification", {"n_samples": 4000, "n_features": 16, "n_informative": 8, "n_redundant": 2,
                                  "n_classes": 3, "flip_y": 0.3, "class_sep": 1.2}, seed=54,
          target="grade", class_names=("low", "medium", "high"), features="q", categorical=2),
)

_SPEC_BY_ID = {s.id: s for s in SPECS}

#: HistGradientBoosting (default settings, random_state=0) scores on the hidden test rows, measured with
#: `python -m wmrl.domains.autoresearch.suite --measure` on scikit-learn 1.9.1. A task missing here gets its
#: reference computed at build time and cached in its meta.json.
_PINNED_REFERENCE: dict[str, float] = {
    'bc-diagnosis': 0.981132,
    'binary-synthetic': 0.9,
    'binary-moons': 0.312557,
    'binary-large': 0.967625,
    'binary-hastie': 0.917333,
    'digits-8x8': 0.966667,
    'wine-cultivar': 0.932529,
    'multiclass-quantiles': 0.761333,
    'multiclass-5way': 0.648549,
    'multiclass-large': 0.77175,
    'iris-species': 0.177781,
    'imbalanced-fraud': 0.965623,
    'imbalanced-multiclass': 0.704442,
    'imbalanced-rare-noisy': 0.168672,
    'highdim-genomics': 0.89,
    'highdim-counts': 0.875556,
    'highdim-wide': 0.931556,
    'noisy-binary': 0.754,
    'noisy-multiclass': 0.556126,
    'noisy-binary-large': 0.434548,
    'diabetes-progression': 0.375198,
    'friedman1': 1.311753,
    'friedman2-impedance': 0.975185,
    'regression-sparse-linear': 0.876407,
    'regression-large': 1.25425,
    'bc-nuclei-worst': 0.615711,
    'multioutput-linear': 43.331268,
    'multioutput-nonlinear': 0.927927,
    'binary-overlap': 0.957809,
    'multiclass-6way': 0.803,
    'imbalanced-rare-binary': 0.959481,
    'highdim-sparse': 0.816,
    'noisy-multiclass-3way': 0.7187,
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


#: the levels a categorical column's values are drawn from, and the names such columns take
_LEVELS = (("red", "green", "blue", "amber", "violet", "grey"),
           ("north", "south", "east", "west", "central", "coastal"),
           ("basic", "plus", "premium", "pro", "free", "trial"),
           ("alpha", "beta", "gamma", "delta", "kappa", "omega"))
_CATEGORY_NAMES = ("region", "segment", "channel", "plan", "tier", "colour", "device", "source", "zone", "grade_band")


def _shape_table(spec: _Spec, X: np.ndarray, y: np.ndarray, features: list[str], targets: list[str]
                 ) -> tuple[np.ndarray, list[str], list[str], dict[str, list[str]]]:
    """The generator's arrays as a competition would publish them.

    Names from the spec; `categorical` columns binned at their quantiles into
    3-6 levels whose names are shuffled (nominal: their order carries nothing);
    `missing` empties cells of a quarter of the other columns. Returns X (text
    columns hold level codes, empty cells NaN), feature names, target names and
    each text column's levels in code order.
    """
    rng = np.random.default_rng([spec.seed, 1])
    d = X.shape[1]
    if isinstance(spec.features, str):
        features = [f"{spec.features}{i}" for i in range(d)]
    elif spec.features is not None:
        features = list(spec.features)
    if spec.target is not None:
        targets = [spec.target] if isinstance(spec.target, str) else list(spec.target)
    if len(features) != d or len(targets) != (1 if y.ndim == 1 else y.shape[1]):
        raise ValueError(f"task {spec.id!r}: the spec names {len(features)} features / {len(targets)} targets")
    X = X.copy()
    categories: dict[str, list[str]] = {}
    cat_cols = rng.choice(d, size=spec.categorical, replace=False) if spec.categorical else np.array([], int)
    names = rng.permutation(len(_CATEGORY_NAMES))
    for n, j in enumerate(cat_cols):
        levels = int(rng.integers(3, 7))
        edges = np.quantile(X[:, j], np.linspace(0, 1, levels + 1)[1:-1])
        X[:, j] = np.searchsorted(edges, X[:, j])
        features[j] = _CATEGORY_NAMES[names[n % len(names)]] + ("" if n < len(names) else f"_{n}")
        words = _LEVELS[int(rng.integers(len(_LEVELS)))]
        categories[features[j]] = [words[k] for k in rng.choice(len(words), size=levels, replace=False)]
    if spec.missing > 0:
        numeric = [j for j in range(d) if j not in set(cat_cols.tolist())]
        for j in rng.choice(numeric, size=max(1, len(numeric) // 4), replace=False):
            X[rng.random(len(X)) < spec.missing, j] = np.nan
    return X, features, targets, categories


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


def _build_arrays(spec: _Spec, task_dir: Path) -> tuple[list[str], list[str], dict[str, list[str]]]:
    from sklearn.model_selection import train_test_split

    X, y, features, targets = _generate(spec)
    if spec.classification:
        y = y.astype(np.int64)
    else:
        y = y.astype(np.float64)
    X, features, targets, categories = _shape_table(spec, X, y, features, targets)
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=spec.test_size, random_state=spec.seed, stratify=y if spec.classification else None)
    ids = spec.id_start + np.arange(len(X_tr) + len(X_te), dtype=np.int64)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, X_train=X_tr, y_train=y_tr, X_test=X_te, y_test=y_te, id_train=ids[:len(X_tr)],
                     id_test=ids[len(X_tr):])

    _atomic_write(task_dir / "arrays.npz", write)
    return features, targets, categories


def _read_meta(task_dir: Path) -> dict | None:
    try:
        return json.loads((task_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def _write_meta(task_dir: Path, meta: dict) -> None:
    _atomic_write(task_dir / "meta.json", lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=1)))


def _build(spec: _Spec, task_dir: Path) -> dict:
    """Generate a task's arrays and meta into `task_dir` (idempotent, safe to race)."""
    for stale in ("public/train.csv", "public/test_features.csv", f"public/{SAMPLE_SUBMISSION}"):
        (task_dir / stale).unlink(missing_ok=True)
    features, targets, categories = _build_arrays(spec, task_dir)
    a = _load_npz(task_dir / "arrays.npz")
    codes = sorted(int(c) for c in np.unique(a["y_train"])) if spec.classification else None
    labels = None
    if codes is not None:
        if codes != list(range(len(codes))):
            raise ValueError(f"task {spec.id!r}: class codes {codes} are not 0..k-1")
        labels = [spec.class_names[c] for c in codes] if spec.class_names else codes
    if spec.classification:
        task_type = "binary" if len(codes) == 2 else "multiclass"
        target_dtype = "int64" if all(isinstance(v, int) for v in labels) else TEXT
    else:
        task_type = "multi-output" if len(targets) > 1 else "regression"
        y_all = np.concatenate([a["y_train"], a["y_test"]]).astype(float)
        target_dtype = _column_dtypes(y_all.reshape(len(y_all), -1))[0]
    dtypes = _column_dtypes(np.vstack([a["X_train"], a["X_test"]]))
    meta = {
        "version": SUITE_VERSION, "fingerprint": spec.fingerprint(), "features": features,
        "feature_dtypes": [TEXT if f in categories else dt for f, dt in zip(features, dtypes)],
        "categories": categories, "targets": targets, "target_dtype": target_dtype,
        # the labels in the order of the probability columns: numbers by value, words alphabetically
        "classes": sorted(labels, key=_class_order) if labels is not None else None,
        "labels": labels,  # the label of each class code present, in code order
        "id_column": spec.id_column, "task_type": task_type,
        "n_train": int(len(a["X_train"])), "n_test": int(len(a["X_test"])),
    }
    _write_meta(task_dir, meta)  # the scores come later, from the grader (suite.load_suite)
    return meta


def _class_order(label: Any) -> tuple:
    """Class labels sort as numbers when they all are, else as text (the order of probability columns)."""
    try:
        return (0, float(label), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(label))


def _task_from_meta(spec: _Spec, meta: dict, task_dir: Path) -> ARTask:
    """The task as its meta describes it; a score not measured yet is NaN."""
    classes = tuple(meta["classes"]) if meta["classes"] is not None else None
    b = meta.get("baseline", math.nan)
    r = _PINNED_REFERENCE.get(spec.id, meta.get("reference", math.nan))
    a = _load_npz(task_dir / "arrays.npz")
    X = np.vstack([a["X_train"], a["X_test"]])
    missing = [f for j, f in enumerate(meta["features"]) if np.isnan(X[:, j]).any()]
    description = render_description(
        title=spec.id, blurb=spec.blurb, metric=spec.metric, budget_s=spec.budget_s, task_type=meta["task_type"],
        n_train=meta["n_train"], n_test=meta["n_test"], feature_columns=meta["features"],
        feature_dtypes=meta["feature_dtypes"], target_columns=meta["targets"], target_dtype=meta["target_dtype"],
        classes=classes, id_column=meta["id_column"], categories=meta["categories"], missing_columns=missing)
    return ARTask(
        id=spec.id, family=spec.family, split=spec.split, metric=spec.metric, budget_s=spec.budget_s,
        description=description, baseline=float(b), reference=float(r), task_type=meta["task_type"],
        feature_columns=tuple(meta["features"]), target_columns=tuple(meta["targets"]), classes=classes,
        n_train=meta["n_train"], n_test=meta["n_test"], data_dir=str(task_dir), suite=SUITE_NAME,
        source=f"{spec.gen}:{spec.params.get('name', 'seed=' + str(spec.seed))}",
        public_files=PUBLIC_FILES + (SAMPLE_SUBMISSION,), id_column=meta["id_column"])


def value_columns_for(metric: str, task_type: str, classes: Sequence[Any] | None, targets: Sequence[str],
                      id_column: str | None = None) -> tuple[str, ...]:
    """The prediction columns of a task's submission.

    With an id column (the competition layout): the target's own name, holding
    a class, a value, or for binary probability metrics the positive (last)
    class's probability; one column per class label for multiclass
    probabilities; one per target for multi-output. Without one (external
    directories that match rows by order): `prediction`, or `p_<class>` per class.
    """
    kind = METRICS[metric].kind
    binary_proba = kind == "proba" and task_type == "binary"
    if id_column:
        if kind == "proba" and not binary_proba:
            return tuple(label_key(c) for c in classes or ())
        return tuple(targets)
    if kind == "proba" and not (binary_proba and metric == "roc_auc"):
        return tuple(f"p_{label_key(c)}" for c in classes or ())
    if kind == "value" and len(targets) > 1:
        return tuple(targets)
    return ("prediction",)


def submission_columns_for(metric: str, task_type: str, classes: Sequence[Any] | None, targets: Sequence[str],
                           id_column: str | None = None) -> tuple[str, ...]:
    head = (id_column,) if id_column else ()
    return head + value_columns_for(metric, task_type, classes, targets, id_column)


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


def _labels(task: ARTask, codes: np.ndarray) -> np.ndarray:
    """Class codes as the task's labels (words where it has them)."""
    labels = (_read_meta(Path(task.data_dir)) or {}).get("labels")
    if labels is None:  # a cache written before the codes had labels
        return codes
    return np.asarray(labels, dtype=object)[codes.astype(np.int64)]


def _targets(task: ARTask, y: np.ndarray) -> np.ndarray:
    return _labels(task, y) if task.classes is not None else y


def train_frame(task: ARTask):
    """The public training table (id, features, target columns) as a DataFrame."""
    if task.suite == SUITE_NAME:
        a = load_arrays(task)
        df = _features_frame(task, a["X_train"], a["id_train"])
        y = _targets(task, a["y_train"]).reshape(len(df), -1)
        for j, name in enumerate(task.target_columns):
            df[name] = y[:, j]
        return df
    return _read_csv(Path(task.data_dir) / "train.csv")


def test_frame(task: ARTask):
    """The public test table (id and features) as a DataFrame, in the order of test_features.csv."""
    if task.suite == SUITE_NAME:
        a = load_arrays(task)
        return _features_frame(task, a["X_test"], a["id_test"])
    return _read_csv(Path(task.data_dir) / "test_features.csv")


def test_ids(task: ARTask) -> list[str] | None:
    """The test rows' ids (canonical text, `label_key`) in file order; None for a task without an id column."""
    if not task.id_column:
        return None
    ids = load_arrays(task)["id_test"] if task.suite == SUITE_NAME else test_frame(task)[task.id_column]
    return [label_key(v) for v in np.asarray(ids).tolist()]


def hidden_labels(task: ARTask) -> np.ndarray:
    """The hidden test labels in the order of test_features.csv: shape (n_test,), or (n_test, n_targets) for
    multi-output. Grader-side only."""
    if task.suite == SUITE_NAME:
        y = _targets(task, load_arrays(task)["y_test"])
    else:
        df = _read_csv(Path(task.data_dir) / "test_labels.csv")
        if task.id_column and task.id_column in df.columns:  # labels may come in another order: align them by id
            at = {label_key(v): i for i, v in enumerate(df[task.id_column].tolist())}
            df = df.iloc[[at[k] for k in test_ids(task)]]
        y = df[list(task.target_columns)].to_numpy()
        if len(task.target_columns) == 1:
            y = y[:, 0]
    if task.task_type == "multi-output":
        return np.asarray(y, dtype=float).reshape(len(y), -1)
    if task.task_type == "regression":
        return np.asarray(y, dtype=float).reshape(-1)
    return np.asarray(y).reshape(-1)


def _features_frame(task: ARTask, X: np.ndarray, ids: np.ndarray):
    import pandas as pd

    meta = _read_meta(Path(task.data_dir)) or {}
    dtypes = meta.get("feature_dtypes") or ["float64"] * X.shape[1]
    categories = meta.get("categories") or {}
    cols: dict[str, Any] = {task.id_column: ids} if task.id_column else {}
    for j, (name, dt) in enumerate(zip(task.feature_columns, dtypes)):
        if dt == TEXT:
            cols[name] = np.asarray(categories[name], dtype=object)[X[:, j].astype(np.int64)]
        else:
            cols[name] = X[:, j].astype(np.int64) if dt == "int64" else X[:, j]
    return pd.DataFrame(cols)


def sample_submission(task: ARTask):
    """A valid submission of constant predictions (the first class, uniform probabilities, the train mean),
    in the task's layout: what a competition ships as `sample_submission.csv`."""
    import pandas as pd

    n = task.n_test
    cols = list(task.value_columns)
    kind = task.metric_info.kind
    if kind == "label":
        values = {cols[0]: [task.classes[0]] * n}
    elif kind == "proba":
        values = {c: [round(1.0 / max(2, len(cols)), 6)] * n for c in cols}
    else:
        means = train_frame(task)[list(task.target_columns)].to_numpy(dtype=float).mean(axis=0)
        values = {c: [round(float(m), 4)] * n for c, m in zip(cols, means)}
    frame = pd.DataFrame(values)
    if task.id_column:
        frame.insert(0, task.id_column, test_frame(task)[task.id_column].to_numpy())
    return frame


def _write_csv(path: Path, frame) -> None:
    _atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False, float_format="%.7g"))


def _ensure_public_csvs(task: ARTask) -> Path:
    public = Path(task.data_dir) / "public"
    if not all((public / name).exists() for name in task.public_files):
        _write_csv(public / "train.csv", train_frame(task))
        _write_csv(public / "test_features.csv", test_frame(task))
        _write_csv(public / SAMPLE_SUBMISSION, sample_submission(task))
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


def _names(columns: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(f"`{c}`" for c in columns[:limit])
    return shown + (f" and {len(columns) - limit} more" if len(columns) > limit else "")


def render_description(*, title: str, blurb: str, metric: str, budget_s: int, task_type: str, n_train: int,
                       n_test: int, feature_columns: Sequence[str], feature_dtypes: Sequence[str],
                       target_columns: Sequence[str], target_dtype: str, classes: Sequence[Any] | None,
                       id_column: str | None = None, categories: dict[str, Sequence[str]] | None = None,
                       missing_columns: Sequence[str] = (), sample_submission: bool = True) -> str:
    """The text the agent reads: the problem, the metric, the budget, the data inventory, the submission.

    `categories` names the text columns (with their levels, when known);
    `missing_columns` the columns with empty cells; `sample_submission` says
    that `sample_submission.csv` (right header, right ids) is in the directory.
    """
    info = METRICS[metric]
    d, t = len(feature_columns), len(target_columns)
    direction = "higher is better" if info.higher_is_better else "lower is better"
    targets = ", ".join(f"`{c}`" for c in target_columns)
    value_cols = value_columns_for(metric, task_type, classes, target_columns, id_column)
    submission_cols = ((id_column,) if id_column else ()) + value_cols
    if classes is not None:
        class_text = ", ".join(str(c) for c in classes)
        target_line = f"{targets} ({target_dtype}; {len(classes)} classes: {class_text})"
        problem = f"{_TYPE_TEXT.get(task_type, task_type)} ({len(classes)} classes)"
    else:
        target_line = f"{targets} ({target_dtype})"
        problem = _TYPE_TEXT.get(task_type, task_type) + (f" ({t} targets)" if t > 1 else "")
    idc = f"`{id_column}`" if id_column else ""
    lines = [
        f"# Task: {title}",
        "",
        blurb.strip(),
        "",
        "## Summary",
        "",
        f"- Problem: {problem}, tabular data.",
        f"- Rows: {n_train} training rows, {n_test} test rows; {d} feature columns"
        + (f" and an id column {idc}." if id_column else "."),
        f"- Target{'s' if t > 1 else ''}: {target_line}.",
        f"- Metric: `{metric}` ({direction}): {info.explanation}"
        + (f", computed for each target and averaged over the {t} targets" if t > 1 else "")
        + ". It is computed on the hidden labels of the test rows.",
        f"- Time budget: {budget_s} s of wall-clock time for your whole program, training and prediction "
        "included. A run that takes longer is killed and scores nothing.",
        "",
        "## Data inventory (in the working directory)",
        "",
        f"- `train.csv`: {n_train} rows × {d + t + bool(id_column)} columns: "
        + (f"the id column {idc}, " if id_column else "")
        + f"the {d} feature columns, then the target column{'s' if t > 1 else ''} {targets}.",
        f"- `test_features.csv`: {n_test} rows × {d + bool(id_column)} columns: "
        + (f"the id column {idc} and " if id_column else "") + "the same feature columns in the same order, "
        "without the target.",
    ]
    if sample_submission:
        lines.append(f"- `sample_submission.csv`: {n_test} rows × {len(submission_cols)} columns: an example of "
                     "the submission format (constant predictions, not a good submission).")
    lines.append(f"- Feature columns: {_column_summary(list(feature_columns), list(feature_dtypes))}.")
    text_cols = [c for c, dt in zip(feature_columns, feature_dtypes) if dt in (TEXT, "string")]
    if text_cols:
        levels = categories or {}
        lines.append("- Categorical columns (text values): " + "; ".join(
            f"`{c}` ({', '.join(str(v) for v in levels[c])})" if c in levels else f"`{c}`" for c in text_cols[:8])
            + ("; ..." if len(text_cols) > 8 else "") + ".")
    if missing_columns:
        lines.append(f"- Missing values: {_names(list(missing_columns))} have empty cells, in train and test alike.")
    lines += [
        "- Files are comma-separated with a header line.",
        "",
        "## Submission",
        "",
    ]
    if id_column:
        lines.append(f"Write `{SUBMISSION_FILE}` in the working directory: a header line, then one row for each of "
                     f"the {n_test} rows of `test_features.csv` (matched by {idc}, in any order), with exactly "
                     f"these {len(submission_cols)} columns:")
        lines += ["", f"- {idc}: the row's id from `test_features.csv`."]
    else:
        lines.append(f"Write `{SUBMISSION_FILE}` in the working directory: a header line, then exactly {n_test} "
                     "rows, one per row of `test_features.csv`, in the same order, with "
                     + ("exactly one column:" if len(value_cols) == 1 else
                        f"exactly these {len(value_cols)} columns:"))
        lines.append("")
    kind = info.kind
    first = value_cols[0]
    if kind == "label":
        lines.append(f"- `{first}`: the predicted class, one of {', '.join(str(c) for c in classes or ())}.")
    elif kind == "proba" and len(value_cols) == 1:
        pos = (classes or ("1",))[-1]
        lines.append(f"- `{first}`: the predicted probability (in [0, 1]) that {targets} is {pos}.")
    elif kind == "proba":
        named = "the class it is named after" if id_column else "that class (`p_<class>`)"
        lines.append("- " + ", ".join(f"`{c}`" for c in value_cols)
                     + f": the predicted probability of each class (in [0, 1]; a column holds the probability of "
                       f"{named}). Each row is divided by its sum before scoring.")
    elif t > 1:
        lines.append("- " + ", ".join(f"`{c}`" for c in value_cols)
                     + ": the predicted value of each target (finite numbers).")
    else:
        lines.append(f"- `{first}`: the predicted value of {targets} (a finite number).")
    lines += [
        "",
        "The first line of the file is:",
        "",
        "```",
        ",".join(submission_cols),
        "```",
        "",
        "No index column (with pandas: `df.to_csv(\"submission.csv\", index=False)`), no missing or non-finite "
        "values. A missing or malformed submission scores nothing.",
    ]
    return "\n".join(lines) + "\n"
