"""`wmrl bench wm`: world-model fidelity against real outcomes, for every world model a domain offers.

Per seed, one `real`-mode run (every group really executed, so the stream is
as large as the budget allows) provides the ground truth; then each world model
the domain registers is measured on that same stream with `wmrl eval-wm`
(prequential over training steps, then the held-out evaluation episodes). Same
data for every world model, so their figures compare directly. Medians over
seeds; JSON and a Markdown table.

Options (`wmrl bench wm --help`): `config=NAME` (default autoresearch),
`profile=quick|full`, `seeds=N`, `warmup=N` (real executions before
predictions count), `wms=a,b`, `out=PATH`, `runs=DIR,DIR` (measure on
existing run folders, e.g. the `real` runs of `wmrl bench speedup`, instead of
training new ones), `resume=true` (keep finished runs of an earlier
invocation), and any run-config key for the runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wmrl.bench.harness import ProfileOptions, run_one, write_result
from wmrl.config import load_config
from wmrl.core.wm_spec import world_models_for
from wmrl.registry import register_benchmark
from wmrl.wm_eval import evaluate_world_model

#: config -> profile -> (seeds, warmup, run overrides)
PROFILES = {
    "autoresearch": {
        "quick": (1, 16, ["trainer.steps=4", "trainer.groups_per_step=4", "trainer.eval_samples=2", "trainer.eval_every=0"]),
        "full": (3, 32, ["trainer.steps=12", "trainer.eval_samples=4", "trainer.eval_every=0"]),
    },
}
_DEFAULT = {"quick": (1, 16, ["trainer.steps=10", "trainer.eval_every=0"]),
            "full": (3, 32, ["trainer.steps=30", "trainer.eval_every=0"])}
#: the figures the table shows, per section
FIGURES = ("within_group_spearman", "spearman", "mae", "nll", "coverage_0.8", "var_error_spearman")


def _figure(section: dict, name: str):
    if name == "coverage_0.8":
        return section["coverage"].get("0.8")
    return section.get(name)


@dataclass
class WMOptions(ProfileOptions):
    config: str = field(default="autoresearch", metadata={"help": "shipped config name or YAML path"})
    warmup: int | None = field(default=None, metadata={"help": "real executions before predictions count"})
    wms: str | None = field(default=None, metadata={"help": "comma-separated world models (default: all the domain's)"})
    runs: str | None = field(default=None, metadata={"help": "comma-separated run folders to measure on instead"})
    resume: bool = field(default=False, metadata={"help": "keep finished runs of an earlier invocation"})

    def validate(self) -> None:
        super().validate()
        if self.warmup is not None and self.warmup < 0:
            raise ValueError(f"warmup={self.warmup}: must be >= 0")


@register_benchmark("wm", options=WMOptions, run_config=True)
def run(opts: WMOptions, user: list[str]) -> Path:
    config, profile = opts.config, opts.profile
    seeds, warmup, base = PROFILES.get(config, _DEFAULT)[profile]
    seeds = opts.seeds or seeds
    warmup = warmup if opts.warmup is None else opts.warmup
    rest = [*base, *user, "estimator.mode=real"]
    wms = opts.wms.split(",") if opts.wms else world_models_for(load_config(config, rest).domain.name)
    out, work = opts.output_paths("wm")

    given = [Path(p) for p in opts.runs.split(",")] if opts.runs else None
    per_seed = []
    for seed in range(len(given) if given else seeds):
        if given:
            run_dir = given[seed]
        else:
            run_dir = work / f"seed{seed}"
            run_one(config, rest, run_dir, "real", seed, reuse=opts.resume)
        per_seed.append({"seed": seed, "run_dir": str(run_dir),
                         "world_models": {w: evaluate_world_model(run_dir, w, warmup=warmup) for w in wms}})
    summary: dict = {}
    for w in wms:
        sections = [k for k in per_seed[0]["world_models"][w] if isinstance(per_seed[0]["world_models"][w][k], dict)]
        summary[w] = {
            sec: {f: _median([_figure(s["world_models"][w][sec], f) for s in per_seed if s["world_models"][w].get(sec)])
                  for f in FIGURES}
            for sec in sections
        }
    result = {"benchmark": "wm", "config": config, "profile": profile, "overrides": rest, "warmup": warmup,
              "seeds": [s["seed"] for s in per_seed], "summary": summary, "per_seed": per_seed}
    return write_result(out, result, table)


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None and x == x]
    return float(np.median(xs)) if xs else None


def table(result: dict) -> str:
    lines = [
        f"`wmrl bench wm config={result['config']} profile={result['profile']}`: seeds {result['seeds']}, "
        f"warm-up {result['warmup']} real executions; medians over seeds",
        "",
        "| world model | data | within-group Spearman | Spearman | MAE | NLL | 80% interval coverage | Spearman(sd, abs error) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    for w, sections in result["summary"].items():
        for sec, figs in sections.items():
            lines.append(f"| {w} | {sec} | " + " | ".join(fmt(figs[f]) for f in FIGURES) + " |")
    return "\n".join(lines) + "\n"
