"""The autoresearch-mini suite, its grader and the external task-directory loader."""

from __future__ import annotations

import math
import pickle
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wmrl.core.types import Task
from wmrl.domains.autoresearch import external, grader
from wmrl.domains.autoresearch import tasks as T
from wmrl.domains.autoresearch.grader import Grade, grade, grade_frame
from wmrl.domains.autoresearch.suite import load_suite

ALL_METRICS = {"accuracy", "macro_f1", "roc_auc", "log_loss", "r2", "rmse"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("ar-cache")
    t0 = time.perf_counter()
    suite = load_suite(cache_dir=cache)
    return suite, cache, time.perf_counter() - t0


@pytest.fixture(scope="module")
def suite(built):
    return built[0]


@pytest.fixture(scope="module")
def by_id(suite):
    return {t.id: t for t in suite}


# --- the suite ---------------------------------------------------------------------


def test_suite_shape(suite):
    assert len(suite) >= 20
    ids = [t.id for t in suite]
    assert len(set(ids)) == len(ids)
    for s in T.SPLITS:
        assert T.split(suite, s), f"split {s} is empty"
    assert sum(len(T.split(suite, s)) for s in T.SPLITS) == len(suite)
    train_fams = {t.family for t in T.split(suite, "train")}
    ood_fams = {t.family for t in T.split(suite, "test_ood")}
    id_fams = {t.family for t in T.split(suite, "test_id")}
    assert ood_fams and not (ood_fams & train_fams), "OOD families must never be trained on"
    assert not (ood_fams & id_fams)
    assert id_fams <= train_fams, "held-out ID tasks come from training families"
    assert {t.metric for t in suite} == ALL_METRICS
    for t in suite:
        assert t.family and t.budget_s > 0 and t.n_train > 0 and t.n_test > 0
        assert math.isfinite(t.baseline) and math.isfinite(t.reference)
        better = t.reference > t.baseline if t.higher_is_better else t.reference < t.baseline
        assert better, f"{t.id}: the reference model does not beat the trivial baseline"
        assert 0.0 < t.normalize(t.reference) <= 1.0
    with pytest.raises(ValueError, match="split"):
        T.split(suite, "dev")
    with pytest.raises(ValueError, match="autoresearch-mini"):
        load_suite("no-such-suite")


def test_build_is_deterministic_and_fast(built, tmp_path):
    suite, cache, cold_s = built
    assert cold_s < 10.0, f"building the suite took {cold_s:.1f} s"
    t0 = time.perf_counter()
    warm = load_suite(cache_dir=cache)
    assert time.perf_counter() - t0 < 2.0
    assert warm == suite
    again = load_suite(cache_dir=tmp_path / "fresh")
    for a, b in zip(suite, again):
        assert a.id == b.id
        assert (a.baseline, a.reference, a.description, a.classes) == (b.baseline, b.reference, b.description,
                                                                       b.classes)
        xa, xb = T.load_arrays(a), T.load_arrays(b)
        for key in ("X_train", "y_train", "X_test", "y_test"):
            np.testing.assert_array_equal(xa[key], xb[key], err_msg=f"{a.id} {key}")
    # a cache wiped under a loaded task is rebuilt on use
    t = next(t for t in again if t.id == "wine-cultivar")
    (Path(t.data_dir) / "arrays.npz").unlink()
    T.materialize(t, tmp_path / "w")
    np.testing.assert_array_equal(T.hidden_labels(t), T.hidden_labels(next(s for s in suite if s.id == t.id)))


def test_pinned_references_match_a_fresh_fit(by_id):
    for tid in ("bc-diagnosis", "diabetes-progression", "iris-species"):
        t = by_id[tid]
        assert grader.reference_score(t) == pytest.approx(t.reference, abs=1e-5), tid


def test_task_payload(suite):
    t = suite[0]
    task = t.to_task()
    assert isinstance(task, Task) and task.id == t.id and task.split == t.split and task.payload is t
    blob = pickle.dumps(task)
    assert len(blob) < 60_000, "the payload must not carry the arrays"
    assert pickle.loads(blob).payload == t
    hash(t)


def test_description_says_what_the_agent_needs(suite):
    for t in suite:
        d, k = len(t.feature_columns), len(t.target_columns)
        text = t.description
        for needle in (t.metric, f"{t.budget_s} s", "train.csv", "test_features.csv", "submission.csv",
                       f"{t.n_train} rows × {d + k + 1} columns", f"{t.n_test} rows × {d + 1} columns",
                       f"the id column `{t.id_column}`", "sample_submission.csv", ",".join(t.submission_columns),
                       "higher is better" if t.higher_is_better else "lower is better"):
            assert needle in text, f"{t.id}: description lacks {needle!r}"
        for col in t.submission_columns + t.target_columns:
            assert f"`{col}`" in text, f"{t.id}: description lacks column {col}"
        # text columns and empty cells are what the table has, and the description says which
        public = pd.concat([T.train_frame(t), T.test_frame(t)])[list(t.feature_columns)]
        text_cols = [c for c in public.columns if not pd.api.types.is_numeric_dtype(public[c])]
        holes = [c for c in public.columns if public[c].isna().any()]
        assert ("Categorical columns (text values)" in text) == bool(text_cols), t.id
        assert all(f"`{c}` (" in text.split("Categorical columns")[-1] for c in text_cols), t.id
        assert ("- Missing values:" in text) == bool(holes), t.id
    assert sum("Categorical columns" in t.description for t in suite) >= 10
    assert sum("- Missing values:" in t.description for t in suite) >= 10


# --- materialize --------------------------------------------------------------------


def _formats(values: np.ndarray) -> list[str]:
    v = np.asarray(values)
    if v.dtype.kind == "O":
        return ["\n".join(str(x) for x in v)]
    if v.dtype.kind in "iu":
        return ["\n".join(str(int(x)) for x in v)]
    return ["\n".join(repr(float(x)) for x in v), "\n".join(f"{float(x):.7g}" for x in v)]


def test_materialize_writes_public_files_only(suite, tmp_path):
    for t in suite:
        work = tmp_path / t.id
        T.materialize(t, work)
        assert sorted(p.name for p in work.iterdir()) == ["sample_submission.csv", "test_features.csv", "train.csv"]
        tr, te = pd.read_csv(work / "train.csv"), pd.read_csv(work / "test_features.csv")
        assert list(te.columns) == [t.id_column, *t.feature_columns]
        assert list(tr.columns) == [t.id_column, *t.feature_columns, *t.target_columns]
        assert len(tr) == t.n_train and len(te) == t.n_test
        assert set(tr[t.id_column]).isdisjoint(te[t.id_column]), f"{t.id}: a train id is also a test id"
        sample = pd.read_csv(work / "sample_submission.csv")
        assert list(sample.columns) == list(t.submission_columns)
        assert list(sample[t.id_column]) == list(te[t.id_column])
        g = grade(t, work) if (work / "submission.csv").exists() else grade_frame(t, sample)
        assert g.ok, (t.id, g.message)
        y = T.hidden_labels(t).reshape(t.n_test, -1)
        test_text = (work / "test_features.csv").read_text()
        for name in t.target_columns:
            assert name not in test_text, f"{t.id}: label column {name!r} in test_features.csv"
        texts = {p.name: p.read_text() for p in work.iterdir()}
        for j in range(y.shape[1]):
            for needle in _formats(y[:, j]):
                for name, text in texts.items():
                    assert needle not in text, f"{t.id}: hidden label vector found in {name}"
            for df in (tr, te):
                for col in df.columns:
                    col_vals = df[col].to_numpy()
                    if col_vals.dtype.kind in "fiu" and len(col_vals) == t.n_test and y.dtype.kind != "O":
                        assert not np.allclose(col_vals, y[:, j].astype(float)), f"{t.id}: labels in {col}"


# --- grading ------------------------------------------------------------------------


def test_oracle_submission_scores_one(suite):
    for t in suite:
        g = grade_frame(t, grader.oracle_submission(t))
        assert g.status == "ok", (t.id, g.message)
        assert g.score == pytest.approx(t.perfect_score, abs=1e-6), t.id
        assert g.reward >= 0.99, t.id


def test_baseline_submission_scores_zero(suite):
    for t in suite:
        g = grade_frame(t, grader.baseline_submission(t))
        assert g.status == "ok", (t.id, g.message)
        assert g.score == pytest.approx(t.baseline, abs=1e-9), t.id
        assert g.reward <= 0.01, t.id


def _solve(task, work: Path, make_model) -> Grade:
    """An agent's program, in-process: read the workdir's CSVs, fit, predict, write submission.csv."""
    T.materialize(task, work)
    tr = pd.read_csv(work / "train.csv")
    te = pd.read_csv(work / "test_features.csv")
    X = np.nan_to_num(tr[list(task.feature_columns)].to_numpy(float))
    Xt = np.nan_to_num(te[list(task.feature_columns)].to_numpy(float))
    y = tr[list(task.target_columns)].to_numpy()
    y = y[:, 0] if y.shape[1] == 1 else y
    model = make_model().fit(X, y)
    if task.metric in ("roc_auc", "log_loss"):
        pred = model.predict_proba(Xt)
    else:
        pred = model.predict(Xt)
    grader.submission_frame(task, pred).to_csv(work / "submission.csv", index=False)
    return grade(task, work)


def test_real_sklearn_solutions_land_between(by_id, tmp_path):
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    cases = {
        "bc-diagnosis": lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)),
        "wine-cultivar": lambda: RandomForestClassifier(n_estimators=30, random_state=0),
        "iris-species": lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)),
        "digits-8x8": lambda: KNeighborsClassifier(5),
        "diabetes-progression": lambda: Ridge(1.0),
        "multioutput-linear": lambda: Ridge(1.0),
        "binary-moons": lambda: make_pipeline(StandardScaler(), LogisticRegression()),
    }
    for tid, make in cases.items():
        t = by_id[tid]
        g = _solve(t, tmp_path / tid, make)
        assert g.status == "ok", (tid, g.message)
        assert 0.0 < g.reward <= 1.0, (tid, g.score, g.reward)
        assert t.metric in g.message and "reward" in g.message


def test_normalize_formula(by_id):
    for tid in ("digits-8x8", "friedman1", "iris-species", "diabetes-progression"):
        t = by_id[tid]
        b, r, p, top = t.baseline, t.reference, t.perfect_score, t.target_score
        assert top == pytest.approx(r + T.HEADROOM * (p - r))
        assert t.normalize(b) == 0.0 and t.normalize(top) == pytest.approx(1.0) and t.normalize(p) == 1.0
        worse = b - 1.0 if t.higher_is_better else b + 1.0
        assert t.normalize(worse) == 0.0
        mid = (b + top) / 2
        assert t.normalize(mid) == pytest.approx(0.5)
        assert t.normalize(r) == pytest.approx((r - b) / (top - b))
        assert t.normalize(None) == 0.0 and t.normalize(float("nan")) == 0.0 and t.normalize(math.inf) == 0.0
    rmse = by_id["friedman1"]
    assert rmse.normalize(rmse.reference * 0.9) > rmse.normalize(rmse.reference) > rmse.normalize(rmse.baseline)
    # a reference that fails to beat the baseline falls back to the baseline as anchor
    assert T.target_score(0.5, 0.4, "accuracy") == pytest.approx(0.5 + T.HEADROOM * 0.5)
    assert T.target_score(2.0, 3.0, "rmse") == pytest.approx(2.0 * (1 - T.HEADROOM))


def _assert_invalid(task, work: Path, *needles: str) -> Grade:
    g = grade(task, work)
    assert g.status == "invalid", (task.id, g)
    assert g.reward == 0.0 and g.score is None
    for n in needles:
        assert n.lower() in g.message.lower(), (n, g.message)
    return g


def _write(work: Path, text: str | bytes) -> None:
    work.mkdir(parents=True, exist_ok=True)
    p = work / "submission.csv"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())


def test_invalid_submissions(by_id, tmp_path):
    auc, ll, acc, reg, multi = (by_id[i] for i in ("bc-diagnosis", "iris-species", "digits-8x8",
                                                   "diabetes-progression", "multioutput-linear"))

    # missing file / not a file / empty
    _assert_invalid(auc, tmp_path / "none", "no submission.csv", "patient_id", "diagnosis")
    (tmp_path / "dir" / "submission.csv").mkdir(parents=True)
    _assert_invalid(auc, tmp_path / "dir", "not a regular file")
    _write(tmp_path / "empty", "")
    _assert_invalid(auc, tmp_path / "empty", "empty")
    # a link to a file the agent cannot read itself (e.g. hidden labels) is refused, even if it would score
    _write(tmp_path / "elsewhere", grader.oracle_submission(multi).to_csv(index=False))
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "submission.csv").symlink_to(tmp_path / "elsewhere" / "submission.csv")
    _assert_invalid(multi, tmp_path / "link", "symbolic link")

    for task in (auc, ll, acc, reg, multi):
        good = grader.oracle_submission(task)
        cols = list(task.value_columns)

        w = tmp_path / f"{task.id}-rows"
        w.mkdir()
        good.iloc[:-1].to_csv(w / "submission.csv", index=False)
        _assert_invalid(task, w, f"{task.n_test - 1} data rows", f"{task.n_test}", "one row per test row")

        w = tmp_path / f"{task.id}-cols"
        w.mkdir()
        good.rename(columns={cols[0]: "target"}).to_csv(w / "submission.csv", index=False)
        _assert_invalid(task, w, "missing", cols[0], "unexpected", "'target'")

        w = tmp_path / f"{task.id}-index"
        w.mkdir()
        good.to_csv(w / "submission.csv")  # index=True: the classic mistake
        _assert_invalid(task, w, "index=False")

        w = tmp_path / f"{task.id}-header"
        w.mkdir()
        good.to_csv(w / "submission.csv", index=False, header=False)
        _assert_invalid(task, w, "header")

        for bad, needle in (("", "missing"), ("nan", "nan"), ("abc", "'abc'")):
            w = tmp_path / f"{task.id}-val-{bad or 'blank'}"
            w.mkdir()
            df = good.astype(object)
            df.iloc[3, 1] = bad
            df.to_csv(w / "submission.csv", index=False)
            _assert_invalid(task, w, needle, "row 4")

    # numbers only, where numbers are needed
    for task in (auc, ll, reg, multi):
        w = tmp_path / f"{task.id}-nonnum"
        w.mkdir()
        df = grader.oracle_submission(task).astype(object)
        df.iloc[7, 1] = "high"
        df.to_csv(w / "submission.csv", index=False)
        _assert_invalid(task, w, "non-numeric", "'high'", "row 8")

        w = tmp_path / f"{task.id}-inf"
        w.mkdir()
        df = grader.oracle_submission(task).astype(float)
        df.iloc[2, 1] = np.inf
        df.to_csv(w / "submission.csv", index=False)
        _assert_invalid(task, w, "infinite")

    # probabilities outside [0, 1]
    for task, value in ((auc, 1.5), (ll, -0.1)):
        w = tmp_path / f"{task.id}-range"
        w.mkdir()
        df = grader.oracle_submission(task).astype(float)
        df.iloc[5, 1] = value
        df.to_csv(w / "submission.csv", index=False)
        _assert_invalid(task, w, "outside [0, 1]", "row 6", "predict_proba")
    w = tmp_path / "ll-zero"
    w.mkdir()
    df = grader.oracle_submission(ll).astype(float)
    df.iloc[1, 1:] = 0.0
    df.to_csv(w / "submission.csv", index=False)
    _assert_invalid(ll, w, "summing to 0")

    # labels not in the class set
    w = tmp_path / "acc-class"
    w.mkdir()
    df = grader.oracle_submission(acc).astype(object)
    df.iloc[0, 1] = 11
    df.iloc[1, 1] = 0.73
    df.to_csv(w / "submission.csv", index=False)
    _assert_invalid(acc, w, "not a class", "'11'", "0, 1, 2", "row 1")

    # garbage never raises
    for i, blob in enumerate((b"\xff\xfe\x00garbage", b'prediction\n"unterminated\n1\n', b"\n\n\n",
                              b"prediction;x\n1;2\n", "prediction\n" + "0.5\n" * 10**5)):
        w = tmp_path / f"garbage{i}"
        _write(w, blob)
        assert grade(auc, w).status == "invalid"


def test_lenient_where_harmless(by_id, tmp_path):
    acc, ll = by_id["digits-8x8"], by_id["iris-species"]
    w = tmp_path / "floats"
    w.mkdir()
    df = grader.oracle_submission(acc)
    df["digit"] = df["digit"].astype(float)  # 3.0 is class 3
    df.to_csv(w / "submission.csv", index=False)
    assert grade(acc, w).reward >= 0.99
    w = tmp_path / "unnormalised"
    w.mkdir()
    df = grader.oracle_submission(ll)
    df[list(ll.value_columns)] *= 0.5
    df[list(reversed(ll.submission_columns))].to_csv(w / "submission.csv", index=False)
    g = grade(ll, w)
    assert g.status == "ok" and g.reward >= 0.99


def test_rows_are_matched_by_id(by_id, tmp_path):
    t = by_id["imbalanced-rare-noisy"]
    good = grader.oracle_submission(t)
    assert grade_frame(t, good.sample(frac=1.0, random_state=0)).reward >= 0.99  # any order
    ids = good[t.id_column].astype(object)
    for change, needles in (
        (lambda d: d.assign(**{t.id_column: ids.where(d.index != 4, "")}), ("missing", "row 5")),
        (lambda d: d.assign(**{t.id_column: ids.where(d.index != 4, ids[3])}), ("repeats", "row 5")),
        (lambda d: d.assign(**{t.id_column: ids.where(d.index != 2, 1)}), ("not in test_features.csv", "'1'")),
        (lambda d: d.drop(columns=[t.id_column]), ("missing", f"Copy the '{t.id_column}' column")),
    ):
        g = grade_frame(t, change(good.copy()))
        assert not g.ok
        for n in needles:
            assert n in g.message, (n, g.message)
    # the same predictions under shuffled rows score the same as in order
    ref = grader.reference_submission(t)
    assert grade_frame(t, ref.iloc[::-1]).score == pytest.approx(grade_frame(t, ref).score)


# --- external task directories ------------------------------------------------------


def _write_task_dir(root: Path, source, *, task_id: str, string_labels: bool = False,
                    yaml_extra: str = "", with_id: bool = True) -> Path:
    """A task directory made from a suite task: with its id column declared (the competition layout; the test
    labels then carry the ids, shuffled), or without it (rows matched by order); optionally relabelled."""
    d = root / task_id
    d.mkdir(parents=True)
    tr, te = T.train_frame(source), T.test_frame(source)
    y = T.hidden_labels(source)
    targets = list(source.target_columns)
    labels = pd.DataFrame(y.reshape(len(y), -1), columns=targets)
    if string_labels:
        names = {c: f"kind_{c}" for c in source.classes}
        tr[targets[0]] = tr[targets[0]].map(names)
        labels[targets[0]] = labels[targets[0]].map(names)
    if with_id:
        labels.insert(0, source.id_column, te[source.id_column].to_numpy())
        labels = labels.sample(frac=1.0, random_state=0)
        yaml_extra = f"id_column: {source.id_column}\n" + yaml_extra
    else:
        tr, te = tr.drop(columns=[source.id_column]), te.drop(columns=[source.id_column])
    tr.to_csv(d / "train.csv", index=False)
    te.to_csv(d / "test_features.csv", index=False)
    labels.to_csv(d / "test_labels.csv", index=False)
    (d / "description.md").write_text(f"# {task_id}\n\nA plugged-in competition.\n")
    target = targets[0] if len(targets) == 1 else "[" + ", ".join(targets) + "]"
    (d / "task.yaml").write_text(f"id: {task_id}\nmetric: {source.metric}\ntarget: {target}\nbudget_s: 90\n"
                                 + yaml_extra)
    return d


def test_external_round_trip(by_id, tmp_path):
    cache = tmp_path / "cache"
    wine = by_id["wine-cultivar"]
    d = _write_task_dir(tmp_path / "comps", wine, task_id="wine-text", string_labels=True,
                        yaml_extra="family: tabular-multiclass\nsplit: test_id\n")
    t = external.load_task_dir(d, cache_dir=cache)
    assert (t.id, t.metric, t.split, t.family, t.budget_s, t.suite) == (
        "wine-text", "macro_f1", "test_id", "tabular-multiclass", 90, "external")
    assert t.classes == ("kind_barbera", "kind_barolo", "kind_grignolino") and t.n_test == wine.n_test
    assert t.submission_columns == ("Id", "cultivar") and "Id" not in t.feature_columns
    assert "A plugged-in competition." in t.description and f"{t.n_test} rows × 14 columns" in t.description
    assert t.baseline == pytest.approx(wine.baseline) and t.reference == pytest.approx(wine.reference, abs=1e-6)
    assert len(list(cache.glob("wine-text-*.json"))) == 1  # the computed reference is cached
    assert external.load_task_dir(d, cache_dir=cache) == t

    work = tmp_path / "work"
    T.materialize(t, work)
    assert sorted(p.name for p in work.iterdir()) == ["test_features.csv", "train.csv"]
    assert grade_frame(t, grader.oracle_submission(t)).reward >= 0.99
    assert grade_frame(t, grader.baseline_submission(t)).reward <= 0.01
    bad = grader.oracle_submission(t)
    bad.iloc[0, 1] = "kind_9"
    g = grade_frame(t, bad)
    assert g.status == "invalid" and "kind_barolo" in g.message
    # the same data without its id column: rows matched by order, the legacy `prediction` / `p_<class>` layout
    plain = external.load_task_dir(_write_task_dir(tmp_path / "plain", by_id["iris-species"], task_id="iris-plain",
                                                   with_id=False), cache_dir=cache)
    assert plain.submission_columns == ("p_setosa", "p_versicolor", "p_virginica") and plain.id_column is None
    assert grade_frame(plain, grader.oracle_submission(plain)).reward >= 0.99
    shuffled = grader.reference_submission(plain).iloc[::-1]
    assert grade_frame(plain, shuffled).score > grade_frame(plain, grader.reference_submission(plain)).score

    # multi-output regression with a sample submission; pinned baseline/reference from task.yaml
    mo = by_id["multioutput-linear"]
    d2 = _write_task_dir(tmp_path / "comps", mo, task_id="mo", yaml_extra="baseline: 150.0\nreference: 40.0\n")
    sample = grader.baseline_submission(mo)
    sample.to_csv(d2 / "sample_submission.csv", index=False)
    t2 = external.load_task_dir(d2, cache_dir=cache)
    assert (t2.baseline, t2.reference, t2.task_type) == (150.0, 40.0, "multi-output")
    assert t2.submission_columns == mo.submission_columns == ("store_id", *mo.target_columns)
    T.materialize(t2, tmp_path / "work2")
    assert sorted(p.name for p in (tmp_path / "work2").iterdir()) == [
        "sample_submission.csv", "test_features.csv", "train.csv"]
    assert grade_frame(t2, grader.oracle_submission(t2)).reward == 1.0
    assert "sample_submission.csv" in t2.description

    roots = external.load_task_root(tmp_path / "comps", cache_dir=cache)
    assert [r.id for r in roots] == ["mo", "wine-text"]


@pytest.mark.parametrize("missing", sorted(external.REQUIRED_FILES))
def test_external_missing_file(by_id, tmp_path, missing):
    d = _write_task_dir(tmp_path, by_id["iris-species"], task_id="iris")
    (d / missing).unlink()
    with pytest.raises(ValueError, match=missing.replace(".", r"\.")) as info:
        external.load_task_dir(d, cache_dir=tmp_path / "c")
    assert "missing" in str(info.value)
    with pytest.raises(ValueError, match=missing.replace(".", r"\.")):
        external.load_task_root(tmp_path, cache_dir=tmp_path / "c")


@pytest.mark.parametrize("yaml_text, needle", [
    ("id: x\nmetric: auroc\ntarget: target\n", "unknown metric 'auroc'"),
    ("id: x\nmetric: [accuracy\ntarget: target\n", "malformed YAML"),
    ("- just\n- a list\n", "mapping"),
    ("id: x\ntarget: target\n", "missing required key 'metric'"),
    ("id: x\nmetric: accuracy\n", "missing required key 'target'"),
    ("id: x\nmetric: accuracy\ntarget: target\nbudget: 10\n", "unknown key"),
    ("id: x\nmetric: accuracy\ntarget: target\nbudget_s: -5\n", "budget_s"),
    ("id: x\nmetric: accuracy\ntarget: target\nsplit: dev\n", "split"),
    ("id: x y\nmetric: accuracy\ntarget: target\n", "'id'"),
])
def test_external_bad_yaml(by_id, tmp_path, yaml_text, needle):
    d = _write_task_dir(tmp_path, by_id["iris-species"], task_id="iris")
    (d / "task.yaml").write_text(yaml_text)
    with pytest.raises(ValueError) as info:
        external.load_task_dir(d, cache_dir=tmp_path / "c")
    assert "task.yaml" in str(info.value) and needle in str(info.value)


def test_external_inconsistent_files(by_id, tmp_path):
    iris = by_id["iris-species"]
    cases = []
    d = _write_task_dir(tmp_path / "a", iris, task_id="a", yaml_extra="")
    (d / "task.yaml").write_text("id: a\nmetric: accuracy\ntarget: variety\n")
    cases.append((d, "train.csv", "variety"))
    d = _write_task_dir(tmp_path / "b", iris, task_id="b")
    pd.read_csv(d / "test_labels.csv").iloc[:-1].to_csv(d / "test_labels.csv", index=False)
    cases.append((d, "test_labels.csv", "rows"))
    d = _write_task_dir(tmp_path / "c", iris, task_id="c")
    pd.read_csv(d / "test_features.csv").iloc[:, :-1].to_csv(d / "test_features.csv", index=False)
    cases.append((d, "test_features.csv", "feature columns"))
    d = _write_task_dir(tmp_path / "d", iris, task_id="d")
    pd.DataFrame({"prediction": [0.5] * iris.n_test}).to_csv(d / "sample_submission.csv", index=False)
    cases.append((d, "sample_submission.csv", "'Id', 'setosa', 'versicolor', 'virginica'"))
    d = _write_task_dir(tmp_path / "f", iris, task_id="f")
    te = pd.read_csv(d / "test_features.csv")
    te.loc[1, "Id"] = te.loc[0, "Id"]
    te.to_csv(d / "test_features.csv", index=False)
    cases.append((d, "test_features.csv", "id column 'Id' must name every row once"))
    d = _write_task_dir(tmp_path / "g", iris, task_id="g")
    pd.read_csv(d / "test_labels.csv").assign(Id=lambda f: f.Id + 10_000).to_csv(d / "test_labels.csv", index=False)
    cases.append((d, "test_labels.csv", "must hold the ids of test_features.csv"))
    d = _write_task_dir(tmp_path / "e", iris, task_id="e")
    (d / "train.csv").write_text("")
    cases.append((d, "train.csv", "CSV"))
    for d, name, needle in cases:
        with pytest.raises(ValueError) as info:
            external.load_task_dir(d, cache_dir=tmp_path / "cache")
        assert name in str(info.value) and needle in str(info.value), str(info.value)

    dup = tmp_path / "dup"
    _write_task_dir(dup, iris, task_id="one")
    other = _write_task_dir(dup, iris, task_id="two")
    (other / "task.yaml").write_text("id: one\nmetric: log_loss\ntarget: species\n")
    with pytest.raises(ValueError, match="already used"):
        external.load_task_root(dup, cache_dir=tmp_path / "cache")
    (tmp_path / "empty" / ".git").mkdir(parents=True)
    with pytest.raises(ValueError, match="no task directories"):
        external.load_task_root(tmp_path / "empty", cache_dir=tmp_path / "cache")


def _yes_no(d: Path, target: str) -> None:
    """Rewrite a binary task's labels 0/1 as no/yes."""
    for name in ("train.csv", "test_labels.csv"):
        df = pd.read_csv(d / name)
        df[target] = df[target].map({0: "no", 1: "yes"})
        df.to_csv(d / name, index=False)


def test_external_user_mistakes_are_one_line_that_says_what_to_do(by_id, tmp_path):
    cases = []
    d = _write_task_dir(tmp_path / "a", by_id["iris-species"], task_id="a")
    pd.read_csv(d / "train.csv").to_csv(d / "train.csv", sep=";", index=False)
    cases.append((d, "train.csv", "semicolons; write it comma-separated"))
    d = _write_task_dir(tmp_path / "b", by_id["iris-species"], task_id="b")
    pd.read_csv(d / "test_features.csv").to_csv(d / "test_features.csv")  # the index too, as pandas does by default
    cases.append((d, "test_features.csv", "'Unnamed: 0'): a pandas index written with the data; write it with "
                                          "df.to_csv(path, index=False)"))
    d = _write_task_dir(tmp_path / "c", by_id["diabetes-progression"], task_id="c")
    (d / "task.yaml").write_text("id: c\nmetric: accuracy\ntarget: progression\n")
    cases.append((d, "task.yaml", "metric 'accuracy' scores class labels, but target 'progression' looks continuous"))
    d = _write_task_dir(tmp_path / "d", by_id["binary-hastie"], task_id="d", yaml_extra="positive_label: yes\n",
                        with_id=False)
    _yes_no(d, "outcome")
    cases.append((d, "task.yaml", 'holds the boolean True but the labels are'))
    for d, name, needle in cases:
        with pytest.raises(ValueError) as info:
            external.load_task_dir(d, cache_dir=tmp_path / "cache")
        msg = str(info.value)
        assert msg.startswith(str(d / name)) and needle in msg and "\n" not in msg, msg

    (d / "task.yaml").write_text('id: d\nmetric: roc_auc\ntarget: outcome\npositive_label: "yes"\n')  # quoted: fine
    assert external.load_task_dir(d, cache_dir=tmp_path / "cache").classes == ("no", "yes")


def test_a_bad_task_directory_stops_wmrl_train_with_status_2_and_that_line(by_id, tmp_path):
    import subprocess
    import sys

    d = _write_task_dir(tmp_path / "comps", by_id["iris-species"], task_id="iris-copy")
    pd.read_csv(d / "train.csv").to_csv(d / "train.csv")
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "wmrl.cli", "train", "autoresearch", f"domain.task_root={d.parent}",
                           f"run_dir={run}", "--no-progress"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"wmrl train: error: {d / 'train.csv'}: has a column without a name ('Unnamed: 0'): a pandas index written "
        "with the data; write it with df.to_csv(path, index=False), or name the column if it is a real feature")
    assert not (run / "config.yaml").exists()  # nothing that would refuse the corrected retry as another run


def _mutations(good: bytes, rng: np.random.Generator):
    """Byte-level mutations of a valid submission: what a policy under pressure might write."""
    lines = good.split(b"\n")
    header = lines[0]
    pieces = [b"nan", b"inf", b"-1e999", b'"', b'""', b",", b"\x00", b"\xff", b"<|end|>", b"prediction",
              b" prediction", b"\r", b"\t", b"1e308", b"-0", b"0x1", b"\xef\xbb\xbf", b"\\", b"#", b"None"]
    for _ in range(150):
        ls = list(lines)
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(len(ls)))
            op = int(rng.integers(6))
            piece = pieces[int(rng.integers(len(pieces)))]
            if op == 0:
                ls[i] = ls[i] + b"," + piece
            elif op == 1:
                ls[i] = piece
            elif op == 2:
                ls.insert(i, piece)
            elif op == 3 and len(ls) > 2:
                del ls[i]
            elif op == 4:
                ls[0] = header + b"," + header.split(b",")[0] + piece[:1]
            else:
                cut = int(rng.integers(len(ls[i]) + 1))
                ls[i] = ls[i][:cut] + piece + ls[i][cut:]
        yield b"\n".join(ls)


def test_grading_never_raises_on_mutated_submissions(by_id):
    """Any exception out of the grader becomes an unknown grade: a policy must not be able to cause one."""
    rng = np.random.default_rng(0)
    for tid in ("bc-diagnosis", "iris-species", "digits-8x8", "diabetes-progression", "multioutput-linear"):
        task = by_id[tid]
        good = grader.oracle_submission(task).to_csv(index=False).encode()
        assert grader.grade_bytes(task, good).ok
        for data in _mutations(good, rng):
            g = grader.grade_bytes(task, data)
            assert g.status in ("ok", "invalid") and len(g.message) <= grader.MAX_MESSAGE_CHARS, (tid, data[:200], g)
