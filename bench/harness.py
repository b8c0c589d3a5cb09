"""Side-by-side runs of several estimator modes, and the rules for comparing them.

A ratio between two modes means something only if both sides saw the same
tasks, the same seeds and the same number of policy updates, on the same
machine at the same time. The harness therefore interleaves modes within each
seed (machine drift hits every mode alike) and refuses to compare runs that
differ in any of those (`IncomparableRuns`).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import yaml

from wmrl.api import build_trainer
from wmrl.config import load_config, to_yaml
from wmrl.core.metrics import read_jsonl


class IncomparableRuns(ValueError):
    """Two runs differ in seeds, tasks or update counts: no ratio may be reported."""


@dataclass
class RunRecord:
    mode: str
    seed: int
    steps: int
    task_digest: str
    history: list[dict]
    real_executions: int  # real training episodes (held-out evaluation episodes not counted)
    wall: float
    real_wall: float
    signal_cosine: float = float("nan")  # mean over steps of `advantage_cosine_oracle` (NaN: no free true reward)


@dataclass
class ProfileOptions:
    """Options every training benchmark has: the run config, the profile, seeds, where the JSON goes."""

    config: str = field(default="synthetic-program", metadata={"help": "shipped config name or YAML path"})
    profile: str = field(default="full", metadata={"help": "quick (a smoke run) | full (the measurement)"})
    seeds: int | None = field(default=None, metadata={"help": "seeds per variant (default: the profile's)"})
    out: str | None = field(default=None, metadata={"help": "JSON path (default: bench/out/<benchmark>-<config>-<profile>.json)"})

    def validate(self) -> None:
        if self.profile not in ("quick", "full"):
            raise ValueError(f"profile={self.profile!r}: choose quick or full")
        if self.seeds is not None and self.seeds < 1:
            raise ValueError(f"seeds={self.seeds}: must be >= 1")

    def output_paths(self, benchmark: str) -> tuple[Path, Path]:
        """The JSON path, and the folder beside it that holds the benchmark's runs."""
        out = Path(self.out or f"bench/out/{benchmark}-{self.config}-{self.profile}.json")
        return out, out.parent / f"runs-{out.stem}"


def write_result(out: Path, result: dict, table: Callable[[dict], str],
                 plot: Callable[[dict, Path], None] | None = None) -> Path:
    """A benchmark's JSON at `out`, its Markdown table beside it (.md) and its plot (.png) if it has one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(table(result))
    if plot is not None:
        plot(result, out.with_suffix(".png"))
    return out


def task_digest(tasks) -> str:
    return hashlib.sha256("|".join(t.id for t in tasks).encode()).hexdigest()[:16]


_ABSENT = object()


def _flat(tree, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return {k.rstrip("."): v for k, v in out.items()}


def same_config(saved: Path, text: str, config: str) -> bool:
    """Whether the run config saved at `saved` is `text`, up to keys the schema gained since it was written
    that hold their default here (the config file's value: a new key defaults to the old behaviour), so a
    finished run survives a new option. The file is brought up to `text` when it matches."""
    if not saved.exists():
        return False
    old_text = saved.read_text()
    if old_text == text:
        return True
    old, new = _flat(yaml.safe_load(old_text)), _flat(yaml.safe_load(text))
    added = {k: v for k, v in new.items() if k not in old}
    if any(new.get(k, _ABSENT) != v for k, v in old.items()):
        return False
    default = _flat(yaml.safe_load(to_yaml(load_config(config, []))))
    if any(default.get(k, _ABSENT) != v for k, v in added.items()):
        return False
    saved.write_text(text)
    return True


def provenance(cfg) -> str:
    """The domain's `provenance()` for a run config, as the text a run folder keeps in `provenance.json`."""
    from wmrl.core.registry import DOMAINS

    return json.dumps(DOMAINS.get(cfg.domain.name)(cfg.domain).provenance(), sort_keys=True)


def reusable(run_dir: Path, text: str, config: str, cfg) -> bool:
    """A stored run of this config (`same_config`) whose unpinned inputs (`provenance`) are the same too."""
    stamp = run_dir / "provenance.json"
    return stamp.exists() and stamp.read_text() == provenance(cfg) and same_config(run_dir / "config.yaml", text, config)


def fresh_run_dir(run_dir: Path, config_text: str, cfg) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(config_text)  # a self-describing run folder (`wmrl eval-wm` reads it)
    (run_dir / "provenance.json").write_text(provenance(cfg))


def run_one(config: str, overrides: Sequence[str], run_dir: Path, mode: str, seed: int,
            reuse: bool = False) -> RunRecord:
    """One run of a comparison, trained from scratch; with `reuse`, a finished run of the same
    config already in `run_dir` is taken as it is (a benchmark cut short goes on where it stopped).

    A partial run is never resumed here: its replayed steps would read their executions back
    from the store, so their wall-clock would not be what executing them costs.
    """
    cfg = load_config(config, [*overrides, f"trainer.seed={seed}", f"run_dir={run_dir}", "tensorboard=false"])
    run_dir, text = Path(run_dir), to_yaml(cfg)
    reused = reuse and reusable(run_dir, text, config, cfg)
    if not reused:
        fresh_run_dir(run_dir, text, cfg)
    trainer = build_trainer(cfg)
    if reused and trainer.step != cfg.trainer.steps:  # cut short, perhaps before its first checkpoint
        trainer.close()
        fresh_run_dir(run_dir, text, cfg)
        trainer = build_trainer(cfg)
    try:
        history = trainer.train()
        steps = read_jsonl(Path(run_dir) / "metrics.jsonl")
        return RunRecord(
            mode, seed, trainer.step, task_digest(trainer.train_tasks), history,
            trainer.real_executions, trainer.wall, trainer.real_wall,
            _mean([row.get("advantage_cosine_oracle") for row in steps]),
        )
    finally:
        trainer.close()


def check_comparable(runs: Sequence[RunRecord]) -> None:
    by_mode: dict[str, list[RunRecord]] = {}
    for r in runs:
        by_mode.setdefault(r.mode, []).append(r)
    ref = None
    for mode, rs in by_mode.items():
        sig = (sorted(r.seed for r in rs), {r.steps for r in rs}, {r.task_digest for r in rs})
        if len(sig[1]) != 1 or len(sig[2]) != 1:
            raise IncomparableRuns(f"mode {mode}: runs differ in update counts or tasks within the mode")
        if ref is None:
            ref = (mode, sig)
        elif sig != ref[1]:
            raise IncomparableRuns(
                f"modes {ref[0]} and {mode} differ in seeds {ref[1][0]} vs {sig[0]}, "
                f"updates {ref[1][1]} vs {sig[1]} or tasks: refusing to report a ratio"
            )


def fmt(v: float | None, spec: str = "{:.3f}") -> str:
    """A table cell: the number, or a dash where it was not measured (None or NaN)."""
    return "—" if v is None or v != v else spec.format(v)


def _finite(xs: Sequence[float | None]) -> list[float]:
    return [x for x in xs if x is not None and math.isfinite(x)]


def _median(xs: Sequence[float | None]) -> float:
    xs = _finite(xs)
    return float(np.median(xs)) if xs else float("nan")


def _mean(xs: Sequence[float | None]) -> float:
    xs = _finite(xs)
    return float(np.mean(xs)) if xs else float("nan")


def time_to_reach(history: list[dict], target: float, key: str = "eval_test_id", at: str = "wall") -> float | None:
    """`at` (training wall-clock, or `real_executions` spent) at the first evaluation whose reward reaches
    `target` (None: never)."""
    for h in history:
        if h.get(key) is not None and h[key] >= target:
            return float(h[at])
    return None


def bootstrap_interval(values: Sequence[float | None], *, stat=np.mean, level: float = 0.95, draws: int = 4000,
                       seed: int = 0) -> list[float | None] | None:
    """Percentile bootstrap interval of `stat` over seeds: None with fewer than two values. A None value (a seed
    that never got there, for a time) counts as infinite, and an infinite bound is None (not reached)."""
    xs = np.array([math.inf if x is None else float(x) for x in values])
    xs = xs[~np.isnan(xs)]
    if len(xs) < 2:
        return None
    stats = stat(xs[np.random.default_rng(seed).integers(len(xs), size=(draws, len(xs)))], axis=1)
    tail = (1.0 - level) / 2
    return [float(q) if math.isfinite(q) else None for q in np.quantile(stats, [tail, 1.0 - tail], method="lower")]


def final_interval(per_seed: Sequence[dict], split: str) -> list[float | None] | None:
    """The 95% interval of a mode's mean final held-out reward over its seeds."""
    return bootstrap_interval([r["final"].get(f"eval_{split}") for r in per_seed])


def plateau(per_seed: Sequence[dict], split: str = "test_id", tail: float = 0.25) -> dict:
    """Whether a mode's held-out reward was still rising when its runs ended: per seed the gain over the last
    `tail` of training (final evaluation minus the last one at or before step (1 - tail) x steps), and the 95%
    interval of the mean gain. `plateaued` is True when that interval reaches down to 0 (no rise the seeds can
    tell from noise), None with fewer than two seeds or evaluations."""
    gains = []
    for run in per_seed:
        curve = [(h["step"], h[f"eval_{split}"]) for h in run["history"] if h.get(f"eval_{split}") is not None]
        if len(curve) < 2:
            continue
        cut = (1.0 - tail) * curve[-1][0]
        gains.append(curve[-1][1] - [v for step, v in curve if step <= cut][-1])
    interval = bootstrap_interval(gains)
    return {"split": split, "tail": tail, "gain_per_seed": gains, "gain_interval": interval,
            "plateaued": None if interval is None else bool(interval[0] <= 0.0)}


def held_out_change(histories: Sequence[list[dict]]) -> dict:
    """Per held-out column (`test_id` reward, `test_ood_ok`, `test_ood_parsed`, ...): the median over seeds
    before training and after it, each seed's change (after - before), so a fall is read per seed, and the 95%
    bootstrap interval of the mean change: a fall counts where that interval lies below 0."""
    out: dict = {}
    for split in ("test_id", "test_ood"):
        cols = sorted({k for h in histories for k in h[0] if k == f"eval_{split}" or k.startswith(f"eval_{split}_")})
        for col in cols:
            pairs = [(h[0].get(col), h[-1].get(col)) for h in histories]
            changes = [None if a is None or b is None or not math.isfinite(a - b) else a - b for b, a in pairs]
            out[col[len("eval_"):]] = {
                "before": _median([b for b, _ in pairs]), "after": _median([a for _, a in pairs]),
                "change_per_seed": changes,
                "change_interval": bootstrap_interval([c for c in changes if c is not None]),
            }
    return out


def summarize(runs: Sequence[RunRecord], reference: str = "real") -> dict:
    check_comparable(runs)
    modes = list(dict.fromkeys(r.mode for r in runs))
    out: dict = {"modes": {}, "seeds": sorted({r.seed for r in runs}), "reference": reference}
    ref_target = None
    if reference in modes:
        ref_target = _median([r.history[-1].get("eval_test_id") for r in runs if r.mode == reference])
    for mode in modes:
        rs = [r for r in runs if r.mode == mode]
        finals = {s: [r.history[-1].get(f"eval_{s}") for r in rs] for s in ("test_id", "test_ood")}
        reach = [time_to_reach(r.history, ref_target) for r in rs] if ref_target is not None else []
        spent = [time_to_reach(r.history, ref_target, at="real_executions") for r in rs] if ref_target is not None else []
        out["modes"][mode] = {
            "final_test_id_median": _median(finals["test_id"]),
            "final_test_id_spread": float(np.ptp([x for x in finals["test_id"] if x is not None])) if rs else None,
            "final_test_ood_median": _median(finals["test_ood"]),
            "initial_test_id_median": _median([r.history[0].get("eval_test_id") for r in rs]),
            "wall_median": _median([r.wall for r in rs]),
            "real_wall_share_median": _median([r.real_wall / r.wall if r.wall else float("nan") for r in rs]),
            "real_executions_median": _median([float(r.real_executions) for r in rs]),
            "signal_cosine_median": _median([r.signal_cosine for r in rs]),
            "time_to_reference_final_median": _median([x for x in reach if x is not None]) if any(x is not None for x in reach) else None,
            "reached_reference_final": sum(x is not None for x in reach),
            "real_executions_to_reference_final_median": _median([x for x in spent if x is not None])
            if any(x is not None for x in spent) else None,
            "held_out": held_out_change([r.history for r in rs]),
            "time_to_reference_final_interval": bootstrap_interval(reach, stat=np.median) if reach else None,
            "per_seed": [{"seed": r.seed, "final": r.history[-1], "history": r.history, "wall": r.wall,
                          "real_executions": r.real_executions, "signal_cosine": r.signal_cosine} for r in rs],
        }
        for split in ("test_id", "test_ood"):
            out["modes"][mode][f"final_{split}_interval"] = final_interval(out["modes"][mode]["per_seed"], split)
    if reference in modes:
        ref = out["modes"][reference]
        share = ref["real_wall_share_median"]
        for mode, m in out["modes"].items():
            m["wall_ratio_vs_reference"] = ref["wall_median"] / m["wall_median"] if m["wall_median"] else None
            # Amdahl: only the real-execution share of the reference's time shrinks, by the executions saved
            frac = m["real_executions_median"] / ref["real_executions_median"] if ref["real_executions_median"] else float("nan")
            m["ideal_speedup"] = 1.0 / ((1.0 - share) + share * frac) if math.isfinite(share * frac) else None
            t_ref, t = ref["time_to_reference_final_median"], m["time_to_reference_final_median"]
            m["speedup_to_reference_final"] = t_ref / t if t_ref and t else None
            e_ref, e = ref["real_executions_to_reference_final_median"], m["real_executions_to_reference_final_median"]
            # a mode that got there without a real execution (pure WM) saved all of them: no finite ratio
            m["fewer_real_executions_to_reference_final"] = e_ref / e if e_ref and e else None
    return out
