"""`wmrl bench estimators`: every estimator of the ablation ladder on the same groups, scored against the truth.

`bench speedup` compares modes by the policies they end with, so each mode's
figure mixes its estimator with the path its policy happened to take. This
benchmark holds the path fixed: one run (mode `driver`, default `wmrl`)
collects each step's groups, anchors graded by both scorers and the rest by the
world model, and every estimator variant, each with its own debiaser and
denoiser state fed the same anchor pairs, estimates advantages on those same
groups. A variant is scored by the cosine between the update it would make and
the update the true rewards would make (`signal_cosine`), so only domains whose
true reward is free (the synthetic ones) can be scored. Paired per step, the
differences between variants are far less noisy than final rewards over seeds.

Besides the ladder, the rectified control variate is scored with lambda = 1
and with PPI++'s tuned lambda (`RECTIFIED`).

Options (`wmrl bench estimators --help`): `config=synthetic-program|synthetic-control`,
`profile=quick|full`, `seeds=N`, `driver=MODE`, `out=PATH`, and any run-config key.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wmrl.api import build_trainer
from wmrl.bench.harness import ProfileOptions, write_result
from wmrl.bench.speedup import ABLATION_ORDER, MODES
from wmrl.config import load_config
from wmrl.core.estimators import build_estimator
from wmrl.core.observers import OracleObserver
from wmrl.registry import register_benchmark

#: estimator-only variants (not training modes of `bench speedup`): the rectified control variate, lambda = 1 and tuned
RECTIFIED = {
    "wmrl-rectified": ["estimator.mode=wmrl", "estimator.rectified=true"],
    "wmrl-rectified-tuned": ["estimator.mode=wmrl", "estimator.rectified=true", "estimator.tune_lambda=true"],
}
VARIANTS = ("wm", *ABLATION_ORDER, *RECTIFIED)
#: config -> profile -> (seeds, overrides)
PROFILES = {
    "synthetic-program": {"quick": (3, ["trainer.steps=30"]), "full": (3, ["trainer.steps=80"])},
    "synthetic-control": {"quick": (3, ["trainer.steps=20"]), "full": (3, ["trainer.steps=60"])},
}


@dataclass
class EstimatorsOptions(ProfileOptions):
    driver: str = field(default="wmrl", metadata={"help": "the mode whose run collects the groups"})

    def validate(self) -> None:
        super().validate()
        if self.config not in PROFILES:
            raise ValueError(f"config={self.config}: this benchmark needs a free true reward; choose {', '.join(PROFILES)}")
        if self.driver not in MODES or self.driver == "real":
            raise ValueError(f"driver={self.driver}: choose a mode with a world model: "
                             f"{', '.join(m for m in MODES if m != 'real')}")


def _variant_estimators(config: str, overrides: list[str]) -> dict:
    out = {}
    for name in VARIANTS:
        cfg = load_config(config, [*overrides, *{**MODES, **RECTIFIED}[name]])
        out[name] = build_estimator(cfg.estimator, cfg.anchors.fraction)
    return out


def run_seed(config: str, overrides: list[str], driver: str, seed: int, run_dir: Path) -> dict[str, list[float]]:
    """Per variant, the cosine of every step of one driven run (NaN where the truth gives no signal)."""
    cfg = load_config(config, [*overrides, *MODES[driver], f"trainer.seed={seed}", f"run_dir={run_dir}",
                               "tensorboard=false", "trainer.eval_every=0"])
    variants = _variant_estimators(config, overrides)
    trainer = build_trainer(cfg)
    oracle = OracleObserver(trainer.domain, cfg.estimator.advantage)
    cosines: dict[str, list[float]] = {name: [] for name in variants}

    def observe(step, groups, est):
        for name, estimator in variants.items():
            cosines[name].append(oracle(step, groups, estimator.estimate(groups))["advantage_cosine_oracle"])
        return {}

    trainer.observers.append(observe)
    try:
        trainer.train()
    finally:
        trainer.close()
    if all(np.isnan(c) for cs in cosines.values() for c in cs):
        raise ValueError(f"config {config}: its domain has no free true reward to score estimators against")
    return cosines


def summarize(per_seed: list[dict[str, list[float]]]) -> dict:
    """Medians over seeds of each run's mean cosine, and per-step differences against `wmrl-none`."""
    out = {}
    for name in VARIANTS:
        means = [float(np.nanmean(s[name])) for s in per_seed]
        diffs = np.concatenate([np.array(s[name]) - np.array(s["wmrl-none"]) for s in per_seed])
        diffs = diffs[np.isfinite(diffs)]
        curve = np.nanmedian(np.array([s[name] for s in per_seed]), axis=0)
        out[name] = {
            "cosine_median": float(np.median(means)),
            "cosine_spread": float(np.ptp(means)),
            "per_seed": means,
            "vs_none_median_diff": float(np.median(diffs)) if diffs.size else float("nan"),
            "vs_none_win_rate": float(np.mean(diffs > 0)) if diffs.size else float("nan"),
            "curve": [None if not np.isfinite(c) else float(c) for c in curve],
        }
    return out


@register_benchmark("estimators", options=EstimatorsOptions, run_config=True)
def run(opts: EstimatorsOptions, user: list[str]) -> Path:
    config, driver = opts.config, opts.driver
    seeds, base = PROFILES[config][opts.profile]
    seeds = opts.seeds or seeds
    rest = [*base, *user]
    out, work = opts.output_paths("estimators")
    per_seed = []
    for seed in range(seeds):
        run_dir = work / f"seed{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)
        per_seed.append(run_seed(config, rest, driver, seed, run_dir))
    variants = summarize(per_seed)
    ladder = [variants[k]["cosine_median"] for k in ABLATION_ORDER]
    result = {
        "benchmark": "estimators", "config": config, "profile": opts.profile, "driver": driver,
        "overrides": rest, "seeds": list(range(seeds)), "variants": variants,
        "order_measured": [k for _, k in sorted(zip(ladder, ABLATION_ORDER))],
        "order_matches_paper": all(a < b for a, b in zip(ladder, ladder[1:])),
    }
    return write_result(out, result, table, plot)


def table(result: dict) -> str:
    lines = [
        f"`wmrl bench estimators config={result['config']} profile={result['profile']}`: driver {result['driver']}, "
        f"seeds {result['seeds']}, overrides {result['overrides'] or 'none'}",
        "",
        "| estimator | signal vs true (cos), median (spread) | vs none: median per-step difference | steps better than none |",
        "|---|---:|---:|---:|",
    ]
    for name, v in result["variants"].items():
        lines.append(f"| {name} | {v['cosine_median']:.3f} ({v['cosine_spread']:.3f}) | {v['vs_none_median_diff']:+.3f} "
                     f"| {v['vs_none_win_rate']:.0%} |")
    lines += ["", f"Order, worst to best: {' < '.join(result['order_measured'])} "
                  f"(paper: {' < '.join(ABLATION_ORDER)}; matches: {result['order_matches_paper']})"]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    window = 5  # steps: the per-step cosine is noisy, the curve is its running mean
    for name, v in result["variants"].items():
        ys = np.array([np.nan if c is None else c for c in v["curve"]])
        smooth = [np.nanmean(ys[max(0, i - window + 1) : i + 1]) for i in range(len(ys))]
        ax.plot(range(1, len(ys) + 1), smooth, label=name, alpha=0.85)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"cosine with the true update ({window}-step mean)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"wmrl bench estimators: {result['config']} ({result['profile']}, driver {result['driver']}), "
                 "median over seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
