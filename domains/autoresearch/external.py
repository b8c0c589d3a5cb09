"""Load AutoResearch tasks from directories on disk (MLE-bench / MLE-Dojo-style competitions).

One directory per task (the format is documented in `docs/autoresearch_tasks.md`):

    my-task/
      task.yaml              id, metric, target (+ optional id_column, budget_s, family, split, baseline, ...)
      description.md         what the agent reads (the data inventory and submission format are appended)
      train.csv              features + target column(s)
      test_features.csv      the same feature columns, no target
      test_labels.csv        the target column(s) for the test rows (same order, or with the id column): hidden
      sample_submission.csv  optional; copied to the work directory; its header must match the submission

Anything wrong with a directory is a `ValueError` that names the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from wmrl.core.types import SPLITS
from wmrl.domains.autoresearch.tasks import (
    METRICS, PUBLIC_FILES, SAMPLE_SUBMISSION, TEXT, ARTask, label_key, render_description, submission_columns_for,
)

REQUIRED_FILES = {
    "task.yaml": "the task's id, metric and target column(s)",
    "description.md": "the task text the agent reads",
    "train.csv": "the training table: feature columns plus the target column(s)",
    "test_features.csv": "the test rows' feature columns",
    "test_labels.csv": "the hidden target column(s) of the test rows",
}
OPTIONAL_FILES = (SAMPLE_SUBMISSION,)
YAML_KEYS = {
    "id": "required: the task id (letters, digits, '.', '_', '-')",
    "metric": f"required: one of {', '.join(METRICS)}",
    "target": "required: the target column of train.csv, or a list of them (multi-output regression)",
    "id_column": "optional: a column of train.csv and test_features.csv that names each row; the submission is "
                 "then <id>,<target> rows matched by it (default: none, rows matched by order)",
    "budget_s": "optional: the sandbox time limit in seconds (default 600)",
    "family": "optional: the task family (default 'external')",
    "split": "optional: train, test_id, test_ood or validation (default 'train')",
    "title": "optional: the heading of the description (default the id)",
    "baseline": "optional: the trivial solution's score (default computed)",
    "reference": "optional: a good default model's score (default computed with HistGradientBoosting, cached)",
    "classes": "optional: the class labels, in the order of the probability columns (default sorted)",
    "positive_label": "optional: for binary roc_auc, the class whose probability is submitted (default the last)",
}
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_UNNAMED = re.compile(r"^Unnamed: \d+$")  # what pandas names a header cell left empty (a saved index)
#: how many distinct values a classification target may have before it is called continuous
_MAX_CLASSES = 100


def _err(path: Path, what: str) -> ValueError:
    return ValueError(f"{path}: {what}")


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise _err(path, f"malformed YAML ({' '.join(str(exc).split())})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _err(path, f"cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise _err(path, f"must be a YAML mapping of keys to values, got {type(data).__name__}; keys: "
                         + ", ".join(f"{k} ({v})" for k, v in YAML_KEYS.items()))
    unknown = sorted(str(k) for k in data if k not in YAML_KEYS)
    if unknown:
        raise _err(path, f"unknown key(s) {unknown}; allowed keys: {sorted(YAML_KEYS)}")
    for key in ("id", "metric", "target"):
        if data.get(key) in (None, "", []):
            raise _err(path, f"missing required key {key!r} ({YAML_KEYS[key]})")
    if not isinstance(data["id"], str) or not _ID.match(data["id"]):
        raise _err(path, f"'id' must be a string of letters, digits, '.', '_' or '-', got {data['id']!r}")
    if data["metric"] not in METRICS:
        raise _err(path, f"unknown metric {data['metric']!r}; expected one of {', '.join(METRICS)}")
    target = data["target"]
    if isinstance(target, str):
        data["target"] = [target]
    elif not (isinstance(target, list) and target and all(isinstance(t, str) and t for t in target)):
        raise _err(path, f"'target' must be a column name or a non-empty list of column names, got {target!r}")
    if len(set(data["target"])) != len(data["target"]):
        raise _err(path, f"'target' lists a column twice: {data['target']}")
    budget = data.get("budget_s", 600)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        raise _err(path, f"'budget_s' must be a positive number of seconds, got {budget!r}")
    data["budget_s"] = int(math.ceil(budget))
    if data.get("split", "train") not in SPLITS:
        raise _err(path, f"'split' must be one of {SPLITS}, got {data.get('split')!r}")
    for key in ("baseline", "reference"):
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise _err(path, f"{key!r} must be a finite number, got {v!r}")
    for key in ("family", "title", "id_column"):
        if key in data and not isinstance(data[key], str):
            raise _err(path, f"{key!r} must be a string, got {data[key]!r}")
    if "classes" in data and not (isinstance(data["classes"], list) and len(data["classes"]) >= 2):
        raise _err(path, f"'classes' must be a list of at least two class labels, got {data['classes']!r}")
    return data


def _read_table(path: Path):
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise _err(path, f"is not a readable CSV file with a header line ({' '.join(str(exc).split())})") from None
    if len(df) == 0:
        raise _err(path, "has a header but no data rows")
    header = [str(c) for c in df.columns]
    if len(header) == 1 and any(sep in header[0] for sep in (";", "\t")):
        raise _err(path, f"has one column named {header[0][:60]!r}: it looks separated by "
                         f"{'semicolons' if ';' in header[0] else 'tabs'}; write it comma-separated "
                         "(pandas: df.to_csv(path, index=False))")
    unnamed = [c for c in header if _UNNAMED.match(c)]
    if unnamed:
        raise _err(path, f"has a column without a name ({unnamed[0]!r}): a pandas index written with the data; "
                         "write it with df.to_csv(path, index=False), or name the column if it is a real feature")
    return df


def _dtype_name(series) -> str:
    import pandas as pd

    if pd.api.types.is_integer_dtype(series):
        return "int64"
    if pd.api.types.is_float_dtype(series):
        return "float64"
    if pd.api.types.is_bool_dtype(series):
        return "bool"
    return TEXT


def load_task_dir(path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> ARTask:
    """Read one task directory into an `ARTask` (its hidden labels stay in `test_labels.csv`).

    A missing `baseline` is computed (the trivial solution), a missing `reference` is computed with a
    default HistGradientBoosting model and cached under `cache_dir` (default
    `~/.cache/wmrl/external`), keyed by the task's files.
    """
    import pandas as pd

    from wmrl.domains.autoresearch import grader

    root = Path(path).expanduser()
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory (an AutoResearch task directory holds "
                         f"{', '.join(REQUIRED_FILES)})")
    for name, what in REQUIRED_FILES.items():
        if not (root / name).is_file():
            raise _err(root / name, f"required file is missing ({what})")
    cfg = _read_yaml(root / "task.yaml")
    yaml_path = root / "task.yaml"
    try:
        blurb = (root / "description.md").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise _err(root / "description.md", f"cannot be read as UTF-8 text ({exc})") from None
    if not blurb:
        raise _err(root / "description.md", "is empty; it is the task text the agent reads")

    train = _read_table(root / "train.csv")
    test_x = _read_table(root / "test_features.csv")
    test_y = _read_table(root / "test_labels.csv")
    targets = list(cfg["target"])
    metric = cfg["metric"]
    kind = METRICS[metric].kind
    train.columns = [str(c) for c in train.columns]
    test_x.columns = [str(c) for c in test_x.columns]
    test_y.columns = [str(c) for c in test_y.columns]
    missing = [t for t in targets if t not in train.columns]
    if missing:
        raise _err(root / "train.csv", f"lacks the target column(s) {missing} named in task.yaml; its columns "
                                       f"are {list(train.columns)[:20]}")
    id_column = cfg.get("id_column")
    if id_column is not None:
        _check_ids(root, id_column, targets, train, test_x, test_y)
    features = [c for c in train.columns if c not in targets and c != id_column]
    if not features:
        raise _err(root / "train.csv", "has no feature columns besides the target(s)")
    leaked = [t for t in targets if t in test_x.columns]
    if leaked:
        raise _err(root / "test_features.csv", f"contains the target column(s) {leaked}: they belong in "
                                               "test_labels.csv only")
    test_features = [c for c in test_x.columns if c != id_column]
    if sorted(test_features) != sorted(features):
        lacking = sorted(set(features) - set(test_features))
        surplus = sorted(set(test_features) - set(features))
        raise _err(root / "test_features.csv", f"must have the same feature columns as train.csv; missing {lacking}, "
                                               f"unexpected {surplus}")
    if test_features != features:
        raise _err(root / "test_features.csv", "has the feature columns of train.csv in a different order; use "
                                               "the order of train.csv")
    missing = [t for t in targets if t not in test_y.columns]
    if missing:
        raise _err(root / "test_labels.csv", f"lacks the target column(s) {missing}; its columns are "
                                             f"{list(test_y.columns)[:20]}")
    if len(test_y) != len(test_x):
        raise _err(root / "test_labels.csv", f"has {len(test_y)} rows but test_features.csv has {len(test_x)}; "
                                             "they must be the same test rows, in the same order")
    for name, df in (("train.csv", train), ("test_labels.csv", test_y)):
        holes = [t for t in targets if df[t].isna().any()]
        if holes:
            raise _err(root / name, f"has missing values in the target column(s) {holes}")

    classes = None
    if kind == "value":
        task_type = "multi-output" if len(targets) > 1 else "regression"
        for name, df in (("train.csv", train), ("test_labels.csv", test_y)):
            bad = [t for t in targets if not pd.api.types.is_numeric_dtype(df[t])]
            if bad:
                raise _err(root / name, f"target column(s) {bad} must be numeric for metric {metric!r}")
        target_dtype = "float64"
    else:
        if len(targets) > 1:
            raise _err(yaml_path, f"metric {metric!r} takes a single target column; multi-output tasks use r2 "
                                  "or rmse")
        t = targets[0]
        seen = {}
        for v in list(train[t]) + list(test_y[t]):
            seen.setdefault(label_key(v), v)
        fractional = pd.api.types.is_float_dtype(train[t]) and bool((train[t] % 1 != 0).any())
        if fractional or (len(seen) > _MAX_CLASSES and len(seen) > len(train) // 2):
            raise _err(yaml_path, f"metric {metric!r} scores class labels, but target {t!r} looks continuous "
                                  f"({len(seen)} distinct values{', not all whole numbers' if fractional else ''}); "
                                  "for a numeric target use rmse or r2")
        for key in ("classes", "positive_label"):
            given = cfg.get(key)
            strays = [v for v in (given if isinstance(given, list) else [given])
                      if isinstance(v, bool) and label_key(v) not in seen]
            if strays:
                raise _err(yaml_path, f"{key!r} holds the boolean {strays[0]} but the labels are "
                                      f"{list(seen.values())[:5]}: YAML reads an unquoted yes/no/on/off/true/false "
                                      f'as a boolean; quote the label (e.g. {key}: "yes")')
        if "classes" in cfg:
            classes = list(cfg["classes"])
            keys = [label_key(c) for c in classes]
            if len(set(keys)) != len(keys):
                raise _err(yaml_path, f"'classes' lists a class twice: {classes}")
            unknown = sorted(set(seen) - set(keys))
            if unknown:
                raise _err(yaml_path, f"'classes' omits labels found in train.csv / test_labels.csv: {unknown[:10]}")
        else:
            classes = sorted(seen.values(), key=_natural)
        if len(classes) < 2:
            raise _err(root / "train.csv", f"target {t!r} has a single class {classes}; classification needs two "
                                           "or more")
        if "positive_label" in cfg:
            pos = label_key(cfg["positive_label"])
            keys = [label_key(c) for c in classes]
            if len(classes) != 2 or pos not in keys:
                raise _err(yaml_path, f"'positive_label' {cfg['positive_label']!r} must be one of the two classes "
                                      f"{classes}")
            classes = [c for c in classes if label_key(c) != pos] + [classes[keys.index(pos)]]
        task_type = "binary" if len(classes) == 2 else "multiclass"
        if metric == "roc_auc" and len({label_key(v) for v in test_y[t]}) < 2:
            raise _err(root / "test_labels.csv", "has a single class: roc_auc is undefined")
        target_dtype = _dtype_name(train[t])
        classes = [_plain(c) for c in classes]

    public = PUBLIC_FILES + tuple(f for f in OPTIONAL_FILES if (root / f).is_file())
    provisional = ARTask(
        id=cfg["id"], family=cfg.get("family", "external"), split=cfg.get("split", "train"), metric=metric,
        budget_s=cfg["budget_s"], description="", baseline=math.nan, reference=math.nan, task_type=task_type,
        feature_columns=tuple(features), target_columns=tuple(targets),
        classes=tuple(classes) if classes is not None else None, n_train=len(train), n_test=len(test_x),
        data_dir=str(root.resolve()), suite="external", source=f"external:{root.resolve()}", public_files=public,
        id_column=id_column)
    sub_cols = submission_columns_for(metric, task_type, classes, targets, id_column)
    if SAMPLE_SUBMISSION in public:
        sample = _read_table(root / SAMPLE_SUBMISSION)
        cols = [str(c).strip() for c in sample.columns]
        if sorted(cols) != sorted(sub_cols):
            raise _err(root / SAMPLE_SUBMISSION,
                       f"has columns {cols} but the grader expects {list(sub_cols)} for metric {metric!r}"
                       + ("" if id_column or len(cols) != len(sub_cols) + 1 else
                          "; if its first column names the rows, declare it in task.yaml as id_column"))
        if len(sample) != len(test_x):
            raise _err(root / SAMPLE_SUBMISSION,
                       f"has {len(sample)} rows but test_features.csv has {len(test_x)}")

    both = pd.concat([train[features], test_x[features]])
    description = render_description(
        title=cfg.get("title", cfg["id"]), blurb=blurb, metric=metric, budget_s=cfg["budget_s"], task_type=task_type,
        n_train=len(train), n_test=len(test_x), feature_columns=features,
        feature_dtypes=[_dtype_name(train[c]) for c in features], target_columns=targets,
        target_dtype=target_dtype, classes=classes, id_column=id_column,
        missing_columns=[c for c in features if both[c].isna().any()], sample_submission=SAMPLE_SUBMISSION in public)
    task = _replace(provisional, description=description)

    baseline = cfg.get("baseline")
    if baseline is None:
        baseline = grader.baseline_score(task)
    task = _replace(task, baseline=float(baseline))
    reference = cfg.get("reference")
    if reference is None:
        reference = _cached_reference(task, root, cache_dir)
    return _replace(task, reference=float(reference))


def _check_ids(root: Path, column: str, targets: list[str], train, test_x, test_y) -> None:
    """The id column names every row once, in train.csv and test_features.csv (and test_labels.csv if there)."""
    if column in targets:
        raise _err(root / "task.yaml", f"id_column {column!r} is also a target column")
    for name, df in (("train.csv", train), ("test_features.csv", test_x)):
        if column not in df.columns:
            raise _err(root / name, f"lacks the id column {column!r} named in task.yaml; its columns are "
                                    f"{list(df.columns)[:20]}")
    ids = [label_key(v) for v in test_x[column].tolist()]
    if test_x[column].isna().any() or len(set(ids)) != len(ids):
        raise _err(root / "test_features.csv", f"id column {column!r} must name every row once (no empty or "
                                               "repeated ids)")
    if column in test_y.columns and len(test_y) == len(test_x) and sorted(label_key(v) for v in test_y[column].tolist()) != sorted(ids):
        raise _err(root / "test_labels.csv", f"id column {column!r} must hold the ids of test_features.csv")


def _replace(task: ARTask, **changes: Any) -> ARTask:
    from dataclasses import replace

    return replace(task, **changes)


def _natural(v: Any):
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def _plain(v: Any) -> Any:
    """numpy scalars -> Python scalars (plain data in the payload)."""
    return v.item() if hasattr(v, "item") else v


def _cached_reference(task: ARTask, root: Path, cache_dir: str | os.PathLike | None) -> float:
    from wmrl.domains.autoresearch import grader

    cache = Path(cache_dir).expanduser() if cache_dir is not None else _default_cache()
    h = hashlib.sha256()
    h.update(json.dumps([task.id, task.metric, list(task.target_columns), list(task.classes or ())],
                        default=str).encode())
    for name in ("train.csv", "test_features.csv", "test_labels.csv"):
        st = (root / name).stat()
        h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    path = cache / f"{task.id}-{h.hexdigest()[:16]}.json"
    try:
        return float(json.loads(path.read_text())["reference"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    ref = grader.reference_score(task)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"reference": ref}))
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs a recomputation
    return ref


def _default_cache() -> Path:
    base = os.environ.get("WMRL_CACHE_DIR")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "wmrl") / "external"


def load_task_root(root: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> list[ARTask]:
    """Every task directory directly under `root` (sorted by name); `root` itself if it is one.

    A sub-directory holding any of the task files is a task directory and must be complete; others
    (e.g. `.git`) are skipped. Duplicate ids are an error.
    """
    base = Path(root).expanduser()
    if not base.is_dir():
        raise ValueError(f"{base}: not a directory")
    if (base / "task.yaml").exists():
        return [load_task_dir(base, cache_dir=cache_dir)]
    tasks, seen = [], {}
    for sub in sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not any((sub / f).exists() for f in REQUIRED_FILES):
            continue
        task = load_task_dir(sub, cache_dir=cache_dir)
        if task.id in seen:
            raise ValueError(f"{sub / 'task.yaml'}: id {task.id!r} is already used by {seen[task.id] / 'task.yaml'}")
        seen[task.id] = sub
        tasks.append(task)
    if not tasks:
        raise ValueError(f"{base}: no task directories found (each needs {', '.join(REQUIRED_FILES)})")
    return tasks
