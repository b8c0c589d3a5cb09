"""A run's Markdown report with plots, built only from what the run folder holds.

It reads `metrics.jsonl` and `summary.json`, so a report can be rebuilt for any
finished or interrupted run (`wmrl report RUN_DIR`) without re-running anything.
The plots are the ones that tell whether WMRL is working: real held-out reward
against wall-clock, the four diagnostics, where the step time goes, and the
estimated reward against the real one, and the world model's raw score
against the real one on every anchor pair in the run store.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from wmrl.core.metrics import read_jsonl
from wmrl.core.registry import DOMAINS
from wmrl.core.store import RunStore

log = logging.getLogger(__name__)

DIAGNOSTICS = ("anchor_fraction", "calibrated", "bias_reduction", "anchor_weight")
TIMES = ("time_generation", "time_wm", "time_real", "time_update")


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def _plots(run_dir: Path, rows: list[dict], history: list[dict], pairs: list) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for split in ("test_id", "test_ood"):
        pts = [(h["wall"], h[f"eval_{split}"]) for h in history if h.get(f"eval_{split}") is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=split)
    ax.set(xlabel="wall-clock of training (s)", ylabel="real held-out reward", title="Held-out reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "heldout_vs_wall.png", dpi=110)
    made.append("heldout_vs_wall.png")

    fig, axes = plt.subplots(1, 4, figsize=(12, 2.8))
    for ax, key in zip(axes, DIAGNOSTICS):
        ax.plot(*_series(rows, key))
        ax.set(title=key, xlabel="step")
    fig.tight_layout()
    fig.savefig(run_dir / "diagnostics.png", dpi=110)
    made.append("diagnostics.png")

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for key in TIMES:
        ax.plot(*_series(rows, key), label=key.removeprefix("time_"))
    ax.set(xlabel="step", ylabel="seconds", title="Step time split")
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "time_split.png", dpi=110)
    made.append("time_split.png")

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for key, label in (("reward_estimated", "estimated (used for advantages)"), ("reward_real_anchors", "real (anchor groups)"),
                       ("reward_oracle", "true (oracle, not used)")):
        xs, ys = _series(rows, key)
        if xs:
            ax.plot(xs, ys, label=label)
    ax.set(xlabel="step", ylabel="reward", title="Estimated vs real reward")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(run_dir / "estimated_vs_real.png", dpi=110)
    made.append("estimated_vs_real.png")

    if pairs:
        fig, ax = plt.subplots(figsize=(4.2, 4.0))
        ax.scatter([p.wm_mean for p in pairs], [p.real for p in pairs], s=8, alpha=0.5)
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        ax.set(xlabel="world model's score (raw)", ylabel="real score", title=f"Anchor pairs (n={len(pairs)})")
        fig.tight_layout()
        fig.savefig(run_dir / "wm_vs_real.png", dpi=110)
        made.append("wm_vs_real.png")
    plt.close("all")
    return made


def _fmt(v) -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.3f}"


def _domain_section(run_dir: Path) -> list[str]:
    """What the run's domain adds (`Domain.report`); a section that cannot be drawn is left out with a warning."""
    from wmrl.config import load_run_config

    try:
        cfg = load_run_config(run_dir)
        cfg.run_dir = str(run_dir)
        return DOMAINS.get(cfg.domain.name)(cfg.domain).report(run_dir, cfg)
    except Exception as exc:  # noqa: BLE001 - an optional section never costs the report
        log.warning("the %s report section was left out: %s: %s", run_dir, type(exc).__name__, exc)
        return []


def write_report(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    if not rows:
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl rows: is it a wmrl run folder that trained a step?")
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    history = summary.get("history", [])
    pairs = []
    if (run_dir / "store.sqlite").exists():
        with RunStore(run_dir / "store.sqlite") as store:
            pairs = store.anchor_pairs()
    plots = _plots(run_dir, rows, history, pairs)
    total = {k: sum(r.get(k) or 0.0 for r in rows) for k in TIMES}
    step_total = sum(total.values()) or 1.0
    lines = [
        f"# wmrl run report: {summary.get('domain', '?')} / mode {summary.get('mode', '?')}",
        "",
        f"Steps trained: {rows[-1]['step']}. Real executions stored: {summary.get('real_executions', '?')}; "
        f"anchor pairs: {summary.get('anchor_pairs', '?')}.",
        "",
        "## Real held-out reward",
        "",
        "| step | wall (s) | test_id | test_ood |",
        "|---:|---:|---:|---:|",
    ]
    for h in history:
        lines.append(f"| {h['step']} | {h['wall']:.1f} | {_fmt(h.get('eval_test_id'))} | {_fmt(h.get('eval_test_ood'))} |")
    lines += [
        "",
        "## Where the step time went",
        "",
        "| part | seconds | share |",
        "|---|---:|---:|",
    ]
    for k, v in total.items():
        lines.append(f"| {k.removeprefix('time_')} | {v:.2f} | {v / step_total:.0%} |")
    last = rows[-1]
    lines += [
        "",
        "## Diagnostics at the last step",
        "",
        *[f"- `{k}`: {_fmt(last.get(k))}" for k in DIAGNOSTICS],
        "",
        *[f"![{p}]({p})" for p in plots],
        "",
        *_domain_section(run_dir),
    ]
    out = run_dir / "report.md"
    out.write_text("\n".join(lines))
    return out
