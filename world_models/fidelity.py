"""How good is a world model? Held-out fidelity metrics of WM predictions against real outcomes.

Which numbers, and why these:

* within-group Spearman -- GRPO standardises rewards inside each group, so
  what the policy gradient sees from the WM is its *ranking* of a group's
  members; a WM that is biased but ranks well is already useful, and the
  debiaser's monotone map cannot repair a wrong ranking. Averaged over groups
  whose real scores and predictions both take >= 2 distinct values (ties get
  average ranks); groups where the WM is constant but reality is not are
  counted separately, because they carry no signal at all.
* overall Spearman, MAE and bias (mean WM - real), overall and per bucket of
  the real score: where the systematic part b of the WM's error lives, the
  thing Online Debiasing removes.
* Gaussian NLL, central-interval coverage (levels 0.5/0.8/0.9) and the rank
  correlation of the predicted variance with the absolute error -- whether
  the WM's *variance* means what it says; Inverse-Variance Denoising and
  per-trajectory weighting trust it. Variances are floored so a WM claiming
  certainty gets a large but finite penalty.
* drift -- the same MAE / Spearman / coverage per window of training steps:
  the policy moves, the WM's error moves with it.

Only rows with a known prediction count (unknown grades are excluded by the
estimator, so they are reported as a count, not scored). Pure numpy; the plot
uses matplotlib's Agg backend.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import NormalDist
from typing import Any, Iterable, Sequence

import numpy as np

LEVELS = (0.5, 0.8, 0.9)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 with ties given their average rank."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=float)
    sorted_x = x[order]
    start = 0
    while start < len(x):
        end = start
        while end + 1 < len(x) and sorted_x[end + 1] == sorted_x[start]:
            end += 1
        ranks[order[start:end + 1]] = 0.5 * (start + end)
        start = end + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation with average ranks for ties; NaN when either side is constant."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) != len(y):
        raise ValueError(f"spearman needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum() / denom) if denom > 0 else float("nan")


def success_auc(wm: Sequence[float], real: Sequence[float]) -> float | None:
    """For binary real outcomes (success 1 / failure 0): the chance that the WM scores a random success
    above a random failure (ROC AUC, ties counted half); None unless both outcomes occur."""
    m, r = np.asarray(wm, float), np.asarray(real, float)
    pos = r == 1.0
    if not np.all(pos | (r == 0.0)) or pos.all() or not pos.any():
        return None
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    rank_sum = float((_ranks(m)[pos] + 1).sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def _nan_to_none(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _within_group(groups: np.ndarray, wm: np.ndarray, real: np.ndarray) -> tuple[float, int, int]:
    """(mean within-group Spearman, groups ranked, groups where only the WM is constant)."""
    rhos, constant_wm = [], 0
    _, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.flatnonzero(np.diff(inverse[order])) + 1
    for sel in np.split(order, bounds):  # one index array per group, without an O(n) scan per group
        if len(np.unique(real[sel])) < 2:
            continue  # reality does not rank this group: nothing to agree with
        if len(np.unique(wm[sel])) < 2:
            constant_wm += 1
            continue
        rhos.append(spearman(wm[sel], real[sel]))
    return (float(np.mean(rhos)) if rhos else float("nan")), len(rhos), constant_wm


def _coverage(wm: np.ndarray, var: np.ndarray, real: np.ndarray, levels: Sequence[float]) -> dict[str, float]:
    sd = np.sqrt(var)
    out = {}
    for level in levels:
        z = NormalDist().inv_cdf(0.5 + level / 2.0)
        out[f"{level:g}"] = float(np.mean(np.abs(real - wm) <= z * sd)) if len(wm) else float("nan")
    return out


def as_arrays(records: Iterable[Any]) -> dict[str, np.ndarray]:
    """Columns from records with group_id/step/wm_mean/wm_var/real (attributes or keys), e.g. AnchorPairs."""
    cols: dict[str, list] = {"group_id": [], "step": [], "wm_mean": [], "wm_var": [], "real": []}
    for r in records:
        for k, v in cols.items():
            v.append(r[k] if isinstance(r, dict) else getattr(r, k))
    return {
        "group_id": np.asarray([str(g) for g in cols["group_id"]], dtype=object),
        "step": np.asarray(cols["step"], dtype=float),
        "wm_mean": np.asarray([np.nan if v is None else v for v in cols["wm_mean"]], dtype=float),
        "wm_var": np.asarray([np.nan if v is None else v for v in cols["wm_var"]], dtype=float),
        "real": np.asarray(cols["real"], dtype=float),
    }


def fidelity(
    group_id: Sequence[Any],
    step: Sequence[float],
    wm_mean: Sequence[float | None],
    wm_var: Sequence[float | None],
    real: Sequence[float],
    *,
    buckets: int = 5,
    levels: Sequence[float] = LEVELS,
    var_floor: float = 1e-4,
    window: int | None = None,
    max_points: int = 2000,
) -> dict:
    """Fidelity metrics of WM predictions against real outcomes (see the module docstring).

    `wm_mean` None/NaN = an unknown grade (counted, excluded); `wm_var` None/NaN
    = no variance (excluded from NLL and coverage only). `window` is the drift
    window in steps (default: the step range split into 5). `points` holds up to
    `max_points` (wm, real) pairs, evenly subsampled, for the calibration plot.
    """
    g = np.asarray([str(x) for x in group_id], dtype=object)
    s = np.asarray(step, dtype=float)
    m = np.asarray([np.nan if v is None else v for v in wm_mean], dtype=float)
    v = np.asarray([np.nan if x is None else x for x in wm_var], dtype=float)
    r = np.asarray(real, dtype=float)
    if not len(g) == len(s) == len(m) == len(v) == len(r):
        raise ValueError("group_id, step, wm_mean, wm_var and real must have the same length")
    if not np.all(np.isfinite(r)):
        raise ValueError("real outcomes must be finite (drop unknown real grades first)")
    known = np.isfinite(m)
    g, s, m, v, r = g[known], s[known], m[known], v[known], r[known]
    out = _core(g, m, v, r, levels, var_floor)
    out["n_unknown"] = int((~known).sum())

    edges = np.linspace(0.0, 1.0, buckets + 1)
    idx = np.clip(np.searchsorted(edges, r, side="right") - 1, 0, buckets - 1)
    out["by_real_bucket"] = [
        {"lo": float(edges[b]), "hi": float(edges[b + 1]), "n": int((idx == b).sum()),
         "bias": _nan_to_none(float(np.mean(m[idx == b] - r[idx == b]))) if (idx == b).any() else None,
         "mae": _nan_to_none(float(np.mean(np.abs(m[idx == b] - r[idx == b])))) if (idx == b).any() else None}
        for b in range(buckets)
    ]

    drift = []
    if len(s):
        lo, hi = float(s.min()), float(s.max())
        width = window if window is not None else max(1.0, math.ceil((hi - lo + 1) / 5))
        if width <= 0:
            raise ValueError("window must be > 0 steps")
        start = lo
        while start <= hi:
            sel = (s >= start) & (s < start + width)
            if sel.any():
                w = _core(g[sel], m[sel], v[sel], r[sel], levels, var_floor)
                drift.append({"step_lo": start, "step_hi": start + width, **{k: w[k] for k in (
                    "n", "mae", "bias", "spearman", "within_group_spearman", "n_groups_ranked", "coverage")}})
            start += width
    out["drift"] = drift

    pick = np.linspace(0, len(m) - 1, min(len(m), max_points)).round().astype(int) if len(m) else np.zeros(0, int)
    out["points"] = {"wm": m[pick].tolist(), "real": r[pick].tolist()}
    return out


def _core(g: np.ndarray, m: np.ndarray, v: np.ndarray, r: np.ndarray, levels: Sequence[float],
          var_floor: float) -> dict:
    n = len(m)
    wg, n_ranked, n_const = _within_group(g, m, r) if n else (float("nan"), 0, 0)
    has_var = np.isfinite(v)
    vv = np.maximum(v[has_var], var_floor)
    dm, dr = m[has_var], r[has_var]
    nll = float(np.mean(0.5 * (np.log(2 * np.pi * vv) + (dr - dm) ** 2 / vv))) if has_var.any() else float("nan")
    return {
        "n": int(n),
        "within_group_spearman": _nan_to_none(wg),
        "n_groups_ranked": n_ranked,
        "n_groups_constant_wm": n_const,
        "spearman": _nan_to_none(spearman(m, r)) if n >= 2 else None,
        "success_auc": success_auc(m, r),
        "mae": _nan_to_none(float(np.mean(np.abs(m - r)))) if n else None,
        "bias": _nan_to_none(float(np.mean(m - r))) if n else None,
        "n_with_var": int(has_var.sum()),
        "nll": _nan_to_none(nll),
        # does the WM know where it is wrong? rank correlation of its sd with its absolute error
        "var_error_spearman": _nan_to_none(spearman(vv, np.abs(dr - dm))) if len(vv) >= 2 else None,
        "coverage": {k: _nan_to_none(x) for k, x in _coverage(dm, vv, dr, levels).items()},
    }


def write_report(metrics: dict, out_dir: str | Path, *, name: str = "wm_fidelity") -> tuple[Path, Path]:
    """Write `<name>.json` (metrics, NaN as null) and `<name>.png` (calibration, coverage, drift)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / f"{name}.json", out / f"{name}.png"
    json_path.write_text(json.dumps(_jsonable(metrics), indent=2, allow_nan=False))

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    ax = axes[0]
    pts = metrics.get("points", {"wm": [], "real": []})
    ax.scatter(pts["wm"], pts["real"], s=6, alpha=0.4)
    ax.plot([0, 1], [0, 1], "k--", lw=1)
    ax.set(xlabel="WM mean", ylabel="real", title=f"calibration (MAE {_fmt(metrics.get('mae'))})",
           xlim=(-0.02, 1.02), ylim=(-0.02, 1.02))
    ax = axes[1]
    cov = metrics.get("coverage", {})
    nominal = [float(k) for k in cov]
    ax.plot([0, 1], [0, 1], "k--", lw=1)
    ax.plot(nominal, [np.nan if x is None else x for x in cov.values()], "o-")
    ax.set(xlabel="nominal level", ylabel="observed coverage", title=f"coverage (NLL {_fmt(metrics.get('nll'))})",
           xlim=(0, 1), ylim=(0, 1))
    ax = axes[2]
    drift = metrics.get("drift", [])
    mid = [0.5 * (d["step_lo"] + d["step_hi"]) for d in drift]
    ax.plot(mid, [np.nan if d["mae"] is None else d["mae"] for d in drift], "o-", label="MAE")
    ax.plot(mid, [np.nan if d["within_group_spearman"] is None else d["within_group_spearman"] for d in drift],
            "s-", label="within-group Spearman")
    ax.set(xlabel="step", title="drift")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return json_path, png_path


def _fmt(x: Any) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return _nan_to_none(float(x))
    if isinstance(x, np.integer):
        return int(x)
    return x
