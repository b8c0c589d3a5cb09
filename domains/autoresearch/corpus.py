"""The SFT corpus of the embedded default agent: task prompts and scikit-learn solution scripts.

`generate_script(spec, rng)` writes one short, valid solution script for a task
described by a :class:`TaskSpec`. The scripts vary along the axes a real agent's
would (how the target is found, preprocessing, estimator family and its
hyperparameters, an optional hold-out or cross-validation printout, NaN
filling). Half of them (`GOOD_FRACTION`) take hyperparameters from a good range,
as a pretrained LM's prior would; the other half are *mediocre* -- shallow
trees, tiny forests, strong regularisation, k too large, too few boosting
rounds -- so the agent fine-tuned on them starts where RL has room to improve.

The data contract every script follows: the working directory holds
`train.csv` (an optional id column, feature columns, target column(s)) and
`test_features.csv` (the id and feature columns); the script writes
`submission.csv` with the columns `spec.columns` after the id column (if the
task has one; rows then go in any order, else in the order of
test_features.csv):

* label metrics (accuracy, macro_f1) and regression metrics (r2, rmse): one
  column (the target's name, or `prediction` for a task without an id column);
* probability metrics (roc_auc, log_loss): one column holding the positive
  (last) class's probability, or one column per class in sorted class order
  (`predict_proba`'s columns);
* multioutput: one column per target, named as the target.

Text (categorical) columns are encoded (one-hot, ordinal, or dropped) and
empty cells filled where the task has them; scripts for tasks without them do
so sometimes too, harmlessly.

The examples are written in the chat protocol the agent is prompted in
(`protocol.py`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from wmrl.domains.autoresearch.feedback import report
from wmrl.domains.autoresearch.protocol import format_prompt, format_reply, next_observation
from wmrl.domains.autoresearch.tasks import TEXT, render_description, value_columns_for

#: bump when the scripts or the prompt format change: it keys the agent cache
CORPUS_VERSION = "ar-corpus-v8"

KINDS = ("classification", "regression", "multioutput")
METRICS = ("accuracy", "macro_f1", "roc_auc", "log_loss", "r2", "rmse")
_REGRESSION_METRICS = ("r2", "rmse")
_PROBA_METRICS = ("roc_auc", "log_loss")


@dataclass(frozen=True)
class TaskSpec:
    """What a solution script needs to know about a task (`spec_for` maps a task to it)."""

    kind: str  # "classification" | "regression" | "multioutput"
    targets: tuple[str, ...]  # target column name(s) in train.csv
    metric: str  # accuracy | macro_f1 | roc_auc | log_loss | r2 | rmse
    columns: tuple[str, ...]  # the submission's prediction columns (after the id column, if any)
    id_column: str | None = None
    text: bool = False  # some feature columns hold text categories
    missing: bool = False  # some feature cells are empty

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"TaskSpec.kind must be one of {KINDS}, got {self.kind!r}")
        if self.metric not in METRICS:
            raise ValueError(f"TaskSpec.metric must be one of {METRICS}, got {self.metric!r}")
        if not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise ValueError("TaskSpec.targets must be a non-empty tuple of column names")
        if self.kind != "multioutput" and len(self.targets) != 1:
            raise ValueError(f"a {self.kind} task has exactly one target, got {self.targets!r}")
        if self.kind == "regression" and self.metric not in _REGRESSION_METRICS:
            raise ValueError(f"a regression task needs r2 or rmse, got {self.metric!r}")
        if self.kind == "classification" and self.metric in _REGRESSION_METRICS:
            raise ValueError(f"a classification task cannot use {self.metric!r}")
        if not self.columns or (self.multi and len(self.columns) != len(self.targets)):
            raise ValueError(f"TaskSpec.columns must name the submission's prediction columns, got {self.columns!r}")

    @property
    def regression(self) -> bool:
        return self.kind == "regression" or (self.kind == "multioutput" and self.metric in _REGRESSION_METRICS)

    @property
    def multi(self) -> bool:
        return self.kind == "multioutput"

    @property
    def proba(self) -> bool:
        return self.kind == "classification" and self.metric in _PROBA_METRICS

    @property
    def positive_proba(self) -> bool:
        """One probability column: the positive (last) class's."""
        return self.proba and len(self.columns) == 1


# ----------------------------------------------------------------------------- estimator families


def _pick(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


@dataclass
class _Est:
    family: str
    imports: list[str]
    code: str  # constructor expression
    scale_sensitive: bool = False  # kNN/SVM/linear/MLP: unscaled features hurt
    subsample: bool = False  # O(n^2) fits: train on at most 3000 rows
    multi_native: bool = True  # supports a 2-d y without a MultiOutput wrapper
    pre: list[str] = dataclasses.field(default_factory=list)  # lines the constructor needs first


def _fmt(x: float) -> str:
    return repr(x) if not isinstance(x, float) else f"{x:g}"


def _linear(spec: TaskSpec, rng, good: bool) -> _Est:
    if spec.regression:
        which = _pick(rng, ["ols", "ridge", "ridge", "lasso", "enet"])
        if which == "ols":
            return _Est("linear", ["from sklearn.linear_model import LinearRegression"], "LinearRegression()", True)
        if which == "ridge":
            a = _pick(rng, [0.1, 1.0, 3.0]) if good else _pick(rng, [300.0, 1000.0, 5000.0])
            return _Est("linear", ["from sklearn.linear_model import Ridge"], f"Ridge(alpha={_fmt(a)})", True)
        a = _pick(rng, [0.001, 0.01]) if good else _pick(rng, [5.0, 20.0, 50.0])
        if which == "lasso":
            return _Est("linear", ["from sklearn.linear_model import Lasso"], f"Lasso(alpha={_fmt(a)})", True)
        return _Est("linear", ["from sklearn.linear_model import ElasticNet"],
                    f"ElasticNet(alpha={_fmt(a)}, l1_ratio={_pick(rng, [0.2, 0.5, 0.8])})", True)
    if not spec.proba and rng.random() < 0.25:
        a = _pick(rng, [0.1, 1.0]) if good else _pick(rng, [1000.0, 10000.0])
        return _Est("linear", ["from sklearn.linear_model import RidgeClassifier"], f"RidgeClassifier(alpha={_fmt(a)})",
                    True, multi_native=False)
    c = _pick(rng, [0.3, 1.0, 3.0, 10.0]) if good else _pick(rng, [0.0003, 0.001, 0.003, 0.01])
    it = _pick(rng, [200, 500, 1000]) if good else _pick(rng, [50, 100, 200])
    return _Est("linear", ["from sklearn.linear_model import LogisticRegression"],
                f"LogisticRegression(C={_fmt(c)}, max_iter={it})", True, multi_native=False)


def _knn(spec: TaskSpec, rng, good: bool) -> _Est:
    name = "KNeighborsRegressor" if spec.regression else "KNeighborsClassifier"
    k = _pick(rng, [3, 5, 7, 11]) if good else _pick(rng, [30, 40, 50])
    w = _pick(rng, ["uniform", "distance"]) if good else "uniform"
    arg = f"n_neighbors={k}" + (', weights="distance"' if w == "distance" else "")
    return _Est("knn", [f"from sklearn.neighbors import {name}"], f"{name}({arg})", True)


def _tree(spec: TaskSpec, rng, good: bool) -> _Est:
    name = "DecisionTreeRegressor" if spec.regression else "DecisionTreeClassifier"
    if good:
        arg = f"max_depth={_pick(rng, [6, 8, 10, None])}, min_samples_leaf={_pick(rng, [1, 3, 5])}"
    else:
        arg = f"max_depth={_pick(rng, [1, 2, 3])}"
    return _Est("tree", [f"from sklearn.tree import {name}"], f"{name}({arg}, random_state=0)")


def _forest(spec: TaskSpec, rng, good: bool) -> _Est:
    kind = _pick(rng, ["RandomForest", "RandomForest", "ExtraTrees"])
    name = kind + ("Regressor" if spec.regression else "Classifier")
    if good:
        arg = f"n_estimators={_pick(rng, [100, 200])}, max_depth={_pick(rng, [None, 12, 16])}, n_jobs=-1"
    else:
        arg = f"n_estimators={_pick(rng, [3, 5, 8])}, max_depth={_pick(rng, [2, 3, 4])}"
    return _Est("forest", [f"from sklearn.ensemble import {name}"], f"{name}({arg}, random_state=0)")


def _boosting(spec: TaskSpec, rng, good: bool) -> _Est:
    if rng.random() < 0.35:
        name = "GradientBoostingRegressor" if spec.regression else "GradientBoostingClassifier"
        if good:
            arg = f"n_estimators={_pick(rng, [80, 100])}, learning_rate=0.1, max_depth=3"
        else:
            arg = f"n_estimators={_pick(rng, [5, 10, 20])}, learning_rate={_pick(rng, [0.01, 0.03])}, max_depth=2"
        return _Est("boosting", [f"from sklearn.ensemble import {name}"], f"{name}({arg}, random_state=0)",
                    multi_native=False)
    name = "HistGradientBoostingRegressor" if spec.regression else "HistGradientBoostingClassifier"
    if good:
        arg = f"max_iter={_pick(rng, [100, 200, 300])}, learning_rate={_pick(rng, [0.05, 0.1])}"
    else:
        arg = f"max_iter={_pick(rng, [5, 10, 20])}, learning_rate={_pick(rng, [0.01, 0.03])}, max_depth=2"
    return _Est("hist_boosting", [f"from sklearn.ensemble import {name}"], f"{name}({arg}, random_state=0)",
                multi_native=False)


def _svm(spec: TaskSpec, rng, good: bool) -> _Est:
    c = _pick(rng, [1.0, 3.0, 10.0]) if good else _pick(rng, [0.003, 0.01, 0.03])
    kernel = "rbf" if good else _pick(rng, ["rbf", "linear", "sigmoid"])
    if spec.regression:
        return _Est("svm", ["from sklearn.svm import SVR"], f'SVR(C={_fmt(c)}, kernel="{kernel}")', True, True,
                    multi_native=False)
    if spec.proba and rng.random() < 0.3:
        return _Est("svm", ["from sklearn.calibration import CalibratedClassifierCV", "from sklearn.svm import LinearSVC"],
                    "CalibratedClassifierCV(base, cv=3)", True, True, multi_native=False,
                    pre=[f"base = LinearSVC(C={_fmt(c)})"])
    extra = ", probability=True" if spec.proba else ""
    return _Est("svm", ["from sklearn.svm import SVC"], f'SVC(C={_fmt(c)}, kernel="{kernel}"{extra}, random_state=0)',
                True, True, multi_native=False)


def _bayes(spec: TaskSpec, rng, good: bool) -> _Est:
    if spec.regression:  # no naive Bayes regressor: a Bayesian linear model stands in
        return _Est("bayes", ["from sklearn.linear_model import BayesianRidge"], "BayesianRidge()", True,
                    multi_native=False)
    v = _pick(rng, [1e-9, 1e-8]) if good else _pick(rng, [0.1, 0.5, 1.0])
    return _Est("bayes", ["from sklearn.naive_bayes import GaussianNB"], f"GaussianNB(var_smoothing={_fmt(v)})",
                multi_native=False)


def _mlp(spec: TaskSpec, rng, good: bool) -> _Est:
    name = "MLPRegressor" if spec.regression else "MLPClassifier"
    if good:
        arg = f"hidden_layer_sizes=({_pick(rng, [64, 128])},), max_iter={_pick(rng, [200, 300])}, early_stopping=True"
    else:
        arg = f"hidden_layer_sizes=({_pick(rng, [2, 4, 8])},), max_iter={_pick(rng, [10, 20, 30])}"
    return _Est("mlp", [f"from sklearn.neural_network import {name}"], f"{name}({arg}, random_state=0)", True,
                multi_native=spec.regression)


def _dummy(spec: TaskSpec, rng, good: bool) -> _Est:
    if spec.regression:
        return _Est("dummy", ["from sklearn.dummy import DummyRegressor"], 'DummyRegressor(strategy="mean")')
    strat = _pick(rng, ["most_frequent", "prior"])
    return _Est("dummy", ["from sklearn.dummy import DummyClassifier"], f'DummyClassifier(strategy="{strat}")')


_FAMILIES: list[tuple[Callable[..., _Est], float]] = [
    (_linear, 0.16), (_knn, 0.12), (_tree, 0.12), (_forest, 0.16), (_boosting, 0.17),
    (_svm, 0.09), (_bayes, 0.07), (_mlp, 0.07), (_dummy, 0.04),
]
#: probability that a script's hyperparameters are drawn from the good range (a pretrained LM's prior knows
#: sensible defaults; the rest leave RL something to find)
GOOD_FRACTION = 0.5


# ----------------------------------------------------------------------------- script assembly


def _holdout_metric(spec: TaskSpec, yv: str, model: str, xv: str, imports: set[str]) -> tuple[str, str]:
    """(metric name, expression) for the hold-out printout."""
    if spec.regression:
        if spec.metric == "rmse":
            imports.add("from sklearn.metrics import mean_squared_error")
            return "rmse", f"np.sqrt(mean_squared_error({yv}, {model}.predict({xv})))"
        imports.add("from sklearn.metrics import r2_score")
        return "r2", f"r2_score({yv}, {model}.predict({xv}))"
    if spec.multi:
        return "accuracy", f"({model}.predict({xv}) == np.asarray({yv})).mean()"
    if spec.metric == "macro_f1":
        imports.add("from sklearn.metrics import f1_score")
        return "macro F1", f'f1_score({yv}, {model}.predict({xv}), average="macro")'
    if spec.metric == "log_loss":
        imports.add("from sklearn.metrics import log_loss")
        return "log loss", f"log_loss({yv}, {model}.predict_proba({xv}), labels={model}.classes_)"
    if spec.metric == "roc_auc" and (len(spec.columns) == 2 or spec.positive_proba):
        imports.add("from sklearn.metrics import roc_auc_score")
        return "ROC AUC", f"roc_auc_score({yv}, {model}.predict_proba({xv})[:, 1])"
    imports.add("from sklearn.metrics import accuracy_score")
    return "accuracy", f"accuracy_score({yv}, {model}.predict({xv}))"


def _cv_scoring(spec: TaskSpec) -> str | None:
    if spec.multi:
        return None
    return {
        "accuracy": "accuracy", "macro_f1": "f1_macro", "log_loss": "neg_log_loss",
        "roc_auc": "roc_auc" if len(spec.columns) == 2 or spec.positive_proba else "roc_auc_ovr",
        "r2": "r2", "rmse": "neg_root_mean_squared_error",
    }[spec.metric]


def _q(names: str | Sequence[str]) -> str:
    """A double-quoted Python literal for a column name or a list of them."""
    if isinstance(names, str):
        return json.dumps(names)
    return "[" + ", ".join(json.dumps(n) for n in names) + "]"


def _is_p_i(cols: Sequence[str]) -> bool:
    return list(cols) == [f"p_{i}" for i in range(len(cols))]


def generate_script(spec: TaskSpec, rng: np.random.Generator) -> str:
    """One valid, deterministic (given `rng`) scikit-learn solution script for `spec`."""
    good = bool(rng.random() < GOOD_FRACTION)
    fams, weights = zip(*_FAMILIES)
    make = fams[int(rng.choice(len(fams), p=np.asarray(weights) / sum(weights)))]
    est = make(spec, rng, good)
    imports = {"import pandas as pd"}
    imports.update(est.imports)
    lines: list[str] = []

    lines.append(task_comment(spec))
    if rng.random() < 0.5:
        lines.append(f"# {est.family.replace('_', ' ')} baseline" + (" (tuned)" if good else ""))
    tr, te = _pick(rng, [("train", "test"), ("train_df", "test_df"), ("df", "test")])
    lines += [f'{tr} = pd.read_csv("train.csv")', f'{te} = pd.read_csv("test_features.csv")']

    # the id column, the target(s) and the features: read off the files (the id comes first, the targets are the
    # columns the test file lacks), never copied from the description: a small LM copies an unseen name badly
    if spec.id_column:
        lines.append(f"ID = {te}.columns[0]")
    tgt = "TARGETS" if spec.multi else "TARGET"
    lines.append(f"{tgt} = [c for c in {tr}.columns if c not in {te}.columns]" + ("" if spec.multi else "[0]"))
    if rng.random() < 0.5:
        lines.append(f"FEATURES = [c for c in {te}.columns if c != ID]" if spec.id_column
                     else f"FEATURES = list({te}.columns)")
    else:
        cond = f"c not in {tgt}" if spec.multi else f"c != {tgt}"
        lines.append(f"FEATURES = [c for c in {tr}.columns if {cond}" + (" and c != ID]" if spec.id_column else "]"))
    lines += [f"X = {tr}[FEATURES]", f"y = {tr}[{tgt}]", f"X_test = {te}[FEATURES]"]
    if spec.text or rng.random() < 0.15:
        lines += _encode_text(spec, rng, imports)
    if spec.missing or rng.random() < 0.3:  # (PCA, SelectKBest and most estimators refuse NaN)
        lines += ["X = X.fillna(X.median())", "X_test = X_test.fillna(X.median())"]
    if est.subsample:
        lines += ["if len(X) > 3000:  # kernel methods are quadratic in the rows",
                  "    keep = X.sample(n=3000, random_state=0).index", "    X, y = X.loc[keep], y.loc[keep]"]

    # preprocessing: none / scaler / PCA / SelectKBest, in a pipeline or applied by hand
    steps: list[str] = []
    p_scale = 0.6 if (est.scale_sensitive and good) else 0.3
    r = rng.random()
    if r < p_scale:
        scaler = _pick(rng, ["StandardScaler", "StandardScaler", "MinMaxScaler"])
        imports.add(f"from sklearn.preprocessing import {scaler}")
        if rng.random() < 0.3:
            lines += [f"scaler = {scaler}()", "X = scaler.fit_transform(X)", "X_test = scaler.transform(X_test)"]
        else:
            steps.append(f"{scaler}()")
    elif r < p_scale + 0.15:
        imports.add("from sklearn.decomposition import PCA")
        imports.add("from sklearn.preprocessing import StandardScaler")
        frac = _pick(rng, [0.9, 0.95, 0.99]) if good else _pick(rng, [0.3, 0.5, 0.7])
        steps += ["StandardScaler()", f"PCA(n_components={frac})"]
    elif r < p_scale + 0.3 and not spec.multi:
        score = "f_regression" if spec.regression else "f_classif"
        imports.add(f"from sklearn.feature_selection import SelectKBest, {score}")
        k = _pick(rng, [10, 20]) if good else _pick(rng, [1, 2, 3])
        steps.append(f"SelectKBest({score}, k=min({k}, X.shape[1]))")

    # one constructor per line (no deep nesting: each line closes what it opens)
    lines += est.pre
    lines.append(f"estimator = {est.code}")
    if spec.multi and not est.multi_native:
        wrapper = "MultiOutputRegressor" if spec.regression else "MultiOutputClassifier"
        imports.add(f"from sklearn.multioutput import {wrapper}")
        lines.append(f"estimator = {wrapper}(estimator)")
    if steps:
        imports.add("from sklearn.pipeline import make_pipeline")
        lines.append(f"model = make_pipeline({', '.join(steps)}, estimator)")
    else:
        lines.append("model = estimator")

    # validation: none / hold-out / cross-validation
    r = rng.random()
    refit = True
    if r < 0.4:
        imports.add("from sklearn.model_selection import train_test_split")
        name, expr = _holdout_metric(spec, "y_va", "model", "X_va", imports)
        frac = _pick(rng, [0.2, 0.25])
        lines += [f"X_tr, X_va, y_tr, y_va = train_test_split(X, y, test_size={frac}, random_state=0)",
                  "model.fit(X_tr, y_tr)", f'print("holdout {name}:", {expr})']
        refit = rng.random() < 0.8  # the rest submit the model fitted on less data
    elif r < 0.55 and _cv_scoring(spec) is not None:
        imports.add("from sklearn.model_selection import cross_val_score")
        lines += [f'scores = cross_val_score(model, X, y, cv=3, scoring="{_cv_scoring(spec)}")',
                  'print("cv score: %.4f +/- %.4f" % (scores.mean(), scores.std()))']
    if refit:
        lines.append("model.fit(X, y)")

    # the submission: the id column first when the task has one
    idv = f"{te}[ID]"
    single = "TARGET" if not spec.multi and spec.columns == spec.targets else _q(spec.columns[0])
    insert = False
    if spec.proba and not spec.positive_proba:
        lines.append("proba = model.predict_proba(X_test)")
        if spec.id_column:
            cols = "[str(c) for c in model.classes_]"
        elif _is_p_i(spec.columns) and rng.random() < 0.5:
            cols = '[f"p_{i}" for i in range(proba.shape[1])]'
        else:
            cols = _q(list(spec.columns))
        frame, insert = f"pd.DataFrame(proba, columns={cols})", bool(spec.id_column)
    elif spec.multi:
        lines.append("pred = model.predict(X_test)")
        frame, insert = f"pd.DataFrame(pred, columns={tgt})", bool(spec.id_column)
    else:
        lines.append("pred = model.predict_proba(X_test)[:, 1]" if spec.proba else "pred = model.predict(X_test)")
        columns = f"ID: {idv}, {single}: pred" if spec.id_column else f"{single}: pred"
        frame = f"pd.DataFrame({{{columns}}})"
    lines.append(f"submission = {frame}")
    if insert:
        lines.append(f"submission.insert(0, ID, {idv}.values)")
    lines.append('submission.to_csv("submission.csv", index=False)')
    if rng.random() < 0.4:
        lines.append('print("wrote submission.csv", submission.shape)')

    imports.add("import numpy as np")  # written only where a line uses np.
    return "\n".join(_imports_where_used(imports, lines)) + "\n"


def _encode_text(spec: TaskSpec, rng: np.random.Generator, imports: set[str]) -> list[str]:
    """Text columns made numeric: one-hot (aligned on the test side), ordinal codes, or dropped."""
    r = rng.random()
    if r < 0.45:
        return ["X = pd.get_dummies(X)", "X_test = pd.get_dummies(X_test).reindex(columns=X.columns, fill_value=0)"]
    if r < 0.8 and spec.text:
        imports.add("from sklearn.preprocessing import OrdinalEncoder")
        return ['TEXT_COLS = list(X.select_dtypes(exclude="number").columns)',
                'encoder = OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1)',
                "X[TEXT_COLS] = encoder.fit_transform(X[TEXT_COLS])",
                "X_test[TEXT_COLS] = encoder.transform(X_test[TEXT_COLS])"]
    return ['X = X.select_dtypes("number")', "X_test = X_test[X.columns]"]


def task_comment(spec: TaskSpec) -> str:
    """The script's first line: the kind of task and its metric, restated from the description.

    The agent decides regression or classification once, at the first line of
    its reply, and every later line (which estimator, which metric function) is
    conditioned on that line a few tokens back rather than on one line of a long
    prompt: a 1.4M-parameter LM fitted classifiers to held-out regression tasks
    when the choice was left to each import.
    """
    kind = ("multi-output " if spec.multi else "") + ("regression" if spec.regression else "classification")
    return f"# {kind}, metric {spec.metric}"


def _imports_where_used(imports: set[str], lines: list[str]) -> list[str]:
    """Each import placed right before the first line that uses it.

    An estimator's import then sits next to its constructor, so a small LM that
    writes one writes the other; with every import at the top it used names it
    had not imported (a third of its held-out failures) or imported one
    estimator and fitted another.
    """
    def names(imp: str) -> list[str]:
        if imp.startswith("import "):
            return [imp.split(" as ")[-1].strip() + "."]
        return [n.strip() for n in imp.split(" import ")[1].split(",")]

    def first_use(imp: str) -> int | None:
        pattern = "|".join(rf"\b{re.escape(n)}" for n in names(imp))
        return next((i for i, line in enumerate(lines) if not line.startswith("#") and re.search(pattern, line)), None)

    at: dict[int | None, list[str]] = {}
    for imp in imports:
        at.setdefault(first_use(imp), []).append(imp)  # None: never used, never written
    out: list[str] = []
    for i, line in enumerate(lines):
        here = at.get(i, [])
        out += sorted(x for x in here if x.startswith("import ")) + sorted(x for x in here if x.startswith("from "))
        out.append(line)
    return out


def script_family(script: str) -> str | None:
    """The estimator family a generated script uses (from its imports), for diagnostics."""
    probes = [("DummyRegressor", "dummy"), ("DummyClassifier", "dummy"), ("HistGradientBoosting", "hist_boosting"),
              ("GradientBoosting", "boosting"), ("LinearSVC", "svm"), ("RandomForest", "forest"), ("ExtraTrees", "forest"),
              ("DecisionTree", "tree"), ("KNeighbors", "knn"), ("SVC", "svm"), ("SVR", "svm"),
              ("GaussianNB", "bayes"), ("BayesianRidge", "bayes"), ("MLP", "mlp"), ("Logistic", "linear"),
              ("Ridge", "linear"), ("Lasso", "linear"), ("ElasticNet", "linear"), ("LinearRegression", "linear")]
    for probe, fam in probes:
        if f"import {probe}" in script or f", {probe}" in script or re.search(rf"\b{probe}\w*\(", script):
            return fam
    return None


def _feedback(spec: TaskSpec, rng: np.random.Generator) -> str:
    """A plausible sandbox report for a first-turn script (the shape `AutoResearchEnv` writes)."""
    r = rng.random()
    if r < 0.7:
        return report("ok", rng.uniform(0.05, 0.95))
    if r < 0.85:
        col = spec.targets[0]
        return report("error", message="exit code 1", stderr=f"KeyError: {col!r}")
    return report("timeout", message="wall-clock timeout; the whole process tree was killed")


# --------------------------------------------------------------------------- prompt augmentation

_WORDS = (
    "data rows columns feature features target model predict predicted measurements values class classes "
    "probability sample samples train test score metric noise signal sensor patient customer price count rate "
    "level group mean worst error ratio index label value time budget output input tabular numeric float int "
    "higher lower better hidden labels file files training prediction each per the a of from with and in on"
).split()


def _noise_line(rng: np.random.Generator, pool: Sequence[str]) -> str:
    """A line of plausible-looking but meaningless description text."""
    words = [pool[int(rng.integers(len(pool)))] for _ in range(int(rng.integers(3, 13)))]
    if rng.random() < 0.35:
        words.insert(int(rng.integers(len(words) + 1)), f"`{_pick(rng, ['x', 'feat', 'col', 'v', 'm'])}_{int(rng.integers(100))}`")
    if rng.random() < 0.35:
        words.insert(int(rng.integers(len(words) + 1)), str(int(rng.integers(1, 5000))))
    return _pick(rng, ["", "", "- ", "## "]) + " ".join(words) + "."


def augment_description(description: str, spec: TaskSpec, rng: np.random.Generator,
                        pool: Sequence[str] = _WORDS) -> str:
    """A perturbed copy of a task description: some lines dropped, replaced or added as noise.

    Lines that carry what the script needs -- the target column(s), the
    submission columns, the metric -- are never touched. Trained on such
    copies, the agent keeps writing valid scripts for descriptions it has never
    seen (the held-out tasks) instead of relying on every line it memorised.
    """
    keys = [*spec.targets, *spec.columns, spec.metric, *([spec.id_column] if spec.id_column else [])]
    out = []
    for line in description.splitlines():
        if any(k in line for k in keys):
            out.append(line)
        elif line.startswith("# ") and rng.random() < 0.4:
            out.append(line.split(":")[0] + ": " + "-".join(pool[int(rng.integers(len(pool)))] for _ in range(2)))
        elif rng.random() < 0.2:
            continue
        elif rng.random() < 0.2:
            out.append(_noise_line(rng, pool))
        else:
            out.append(line)
        if rng.random() < 0.06:
            out.append(_noise_line(rng, pool))
    return "\n".join(out)


#: target columns as competitions name them, for a class and for a value
_CLASS_TARGETS = ("target", "label", "class", "species", "churn", "default", "survived", "diagnosis", "grade",
                  "is_fraud", "category", "outcome", "approved", "defect", "segment", "cover_type", "activity", "failure")
_VALUE_TARGETS = ("target", "price", "sales", "demand", "yield", "energy", "duration", "score", "concentration",
                  "strength", "rating", "consumption", "temperature", "load", "revenue", "count", "value", "progression")
_FEATURE_WORDS = ("age", "income", "height", "weight", "pressure", "dose", "area", "volume", "speed", "ratio",
                  "depth", "width", "length", "humidity", "flow", "voltage", "density", "balance", "tenure", "visits",
                  "distance", "hour", "rooms", "acidity", "sugar", "alcohol", "mass", "radius", "texture", "gain")
_TASK_TYPES = {"classification": ("binary", "multiclass"), "regression": ("regression",),
               "multioutput": ("multi-output",)}


def spec_for(task_type: str, targets: Sequence[str], metric: str, columns: Sequence[str],
             id_column: str | None = None, text: bool = False, missing: bool = False) -> TaskSpec:
    """The script generator's view of a task of the suite's format (`ARTask`'s fields)."""
    kind = next(k for k, types in _TASK_TYPES.items() if task_type in types)
    return TaskSpec(kind=kind, targets=tuple(targets), metric=metric, columns=tuple(columns), id_column=id_column,
                    text=text, missing=missing)


def _feature_names(rng: np.random.Generator, d: int, avoid: Sequence[str]) -> list[str]:
    style = int(rng.integers(4))
    if style == 0:
        return [f"{_pick(rng, ['x', 'f', 'feat_', 'V', 'col_'])}{i}" for i in range(d)]
    if style == 1:
        prefix = _pick(rng, ["x", "f", "feat_", "V", "col_", "sensor_", "m"])
        return [f"{prefix}{i}" for i in range(d)]
    words = [w for w in _FEATURE_WORDS if w not in avoid]
    names = [words[int(i)] for i in rng.permutation(len(words))[:d]]
    return names + [f"{_pick(rng, ['x', 'f', 'extra_'])}{i}" for i in range(d - len(names))]


#: how competitions name the id column, class labels that are words, and text columns with their levels
_ID_NAMES = ("id", "id", "Id", "ID", "row_id", "customer_id", "sample_id", "record_id", "user_id", "item_id")
_CLASS_WORDS = (("no", "yes"), ("negative", "positive"), ("bad", "good"), ("benign", "malignant"), ("ham", "spam"),
                ("low", "medium", "high"), ("cat", "dog", "bird"), ("setosa", "versicolor", "virginica"),
                ("none", "minor", "major", "critical"), ("north", "south", "east", "west"))
_TEXT_COLUMNS = ("region", "segment", "channel", "plan", "tier", "colour", "device", "source", "city", "brand",
                 "gender", "category", "sector", "status")
_TEXT_LEVELS = (("red", "green", "blue", "amber"), ("north", "south", "east", "west"), ("basic", "plus", "premium"),
                ("alpha", "beta", "gamma", "delta"), ("A", "B", "C", "D", "E"), ("web", "store", "phone"))


def _classes(rng: np.random.Generator, k: int, words: bool) -> tuple:
    if words:
        fitting = [c for c in _CLASS_WORDS if len(c) == k]
        if fitting:
            return tuple(sorted(_pick(rng, fitting)))
        return tuple(f"{_pick(rng, ['class_', 'type_', 'c'])}{i}" for i in range(k))
    start = int(_pick(rng, [0, 0, 0, 1]))
    return tuple(range(start, start + k))


def synthetic_task(rng: np.random.Generator) -> tuple[TaskSpec, str]:
    """A random task of any kind, metric and schema, described exactly as the bundled suite describes its own.

    Mixed into the corpus so the agent learns to read what a description says
    (the id and target names, regression or classification, the metric, the
    submission's columns, text columns and empty cells) rather than memorise the
    training tasks: a regression task need not be among them for it to write a
    regressor, nor a target be called `target` for it to find it. The layouts
    come from `tasks.submission_columns_for`, so they are the grader's.
    """
    kind = _pick(rng, ["classification"] * 3 + ["regression"] * 2 + ["multioutput"])
    id_column = _pick(rng, _ID_NAMES) if rng.random() < 0.75 else None
    classes: tuple | None = None
    if kind == "multioutput":
        t = int(rng.integers(2, 5))
        if rng.random() < 0.5:
            base = _pick(rng, ["y", "target_", "out", "y_"])
            targets = tuple(f"{base}{j}" for j in range(t))
        else:
            targets = tuple(_VALUE_TARGETS[int(i)] for i in rng.permutation(len(_VALUE_TARGETS))[:t])
        task_type, metric, target_dtype = "multi-output", _pick(rng, ["r2", "rmse"]), "float64"
    elif kind == "regression":
        targets = (_pick(rng, _VALUE_TARGETS),)
        task_type, metric = "regression", _pick(rng, ["r2", "rmse"])
        target_dtype = _pick(rng, ["float64", "float64", "int64"])
    else:
        targets = (_pick(rng, _CLASS_TARGETS),)
        k = int(_pick(rng, [2, 2, 2, 3, 4, 5, 7, 10]))
        classes = _classes(rng, k, words=rng.random() < 0.5)
        task_type = "binary" if k == 2 else "multiclass"
        target_dtype = "int64" if isinstance(classes[0], int) else TEXT
        metric = _pick(rng, ["accuracy", "macro_f1", "roc_auc", "log_loss"])
    d = int(rng.integers(3, 40))
    features = _feature_names(rng, d, (*targets, id_column or ""))
    dtypes = [_pick(rng, ["float64"] * 4 + ["int64"]) for _ in range(d)]
    categories = {}
    if rng.random() < 0.35:
        names = [n for n in _TEXT_COLUMNS if n not in features and n not in targets]
        for j, name in zip(rng.choice(d, size=min(d, int(rng.integers(1, 4))), replace=False), rng.permutation(names)):
            features[j], dtypes[j] = str(name), TEXT
            categories[str(name)] = _pick(rng, _TEXT_LEVELS)
    numeric = [f for f, dt in zip(features, dtypes) if dt != TEXT]
    missing = [numeric[int(i)] for i in sorted(rng.choice(len(numeric), size=max(1, len(numeric) // 4),
                                                          replace=False))] if rng.random() < 0.35 and numeric else []
    n_train = int(rng.integers(100, 20000))
    description = render_description(
        title="-".join(_pick(rng, _WORDS[:60]) for _ in range(2)), blurb=_noise_line(rng, _WORDS),
        metric=metric, budget_s=int(_pick(rng, [30, 60, 90, 120])), task_type=task_type, n_train=n_train,
        n_test=max(20, n_train // int(_pick(rng, [2, 3, 4, 5]))), feature_columns=features, feature_dtypes=dtypes,
        target_columns=targets, target_dtype=target_dtype, classes=classes, id_column=id_column,
        categories=categories, missing_columns=missing, sample_submission=bool(id_column) or rng.random() < 0.5)
    columns = value_columns_for(metric, task_type, classes, targets, id_column)
    return spec_for(task_type, targets, metric, columns, id_column, bool(categories), bool(missing)), description


def generate_corpus(specs_and_prompts: Sequence[tuple[TaskSpec, str]], n: int, seed: int = 0, *,
                    multi_turn: float = 0.15, augment: float = 0.5, background: float = 0.5) -> list[tuple[str, str]]:
    """`n` (prompt, script) pairs over the given tasks. Deterministic given `seed`.

    The prompt is the observation the agent answers, `format_prompt(description)`:
    for an `augment` fraction with a perturbed description (`augment_description`),
    for a `multi_turn` fraction a second-turn observation (`next_observation`
    after a first script and a synthetic sandbox report) so the agent knows the
    multi-turn format, and a `background` fraction comes from `synthetic_task`s
    of every kind rather than from the given tasks (which are cycled through
    otherwise). The SFT target for a pair is `format_reply(script)` followed by
    the end-of-turn token.
    """
    pairs = list(specs_and_prompts)
    if not pairs:
        raise ValueError("generate_corpus needs at least one (TaskSpec, description) pair")
    # noise words: the tasks' own vocabulary, minus anything that names a target, a column or a kind of task
    names = {n for spec, _ in pairs for n in (*spec.targets, *spec.columns, spec.id_column or "")} | set(METRICS)
    words = {w.strip(".,;:()`*#") for _, d in pairs for w in d.split()} | set(_WORDS)
    pool = sorted(w for w in words - names if not any(k in w.lower() for k in ("regress", "classif", "probab", "binary",
                                                                                "multi", "output")))
    out = []
    own = 0
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        if rng.random() < background:
            spec, description = synthetic_task(rng)
        else:
            spec, description = pairs[own % len(pairs)]
            own += 1
            if rng.random() < augment:
                description = augment_description(description, spec, rng, pool)
        prompt = format_prompt(description)
        if rng.random() < multi_turn:
            first = format_reply(generate_script(spec, rng))
            prompt = next_observation(prompt, first, _feedback(spec, rng))
        out.append((prompt, generate_script(spec, rng)))
    return out
