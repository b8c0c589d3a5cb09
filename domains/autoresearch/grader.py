"""Grade an AutoResearch attempt: score `submission.csv` on the hidden labels, within a bound.

`grade_bytes(task, data)` grades a submission's bytes (what the sandbox hands
back); `grade(task, workdir)` reads one from a directory first. Neither raises
on what the agent wrote: a missing, oversized, unreadable or malformed
submission is `Grade(status="invalid", reward=0.0)` with a message that says
what to fix (it becomes the agent's next observation). Only a bug of ours (or
missing hidden data) raises.

Bounded whatever the submission holds: nothing larger than `submission_cap`
(a generous size for the task's rows and columns) is read, too many lines or a
too-long header are refused before parsing, so parsing time and memory are
bounded by the cap; every message quotes at most a few clipped snippets of the
agent's text and is at most `MAX_MESSAGE_CHARS` long.

The grader runs outside the sandbox: it is the only reader of `hidden_labels`.
"""

from __future__ import annotations

import io
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from wmrl.domains.autoresearch.sandbox import FileProblem, read_regular_file
from wmrl.domains.autoresearch.tasks import (
    SUBMISSION_FILE, ARTask, hidden_labels, label_key, test_frame, test_ids, train_frame,
)

#: a message (what the agent reads) is at most this long
MAX_MESSAGE_CHARS = 800
_SNIPPET_CHARS = 40  # of any one piece of the agent's text quoted in a message
_VALUE_BYTES = 40  # room per value in `submission_cap` (a float's repr needs <= 24)
_HEADER_BYTES = 1024
_NAN_WORDS = {"nan", "-nan", "+nan", "na", "n/a", "null", "none"}


@dataclass(frozen=True)
class Grade:
    #: "ok" or "invalid"
    status: str
    #: the metric's value, None when invalid
    score: float | None
    #: normalised reward in [0, 1]; the task's failure reward when invalid
    reward: float
    message: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _Invalid(Exception):
    """An agent mistake: becomes an invalid grade with this message."""


def _invalid(task: ARTask, message: str) -> Grade:
    text = f"invalid submission: {message}"
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 3] + "..."
    return Grade("invalid", None, float(task.failure_reward), text)


def submission_cap(task: ARTask) -> int:
    """The most bytes a valid submission of `task` can take, generously; a larger one is refused unread."""
    cols = list(task.submission_columns)
    label = max((len(str(c)) for c in task.classes or ()), default=0)
    per_value = max(_VALUE_BYTES, 2 * label + 8)
    return _header_cap(task) + (task.n_test + 1) * (len(cols) * (per_value + 1) + 2)


def _header_cap(task: ARTask) -> int:
    return _HEADER_BYTES + sum(2 * len(c) + 3 for c in task.submission_columns)


def grade(task: ARTask, workdir: str | os.PathLike, filename: str = SUBMISSION_FILE) -> Grade:
    """Score `workdir/submission.csv` for `task` (never following a link, never blocking on a special file)."""
    try:
        dfd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return grade_bytes(task, None, FileProblem("missing"), filename)
    try:
        data, problem = read_regular_file(dfd, filename, submission_cap(task))
    finally:
        os.close(dfd)
    return grade_bytes(task, data, problem, filename)


def grade_bytes(task: ARTask, data: bytes | None, problem: FileProblem | None = None,
                filename: str = SUBMISSION_FILE) -> Grade:
    """Score a submission's bytes; `data` None with the `problem` that kept the file from being read."""
    import pandas as pd

    cap = submission_cap(task)
    try:
        if data is None:
            raise _Invalid(_unread(task, problem or FileProblem("missing"), filename, cap))
        if len(data) > cap:
            raise _Invalid(_unread(task, FileProblem("too_large", len(data)), filename, cap))
        if not data.strip():
            raise _Invalid(f"{filename} is empty. Expected a header line with {_cols(task.submission_columns)} "
                           f"and {task.n_test} rows.")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise _Invalid(f"{filename} is not UTF-8 text; write it as a plain comma-separated file.") from None
        lines = text.count("\n") + (not text.endswith("\n"))
        if lines > task.n_test + 2:
            raise _Invalid(f"{filename} has {lines} lines but test_features.csv has {task.n_test} rows; write a "
                           "header line, then exactly one prediction per test row.")
        header = text.split("\n", 1)[0]
        if len(header) > _header_cap(task):
            raise _Invalid(f"the header line of {filename} is {len(header)} characters long; it must name the "
                           f"columns {_cols(task.submission_columns)}.")
        try:
            df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_filter=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
            raise _Invalid(f"{filename} could not be parsed as CSV ({_short(exc)}). Write a plain comma-separated "
                           f"file with a header line.") from None
        return _evaluate(task, df)
    except _Invalid as exc:
        return _invalid(task, str(exc))


def _unread(task: ARTask, problem: FileProblem, filename: str, cap: int) -> str:
    if problem.kind == "missing":
        return (f"no {filename} in the working directory. Write your predictions to {filename} "
                f"(a header line, then {task.n_test} rows, columns {_cols(task.submission_columns)}).")
    if problem.kind == "too_large":
        return (f"{filename} is {problem.size / 2**20:.2f} MiB, too large to be a submission of {task.n_test} rows "
                f"(at most {cap / 2**20:.2f} MiB).")
    return f"{filename} {problem.describe()}, not a regular file; write your predictions to a regular file."


def grade_frame(task: ARTask, df) -> Grade:
    """Grade an in-memory submission DataFrame exactly as its CSV would be graded."""
    with tempfile.TemporaryDirectory(prefix="wmrl-grade-") as tmp:
        write_submission(df, tmp)
        return grade(task, tmp)


def write_submission(df, workdir: str | os.PathLike, filename: str = SUBMISSION_FILE) -> Path:
    path = Path(workdir) / filename
    df.to_csv(path, index=False)
    return path


# --- validation --------------------------------------------------------------


def _clip(text: str) -> str:
    return text if len(text) <= _SNIPPET_CHARS else text[: _SNIPPET_CHARS - 3] + "..."


def _cols(cols: Sequence[str]) -> str:
    shown = [repr(_clip(c)) for c in cols[:6]]
    if len(cols) > 8:
        return "[" + ", ".join(shown) + f", ... ({len(cols)} in all)]"
    return "[" + ", ".join(repr(_clip(c)) for c in cols) + "]"


def _short(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _examples(rows: np.ndarray, values: Sequence[str], limit: int = 3) -> str:
    shown = [f"row {int(i) + 1}: {_clip(values[int(i)])!r}" for i in rows[:limit]]
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return ", ".join(shown) + more


def _check_columns(task: ARTask, df) -> None:
    found = [str(c).strip() for c in df.columns]
    df.columns = found
    expected = list(task.submission_columns)
    missing = [c for c in expected if c not in found]
    extra = [c for c in found if c not in expected]
    repeated = sorted({c for c in found if found.count(c) > 1})
    if repeated:  # e.g. "prediction" twice once stripped: one name must mean one column
        raise _Invalid(f"{SUBMISSION_FILE} names the column{'s' if len(repeated) > 1 else ''} {_cols(repeated)} "
                       f"more than once; column names must be unique.")
    if not missing and not extra:
        return
    parts = [f"{SUBMISSION_FILE} must have exactly the column{'s' if len(expected) > 1 else ''} {_cols(expected)}"]
    parts.append(f"found {_cols(found)}")
    if missing:
        parts.append(f"missing {_cols(missing)}")
    if extra:
        parts.append(f"unexpected {_cols(extra)}")
    msg = "; ".join(parts) + "."
    hints = []
    if any(c.startswith("Unnamed") or c == "" for c in extra):
        hints.append("An unnamed column usually means the DataFrame index was written: use "
                     "df.to_csv(\"submission.csv\", index=False).")
    if task.id_column is None and any(c == "id" or c.lower() == "index" for c in extra):
        hints.append("Do not write an id or index column: rows are matched to test_features.csv by order.")
    if task.id_column in missing:
        hints.append(f"Copy the {task.id_column!r} column of test_features.csv into the submission: rows are "
                     "matched to the test rows by it.")
    headerless = bool(found) and all(_is_number(re.sub(r"\.\d+$", "", c)) or _is_number(c) for c in found)
    if headerless:
        hints.append("The first line looks like data: the file needs a header line with the column names.")
    elif any(re.search(r"\.\d+$", c) and c.rsplit(".", 1)[0] in found for c in extra):
        hints.append("Column names must be unique.")
    if len(found) == 1 and any(sep in found[0] for sep in (";", "\t", "|")):
        hints.append("Separate the columns with commas.")
    raise _Invalid(" ".join([msg] + hints))


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _parse_numbers(df, column: str) -> np.ndarray:
    values = [str(v).strip() for v in df[column].tolist()]
    out = np.empty(len(values), dtype=float)
    empty, nonnum, nan = [], [], []
    for i, v in enumerate(values):
        if v == "":
            empty.append(i)
            out[i] = np.nan
            continue
        if v.lower() in _NAN_WORDS:
            nan.append(i)
            out[i] = np.nan
            continue
        try:
            out[i] = float(v)
        except ValueError:
            nonnum.append(i)
            out[i] = np.nan
    if nonnum:
        raise _Invalid(f"column {column!r} has {len(nonnum)} non-numeric value{'s' if len(nonnum) > 1 else ''} "
                       f"({_examples(np.array(nonnum), values)}); every value must be a number.")
    if empty or nan:
        bad = np.array(sorted(empty + nan))
        raise _Invalid(f"column {column!r} has {len(bad)} missing or NaN value{'s' if len(bad) > 1 else ''} "
                       f"({_examples(bad, values)}); predict a number for every row.")
    inf = np.flatnonzero(~np.isfinite(out))
    if len(inf):
        raise _Invalid(f"column {column!r} has {len(inf)} infinite value{'s' if len(inf) > 1 else ''} "
                       f"({_examples(inf, values)}); every value must be finite.")
    return out


def _parse(task: ARTask, df) -> Any:
    """The submission in canonical form: label keys, a probability matrix, or a value matrix."""
    _check_columns(task, df)
    if len(df) != task.n_test:
        raise _Invalid(f"{SUBMISSION_FILE} has {len(df)} data rows but test_features.csv has {task.n_test}; write "
                       + (f"exactly one row per test row (one per {task.id_column!r})." if task.id_column else
                          "exactly one prediction per test row, in the order of test_features.csv."))
    if task.id_column:
        df = _by_id(task, df)
    kind = task.metric_info.kind
    cols = list(task.value_columns)
    if kind == "label":
        column = cols[0]
        raw = [str(v).strip() for v in df[column].tolist()]
        keys = np.array([label_key(v) for v in raw], dtype=object)
        allowed = {label_key(c) for c in task.classes or ()}
        empty = np.flatnonzero([v == "" for v in raw])
        if len(empty):
            raise _Invalid(f"column {column!r} has {len(empty)} missing (empty) value{'s' if len(empty) > 1 else ''} "
                           f"({_examples(empty, raw)}); predict a class for every row.")
        bad = np.flatnonzero([k not in allowed for k in keys])
        if len(bad):
            classes = ", ".join(str(c) for c in task.classes or ())
            raise _Invalid(f"column {column!r} has {len(bad)} value{'s' if len(bad) > 1 else ''} that "
                           f"{'are' if len(bad) > 1 else 'is'} not a class ({_examples(bad, raw)}); the classes are "
                           f"{classes}. Predict class labels, not probabilities or scores.")
        return keys
    M = np.column_stack([_parse_numbers(df, c) for c in cols])
    if kind == "proba":
        out = np.flatnonzero(((M < 0) | (M > 1)).any(axis=1))
        if len(out):
            r = int(out[0])
            c = cols[int(np.flatnonzero((M[r] < 0) | (M[r] > 1))[0])]
            raise _Invalid(f"{len(out)} row{'s have' if len(out) > 1 else ' has'} probabilities outside [0, 1] "
                           f"(first: row {r + 1}, column {c!r} = {M[r, cols.index(c)]!r}); submit probabilities, "
                           "e.g. predict_proba, not decision scores or logits.")
        if M.shape[1] > 1:
            sums = M.sum(axis=1)
            zero = np.flatnonzero(sums <= 0)
            if len(zero):
                raise _Invalid(f"{len(zero)} row{'s have' if len(zero) > 1 else ' has'} probabilities summing to 0 "
                               f"(first: row {int(zero[0]) + 1}); each row must give some probability to a class.")
            M = M / sums[:, None]
        else:
            M = M[:, 0]
    return M


def _by_id(task: ARTask, df):
    """The submission's rows in the order of test_features.csv, matched by the id column."""
    column = task.id_column
    raw = [str(v).strip() for v in df[column].tolist()]
    keys = [label_key(v) for v in raw]
    empty = np.flatnonzero([v == "" for v in raw])
    if len(empty):
        raise _Invalid(f"column {column!r} has {len(empty)} missing (empty) id{'s' if len(empty) > 1 else ''} "
                       f"({_examples(empty, raw)}); copy the {column!r} column of test_features.csv.")
    expected = test_ids(task)
    at: dict[str, int] = {}
    repeated = []
    for i, k in enumerate(keys):
        if k in at:
            repeated.append(i)
        at.setdefault(k, i)
    if repeated:
        raise _Invalid(f"column {column!r} repeats ids ({_examples(np.array(repeated), raw)}); write one row per "
                       "test row.")
    known = set(expected)
    unknown = np.flatnonzero([k not in known for k in keys])
    if len(unknown):
        raise _Invalid(f"column {column!r} has {len(unknown)} id{'s' if len(unknown) > 1 else ''} that "
                       f"{'are' if len(unknown) > 1 else 'is'} not in test_features.csv ({_examples(unknown, raw)}); "
                       f"copy the {column!r} column of test_features.csv.")
    return df.iloc[[at[k] for k in expected]].reset_index(drop=True)


def _truth(task: ARTask) -> Any:
    y = hidden_labels(task)
    if task.metric_info.kind == "value":
        return np.asarray(y, dtype=float).reshape(len(y), -1)
    return np.array([label_key(v) for v in y], dtype=object)


def compute_score(task: ARTask, pred: Any) -> float:
    """The metric of a canonical prediction (what `_parse` returns) on the hidden labels."""
    from sklearn.metrics import f1_score, log_loss, r2_score, roc_auc_score

    y = _truth(task)
    m = task.metric
    keys = [label_key(c) for c in task.classes or ()]
    if m == "accuracy":
        return float(np.mean(pred == y))
    if m == "macro_f1":
        return float(f1_score(list(y), list(pred), labels=keys, average="macro", zero_division=0))
    if m in ("roc_auc", "log_loss"):
        index = {k: i for i, k in enumerate(keys)}
        yi = np.array([index[k] for k in y])
        if m == "roc_auc":
            if np.ndim(pred) == 1:
                return float(roc_auc_score(yi == len(keys) - 1, pred))
            return float(roc_auc_score(yi, pred, multi_class="ovr", labels=list(range(len(keys)))))
        P = pred if np.ndim(pred) == 2 else np.column_stack([1 - pred, pred])
        return float(log_loss(yi, P, labels=list(range(len(keys)))))
    if m == "r2":
        return float(r2_score(y, pred, multioutput="uniform_average"))
    if m == "rmse":
        return float(np.mean(np.sqrt(np.mean((y - pred) ** 2, axis=0))))
    raise ValueError(f"unknown metric {m!r}")  # pragma: no cover


def _evaluate(task: ARTask, df) -> Grade:
    pred = _parse(task, df)
    try:
        score = compute_score(task, pred)
    except ValueError as exc:  # sklearn refusing a prediction we let through
        raise _Invalid(f"the metric could not be computed on this submission ({_short(exc)}).") from None
    if not math.isfinite(score):
        raise _Invalid(f"the submission's {task.metric} is not a finite number.")
    reward = task.normalize(score)
    direction = "higher" if task.higher_is_better else "lower"
    return Grade("ok", score, reward,
                 f"scored: {task.metric} = {score:.6g} ({direction} is better) on the hidden test labels; "
                 f"reward {reward:.3f} (0 at the trivial baseline {task.baseline:.4g}, 1 at "
                 f"{task.target_score:.4g}).")


# --- reference submissions: trivial, oracle and a default model -------------------


def submission_frame(task: ARTask, predictions: Any):
    """A submission DataFrame from raw predictions.

    Class labels for accuracy / macro_f1; for roc_auc on a binary task the positive-class probability
    (shape (n,) or predict_proba's (n, 2)); for log_loss (and multiclass roc_auc) a probability matrix
    with columns in the order of `task.classes`; values (n,) or (n, n_targets) for regression. In the
    task's layout: the id column first when it has one, rows in the order of test_features.csv.
    """
    import pandas as pd

    cols = list(task.value_columns)
    p = np.array(predictions, copy=True)
    if task.metric_info.kind == "label":
        frame = pd.DataFrame({cols[0]: p.reshape(-1)})
    elif len(cols) == 1:
        if p.ndim == 2 and p.shape[1] == 2 and task.metric_info.kind == "proba":
            p = p[:, 1]
        frame = pd.DataFrame({cols[0]: p.reshape(-1).astype(float)})
    else:
        p = p.reshape(len(p), -1).astype(float)
        frame = pd.DataFrame({c: p[:, j] for j, c in enumerate(cols)})
    if task.id_column:
        frame.insert(0, task.id_column, test_frame(task)[task.id_column].to_numpy())
    return frame


def _class_index(task: ARTask, labels: Sequence[Any]) -> np.ndarray:
    index = {label_key(c): i for i, c in enumerate(task.classes or ())}
    return np.array([index[label_key(v)] for v in labels])


def baseline_submission(task: ARTask):
    """The trivial solution: majority class, class-prior probabilities, or the train mean."""
    tr = train_frame(task)
    targets = list(task.target_columns)
    n = task.n_test
    if task.metric_info.kind == "value":
        mean = tr[targets].to_numpy(dtype=float).mean(axis=0)
        return submission_frame(task, np.tile(mean, (n, 1)))
    idx = _class_index(task, tr[targets[0]].tolist())
    k = len(task.classes)
    prior = np.bincount(idx, minlength=k) / len(idx)
    if task.metric_info.kind == "label":
        return submission_frame(task, [task.classes[int(np.argmax(prior))]] * n)
    return submission_frame(task, np.tile(prior, (n, 1)))


def oracle_submission(task: ARTask):
    """The hidden labels themselves, in submission form (scores the metric's perfect value). For tests."""
    y = hidden_labels(task)
    kind = task.metric_info.kind
    if kind == "label":
        return submission_frame(task, y)
    if kind == "proba":
        onehot = np.eye(len(task.classes))[_class_index(task, y)]
        return submission_frame(task, onehot)
    return submission_frame(task, y)


def feature_matrix(task: ARTask, df) -> np.ndarray:
    """Numeric feature matrix: object columns become category codes (external tasks may have text)."""
    import pandas as pd

    X = df[list(task.feature_columns)].copy()
    for c in X.columns:
        if not pd.api.types.is_numeric_dtype(X[c]):
            X[c] = pd.Categorical(X[c].astype(str)).codes.astype(float)
    return X.to_numpy(dtype=float)


def reference_submission(task: ARTask, model: Any = None):
    """A default model's submission: HistGradientBoosting (default settings, random_state=0) unless `model`.

    Fitted on one thread, as the suite's pinned references were.
    """
    import pandas as pd
    from threadpoolctl import threadpool_limits
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.multioutput import MultiOutputRegressor

    tr, te = train_frame(task), test_frame(task)
    # encode text columns consistently across train and test
    both = pd.concat([tr[list(task.feature_columns)], te[list(task.feature_columns)]], ignore_index=True)
    X_all = feature_matrix(task, both)
    X_tr, X_te = X_all[: len(tr)], X_all[len(tr):]
    targets = list(task.target_columns)
    kind = task.metric_info.kind
    if kind == "value":
        y = tr[targets].to_numpy(dtype=float)
        if model is None:
            model = HistGradientBoostingRegressor(random_state=0)
            if y.shape[1] > 1:
                model = MultiOutputRegressor(model)
        with threadpool_limits(limits=1):
            model.fit(X_tr, y[:, 0] if y.shape[1] == 1 else y)
        return submission_frame(task, model.predict(X_te))
    y = _class_index(task, tr[targets[0]].tolist())
    if model is None:
        model = HistGradientBoostingClassifier(random_state=0)
    with threadpool_limits(limits=1):
        model.fit(X_tr, y)
    if kind == "label":
        return submission_frame(task, [task.classes[int(i)] for i in model.predict(X_te)])
    proba = np.zeros((len(X_te), len(task.classes)))
    proba[:, np.asarray(model.classes_, dtype=int)] = model.predict_proba(X_te)
    return submission_frame(task, proba)


def _score_or_raise(task: ARTask, df) -> float:
    g = grade_frame(task, df)
    if not g.ok:
        raise RuntimeError(f"task {task.id!r}: our own submission was graded invalid: {g.message}")
    return float(g.score)


def baseline_score(task: ARTask) -> float:
    return _score_or_raise(task, baseline_submission(task))


def reference_score(task: ARTask) -> float:
    return _score_or_raise(task, reference_submission(task))
