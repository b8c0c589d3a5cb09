"""`wmrl bench modes`: real vs wm vs the wmrl ablations on a synthetic domain, over seeds.

Overrides: `config=NAME` (default synthetic-program), `seeds=N` (default 3),
`out=PATH`, and any run-config key (e.g. `trainer.steps=40`) applied to all modes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from wmrl.bench.harness import run_one, summarize

#: mode name -> overrides; the ablation ladder of DESIGN section 2
MODES = {
    "real": ["estimator.mode=real"],
    "wm": ["estimator.mode=wm"],
    "wmrl-none": ["estimator.mode=wmrl", "estimator.debias.enabled=false", "estimator.denoise.enabled=false"],
    "wmrl-denoise": ["estimator.mode=wmrl", "estimator.debias.enabled=false"],
    "wmrl-debias": ["estimator.mode=wmrl", "estimator.denoise.enabled=false"],
    "wmrl": ["estimator.mode=wmrl"],
}


def run(overrides: list[str]) -> Path:
    opts = dict(o.split("=", 1) for o in overrides if o.split("=", 1)[0] in ("config", "seeds", "out"))
    rest = [o for o in overrides if o.split("=", 1)[0] not in ("config", "seeds", "out")]
    config = opts.get("config", "synthetic-program")
    out = Path(opts.get("out", f"bench/out/modes-{config}.json"))
    work = out.parent / f"runs-{config}"
    runs = []
    for seed in range(int(opts.get("seeds", 3))):
        for mode, mode_overrides in MODES.items():  # interleaved: drift hits every mode alike
            run_dir = work / mode / f"seed{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)  # a benchmark never resumes a stale run
            runs.append(run_one(config, [*rest, *mode_overrides], run_dir, mode, seed))
    result = {"benchmark": "modes", "config": config, "overrides": rest, **summarize(runs)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(table(result))
    return out


def _f(v, fmt="{:.3f}") -> str:
    return "—" if v is None or v != v else fmt.format(v)


def table(result: dict) -> str:
    """The Markdown results table (medians over seeds; spread = max - min)."""
    lines = [
        f"`wmrl bench modes` on `{result['config']}`, seeds {result['seeds']}, overrides {result['overrides'] or 'none'}",
        "",
        "| mode | held-out ID (spread) | held-out OOD | wall (s) | speed-up vs real | real execs | real share of time | reached real's final | time to it (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, m in result["modes"].items():
        lines.append(
            f"| {mode} | {_f(m['final_test_id_median'])} ({_f(m['final_test_id_spread'])}) | {_f(m['final_test_ood_median'])} "
            f"| {_f(m['wall_median'], '{:.1f}')} | {_f(m.get('wall_ratio_vs_reference'), '{:.2f}x')} "
            f"| {_f(m['real_executions_median'], '{:.0f}')} | {_f(m['real_wall_share_median'], '{:.0%}')} "
            f"| {m['reached_reference_final']}/{len(m['per_seed'])} | {_f(m['time_to_reference_final_median'], '{:.1f}')} |"
        )
    return "\n".join(lines) + "\n"
