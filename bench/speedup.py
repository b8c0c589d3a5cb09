"""`wmrl bench speedup`: WMRL against standard RL on real execution, the pure world model and the ablations.

Every mode trains the same policy from the same seeds on the same tasks for the
same number of updates; modes are interleaved within each seed so machine drift
hits all of them alike, and the harness refuses to compare anything else
(`IncomparableRuns`). Per mode it reports the real held-out reward (ID and OOD)
against training wall-clock and against real executions, the time to reach the
`real` mode's final held-out reward, the final reward with its spread over
seeds and a bootstrap 95% interval (of the mean over seeds; of the median for
the time to reach), the share of step time spent in real execution and the ideal speed-up
that share implies, and whether the targets of DESIGN section 6 hold.

`lrs=a,b,c` runs the fair protocol (`bench/tuning.py`): every mode first
trains at every learning rate of that one grid on `tune_seeds` tuning seeds
and is evaluated on the `validation` split only; each mode's final runs then
use the rate it scored best with. The JSON and the table say which rate each
mode got and whether it sits at the grid's edge, whether `real` had
plateaued (its gain over the last quarter of training, with a 95% interval),
and how many evaluation episodes each final reward rests on.

`modes=real,wmrl,trl` (config=autoresearch only) adds TRL's `GRPOTrainer` trained
on the `real` mode's config (`bench/trl_grpo.py`) and evaluated by the same
evaluator at the checkpoints TRL writes.

`config=vla` post-trains a VLA policy on robosuite lift: the benchmark first
builds the one BC start every mode shares (4 scripted demos -> LeRobotDataset ->
BC, under the runs folder, reused when it exists), then runs `vla-rl` from it;
`fused` (the seed method's progress fusion, every group in the simulator)
runs beside `real`, `wm` and the `wmrl` ladder, and "real executions" are
simulator episodes.

Options (`wmrl bench speedup --help`): `config=NAME` (synthetic-program |
synthetic-control | autoresearch | vla), `profile=quick|full` (default full),
`seeds=N`, `modes=a,b,...`, `lrs=a,b,c`, `tune_seeds=N`, `out=PATH`, `resume=true` (keep the finished runs
of an earlier invocation with the same config, e.g. one cut short, and run
only the rest), and any run-config key (e.g. `trainer.steps=40`), applied to
every mode after the profile's own. `quick` is a smoke run of the whole pipeline (about 5 minutes
on 2 cores once the embedded agent is cached); `full` is the measurement.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wmrl.bench.harness import (ProfileOptions, bootstrap_interval, final_interval, fmt, held_out_change, plateau,
                                provenance, run_one, summarize, write_result)
from wmrl.bench.trl_grpo import run_trl, trl_settings
from wmrl.bench.tuning import parse_grid, tune
from wmrl.config import ConfigError, load_config
from wmrl.registry import register_benchmark

#: mode name -> overrides; the ablation ladder of DESIGN section 2
MODES = {
    "real": ["estimator.mode=real"],
    # the seed method's VLA track: every group in the simulator, success fused with a progress model's score
    "fused": ["estimator.mode=fused"],
    "wm": ["estimator.mode=wm"],
    "wmrl-none": ["estimator.mode=wmrl", "estimator.debias.enabled=false", "estimator.denoise.enabled=false"],
    "wmrl-denoise": ["estimator.mode=wmrl", "estimator.debias.enabled=false"],
    "wmrl-debias": ["estimator.mode=wmrl", "estimator.denoise.enabled=false"],
    "wmrl": ["estimator.mode=wmrl"],
    # DESIGN's default anchor budget (the configs use 0.25): how far fewer anchors move the speed-up
    "wmrl-rho0.1": ["estimator.mode=wmrl", "anchors.fraction=0.1"],
    # rho moved by the world model's out-of-sample error (floor 0.1, ceiling 0.5; docs/method.md)
    "wmrl-adaptive": ["estimator.mode=wmrl", "anchors.adaptive.enabled=true"],
    # anchors executed while the loop goes on, used one step late (`core/async_anchors.py`): single-turn domains
    "wmrl-async": ["estimator.mode=wmrl", "anchors.max_staleness=1"],
    "wmrl-async-calibrate": ["estimator.mode=wmrl", "anchors.max_staleness=1", "anchors.stale_use=calibrate"],
    # KL to the step-0 policy (issue 16: does it keep what RL would trade away on tasks never trained on?)
    "wmrl-kl": ["estimator.mode=wmrl", "trainer.objective.beta=0.1"],
    # the agent's SFT data in every update, aggregated like the policy term (issue 16): two weights
    "wmrl-ptx": ["estimator.mode=wmrl", "trainer.objective.ptx=1.0"],
    "wmrl-ptx0.25": ["estimator.mode=wmrl", "trainer.objective.ptx=0.25"],
    # TRL's GRPOTrainer on the real mode's config (`bench/trl_grpo.py`): AutoResearch only
    "trl": ["estimator.mode=real"],
}
#: modes trained by another library's trainer, not ours: mode -> its runner (same arguments as `run_one`)
EXTERNAL = {"trl": run_trl}
#: what each mode's `vs_trl` holds: the reference-relative numbers of `summarize` with TRL as the reference
VERSUS = ("reached_reference_final", "time_to_reference_final_median", "speedup_to_reference_final",
          "real_executions_to_reference_final_median", "fewer_real_executions_to_reference_final", "ideal_speedup")
#: every mode a domain with a generic world model runs (fused is the VLA baseline's; trl, wmrl-kl and wmrl-ptx* are
#: opt-in)
GENERIC = tuple(m for m in MODES if m not in ("fused", "trl", "wmrl-kl") and not m.startswith("wmrl-ptx"))
#: asynchronous anchors need single-turn episodes
ASYNC = ("wmrl-async", "wmrl-async-calibrate")
MULTI_TURN = tuple(m for m in GENERIC if m not in ASYNC)
#: the paper's ablation order, worst to best
ABLATION_ORDER = ("wmrl-none", "wmrl-denoise", "wmrl-debias", "wmrl")
LADDER = ("real", "wm", *ABLATION_ORDER)

_AR_QUICK = ["trainer.steps=4", "trainer.groups_per_step=4", "trainer.eval_samples=1", "trainer.eval_every=0",
             "trainer.eval_splits=[test_id]"]
_VLA = ["domain.families=[lift]", "domain.n_train=8", "domain.n_test_id=8", "domain.n_test_ood=8",
        "domain.env.horizon_steps.lift=64", "trainer.groups_per_step=4", "trainer.group_size=4",
        "trainer.eval_samples=4", "engine.lr=1e-4"]
#: config -> profile -> (seeds, modes, overrides)
PROFILES: dict[str, dict[str, tuple[int, tuple[str, ...], list[str]]]] = {
    "synthetic-program": {
        "quick": (3, LADDER, ["trainer.steps=30", "trainer.eval_every=10"]),
        "full": (5, GENERIC, ["trainer.steps=80", "trainer.eval_every=10"]),
    },
    "synthetic-control": {
        "quick": (3, LADDER, ["trainer.steps=20", "trainer.eval_every=10"]),
        "full": (5, MULTI_TURN, ["trainer.steps=60", "trainer.eval_every=10"]),
    },
    "vla": {
        "quick": (1, ("real", "fused", "wm", "wmrl"), [*_VLA, "trainer.steps=6", "trainer.eval_every=3"]),
        # 4 episodes x 8 tasks per evaluation and split (a standard error of ~0.09 at 0.5)
        "full": (3, ("real", "fused", "wm", *ABLATION_ORDER), [*_VLA, "trainer.steps=30", "trainer.eval_every=10"]),
    },
    "autoresearch": {
        "quick": (1, ("real", "wm", "wmrl"), _AR_QUICK),
        # evaluations every 5 steps: the time to reach real's final is read off them
        # the async modes have a file of their own (speedup-autoresearch-async.json, Makefile)
        "full": (5, MULTI_TURN, ["trainer.steps=20", "trainer.eval_every=5"]),
    },
}


@dataclass
class SpeedupOptions(ProfileOptions):
    modes: str | None = field(default=None, metadata={"help": "comma-separated modes (default: the profile's)"})
    resume: bool = field(default=False, metadata={"help": "keep finished runs of an earlier invocation"})
    lrs: str | None = field(default=None, metadata={
        "help": "learning-rate grid, e.g. 0.01,0.03,0.1: each mode's rate is chosen on the validation split first"})
    tune_seeds: int = field(default=3, metadata={"help": "seeds per mode and rate while tuning (with lrs)"})

    def validate(self) -> None:
        super().validate()
        if self.lrs is not None:
            parse_grid(self.lrs)
        if self.tune_seeds < 1:
            raise ValueError(f"tune_seeds={self.tune_seeds}: must be >= 1")
        unknown = [m for m in (self.modes or "").split(",") if m and m not in MODES]
        if unknown:
            raise ValueError(f"modes: unknown {', '.join(unknown)}; available: {', '.join(MODES)}")
        if "trl" in (self.modes or "").split(",") and self.config != "autoresearch":
            raise ValueError("modes: trl (TRL's GRPOTrainer) is a baseline for config=autoresearch only")


@register_benchmark("speedup", options=SpeedupOptions, run_config=True)
def run(opts: SpeedupOptions, user: list[str]) -> Path:
    config, profile = opts.config, opts.profile
    seeds, modes, base = PROFILES.get(config, {}).get(profile, (3, LADDER, []))
    seeds = opts.seeds or seeds
    modes = tuple(opts.modes.split(",")) if opts.modes else modes
    out, work = opts.output_paths("speedup")
    run_config, start = (("vla-rl", vla_start(work / "bc-start")) if config == "vla" else (config, []))
    rest = [*start, *base, *user]
    tuning, rate = None, {mode: [] for mode in modes}
    if opts.lrs:
        if any(str(o).startswith("engine.lr=") for o in user):
            raise ConfigError("engine.lr and lrs=... together: lrs chooses each mode's rate; drop engine.lr")
        tuning = tune(lambda m: EXTERNAL.get(m, run_one), run_config, rest, {m: MODES[m] for m in modes},
                      parse_grid(opts.lrs), opts.tune_seeds, work / "tune", opts.resume)
        for mode, t in tuning["modes"].items():
            if t["chosen_lr"] is None:
                raise RuntimeError(f"tuning: no {mode} run left a validation score; see {work / 'tune' / mode}")
            rate[mode] = [f"engine.lr={t['chosen_lr']:g}"]
    runs = []
    for seed in range(seeds):
        for mode in modes:  # interleaved: drift hits every mode alike
            run_dir = work / mode / f"seed{seed}"
            runner = EXTERNAL.get(mode, run_one)
            runs.append(runner(run_config, [*rest, *MODES[mode], *rate[mode]], run_dir, mode, seed,
                               reuse=opts.resume))
    result = {"benchmark": "speedup", "config": config, "profile": profile, "overrides": rest, **summarize(runs)}
    if tuning is not None:
        result["tuning"] = tuning
    if result["reference"] in result["modes"]:
        result["reference_plateau"] = plateau(result["modes"][result["reference"]]["per_seed"])
    result["evaluation_episodes"] = evaluation_episodes(load_config(run_config, rest))
    result["provenance"] = json.loads(provenance(load_config(run_config, rest)))  # the unpinned inputs of every run
    if "trl" in modes:
        against(result, runs, "trl")
        result["trl"] = trl_settings(load_config(run_config, [*rest, *MODES["trl"]]))  # what TRL ran with
    result["targets"] = targets(result)
    return write_result(out, result, table, plot)


def against(result: dict, runs: list, reference: str) -> None:
    """Each mode's numbers relative to another baseline's final (e.g. TRL's) as `vs_<reference>`, beside the
    ones relative to `real` that `summarize` gives."""
    for mode, m in summarize(runs, reference=reference)["modes"].items():
        result["modes"][mode][f"vs_{reference}"] = {k: m.get(k) for k in VERSUS}


def evaluation_episodes(cfg) -> dict[str, int]:
    """Per held-out split, the episodes one evaluation runs (tasks x `trainer.eval_samples`): what a final
    reward's interval rests on besides the seeds."""
    from wmrl.core.registry import DOMAINS

    domain = DOMAINS.get(cfg.domain.name)(cfg.domain)
    return {split: len(domain.tasks(split)) * cfg.trainer.eval_samples for split in cfg.trainer.eval_splits}


def vla_start(root: Path) -> list[str]:
    """The BC policy every VLA mode starts from, built once under `root` (4 scripted lift demos, 300 BC
    updates: it lifts the cube on about half of its training scenes, so GRPO groups see both outcomes and
    RL has room to improve); its overrides."""
    from wmrl.config import resolve_config_path
    from wmrl.registry import vla_pipeline

    pipeline = vla_pipeline()
    cfg = pipeline.load_pipeline_config(resolve_config_path("vla"), [
        f"run_dir={root}", "tasks.families=[lift]", "collect.families=[lift]", "collect.episodes_per_family=4",
        "bc.steps=300", "bc.val_episodes=0", "bc.eval_every=300", "bc.checkpoint_every=300"])
    pipeline.collect(cfg, progress=False)
    pipeline.bc(cfg, progress=False)
    return [f"domain.policy={root / 'bc' / 'policy'}"]


#: how much sooner than the tuned `real` the best `wmrl` variant should reach real's final reward (issue 17)
SOONER_TARGET = {"autoresearch": 4.0, "synthetic-program": 3.0, "synthetic-control": 3.0}


def _mean_final(m: dict, split: str = "test_id") -> float | None:
    xs = [r["final"].get(f"eval_{split}") for r in m["per_seed"]]
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def targets(result: dict) -> dict:
    """The issue's targets, each True / False, or None when the modes it needs were not run."""
    m = result["modes"]
    out: dict = {}
    goal = SOONER_TARGET.get(result.get("config"))
    if "real" in m and goal is not None:
        # the fastest wmrl variant that reached real's final, among those whose mean final is not below real's
        # interval of the mean
        iv = m["real"].get("final_test_id_interval") or final_interval(m["real"]["per_seed"], "test_id")
        floor = iv[0] if iv and iv[0] is not None else _mean_final(m["real"])
        fair = {k: v["speedup_to_reference_final"] for k, v in m.items()
                if k.startswith("wmrl") and v.get("speedup_to_reference_final") and floor is not None
                and (_mean_final(v) or -math.inf) >= floor}
        best = max(fair, key=fair.get) if fair else None
        out["best_wmrl_variant"] = best
        out["best_wmrl_sooner"] = fair.get(best)
        out[f"best_wmrl_{goal:g}x_sooner_not_below_real"] = bool(best and fair[best] >= goal)
    if "reference_plateau" in result:
        out["real_plateaued"] = result["reference_plateau"]["plateaued"]
    if "real" in m and "wmrl" in m:
        r, w = m["real"], m["wmrl"]
        sooner = w.get("speedup_to_reference_final")
        out["wmrl_reaches_real_final_4x_sooner"] = sooner is not None and sooner >= 4.0
        out["wmrl_final_within_one_spread_of_real"] = (
            w["final_test_id_median"] >= r["final_test_id_median"] - (r["final_test_id_spread"] or 0.0))
        # every variant that meets the speed-up target (the ablations, another anchor budget)
        out["modes_4x_sooner"] = [k for k, v in m.items() if (v.get("speedup_to_reference_final") or 0.0) >= 4.0]
    if "trl" in m and "wmrl" in m:
        w, b = m["wmrl"], m["trl"]
        sooner = w["vs_trl"]["speedup_to_reference_final"]
        out["wmrl_reaches_trl_final_4x_sooner"] = sooner is not None and sooner >= 4.0
        out["wmrl_final_within_one_spread_of_trl"] = (
            w["final_test_id_median"] >= b["final_test_id_median"] - (b["final_test_id_spread"] or 0.0))
    if result.get("config") == "vla" and "real" in m and "wmrl" in m:
        # the VLA issue's targets: real's final with 3x fewer simulator episodes and 2x less wall-clock
        w = m["wmrl"]
        out["wmrl_3x_fewer_sim_episodes_to_real_final"] = (w.get("fewer_real_executions_to_reference_final") or 0) >= 3.0
        out["wmrl_2x_less_wall_to_real_final"] = (w.get("speedup_to_reference_final") or 0) >= 2.0
    if "real" in m and "wm" in m:
        out["wm_ends_below_real"] = (
            m["wm"]["final_test_id_median"] < m["real"]["final_test_id_median"] - (m["real"]["final_test_id_spread"] or 0.0))
    if all(k in m for k in ABLATION_ORDER):
        finals = [m[k]["final_test_id_median"] for k in ABLATION_ORDER]
        out["ablation_order_matches_paper"] = all(a < b for a, b in zip(finals, finals[1:]))
        out["ablation_order_measured"] = [k for _, k in sorted(zip(finals, ABLATION_ORDER))]
    return out


def _interval(iv: list | None, spec: str = "{:.3f}") -> str:
    """` [lo, hi]`; an upper bound of None is a time some resamples never reach (∞)."""
    if not iv:
        return ""
    return f" [{fmt(iv[0], spec)}, {'∞' if iv[1] is None else fmt(iv[1], spec)}]"


def held_out_lines(modes: dict) -> list[str]:
    """Held-out splits before → after training, with the share that ran ok and the domain's own numbers
    (medians over seeds; the worst seed's change beside them), where the runs recorded them."""
    held = {mode: m.get("held_out") or held_out_change([r["history"] for r in m["per_seed"]])
            for mode, m in modes.items()}  # JSON written before the summary had it: from the histories
    cols = [c for c in ("test_id", "test_id_ok", "test_id_parsed", "test_ood", "test_ood_ok", "test_ood_parsed")
            if any(c in h for h in held.values())]
    if not any(c.endswith(("_ok", "_parsed")) for c in cols):
        return []
    lines = ["", "Held-out before → after training (median over seeds; the worst seed's change; the 95% interval "
             "of the mean change over seeds):", "",
             "| mode | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for mode, m in modes.items():
        cells = []
        for c in cols:
            h = held[mode].get(c)
            changes = [x for x in (h or {}).get("change_per_seed", []) if x is not None]
            iv = bootstrap_interval(changes)
            cells.append("—" if h is None else f"{fmt(h['before'])} → {fmt(h['after'])} "
                         f"({fmt(min(changes) if changes else None, '{:+.3f}')}"
                         + ("" if iv is None else f"; [{fmt(iv[0], '{:+.3f}')}, {fmt(iv[1], '{:+.3f}')}]") + ")")
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return lines


def table(result: dict) -> str:
    """The Markdown results table (medians over seeds; spread = max - min)."""
    modes = result["modes"]
    # only where the true reward is free (synthetic): cosine of the update's signal with the true advantages
    cosine = any(math.isfinite(m.get("signal_cosine_median", float("nan"))) for m in modes.values())
    lines = [
        f"`wmrl bench speedup config={result['config']} profile={result['profile']}`: seeds {result['seeds']}, "
        f"overrides {result['overrides'] or 'none'}",
        "",
        "| mode | held-out ID: start → final (spread) [95% CI of the mean] | held-out OOD [95% CI] | train wall (s) | real execs "
        "| real share of step time | ideal speed-up | reached real's final | time to it (s) [95% CI of the median] | sooner than real "
        "| real execs to it | fewer than real "
        "|" + (" signal vs true (cos) |" if cosine else ""),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if cosine else ""),
    ]
    for mode, m in modes.items():
        lines.append(
            f"| {mode} | {fmt(m['initial_test_id_median'])} → {fmt(m['final_test_id_median'])} ({fmt(m['final_test_id_spread'])})"
            f"{_interval(m.get('final_test_id_interval', final_interval(m['per_seed'], 'test_id')))} "
            f"| {fmt(m['final_test_ood_median'])}{_interval(m.get('final_test_ood_interval', final_interval(m['per_seed'], 'test_ood')))} "
            f"| {fmt(m['wall_median'], '{:.1f}')} "
            f"| {fmt(m['real_executions_median'], '{:.0f}')} | {fmt(m['real_wall_share_median'], '{:.0%}')} "
            f"| {fmt(m.get('ideal_speedup'), '{:.2f}x')} | {m['reached_reference_final']}/{len(m['per_seed'])} "
            f"| {fmt(m['time_to_reference_final_median'], '{:.1f}')}{_interval(m.get('time_to_reference_final_interval'), '{:.0f}')} "
            f"| {fmt(m.get('speedup_to_reference_final'), '{:.2f}x')} "
            f"| {fmt(m.get('real_executions_to_reference_final_median'), '{:.0f}')} "
            f"| {fmt(m.get('fewer_real_executions_to_reference_final'), '{:.2f}x')} |"
            + (f" {fmt(m.get('signal_cosine_median'))} |" if cosine else "")
        )
    lines += held_out_lines(modes)
    if "trl" in result:
        trl = result["trl"]
        lines += ["", f"TRL {trl['version']} `GRPOTrainer`: " + ", ".join(f"{k}={v}" for k, v in trl["settings"].items())]
        lines += [f"Against TRL's final: {mode} reached it on {v['reached_reference_final']}/{len(modes[mode]['per_seed'])} "
                  f"seeds, {fmt(v['speedup_to_reference_final'], '{:.2f}x')} sooner, "
                  f"{fmt(v['fewer_real_executions_to_reference_final'], '{:.2f}x')} fewer real executions"
                  for mode, v in ((k, m["vs_trl"]) for k, m in modes.items() if k != "trl")]
    lines += protocol_lines(result)
    t = result.get("targets") or {}
    if t:
        lines += ["", "Targets: " + "; ".join(f"{k}: {v}" for k, v in t.items())]
    return "\n".join(lines) + "\n"


def protocol_lines(result: dict) -> list[str]:
    """The tuning grid's validation scores and choices, real's plateau and the evaluation episodes, where the
    run recorded them."""
    lines = []
    tuning = result.get("tuning")
    if tuning:
        grid = [f"{lr:g}" for lr in tuning["grid"]]
        lines += ["", f"Learning rate chosen per mode on `{tuning['split']}` (mean final reward over tuning seeds "
                  f"{tuning['seeds']}; the final runs use seeds {result['seeds']}):", "",
                  "| mode | " + " | ".join(f"lr {g}" for g in grid) + " | chosen | tuning wall (s) |",
                  "|---|" + "---:|" * (len(grid) + 2)]
        for mode, t in tuning["modes"].items():
            edge = " (grid edge)" if t["chosen_at_grid_edge"] else ""
            lines.append(f"| {mode} | " + " | ".join(fmt(t["validation_final_mean"].get(g)) for g in grid)
                         + f" | {fmt(t['chosen_lr'], '{:g}')}{edge} | {fmt(t['tuning_wall'], '{:.0f}')} |")
    p = result.get("reference_plateau")
    if p:
        gains = ", ".join(fmt(g, "{:+.3f}") for g in p["gain_per_seed"])
        lines += ["", f"{result['reference']}'s {p['split']} gain over the last {p['tail']:.0%} of training, per seed: "
                  f"{gains}{_interval(p['gain_interval'], '{:+.3f}')}; plateaued: {p['plateaued']}"]
    ep = result.get("evaluation_episodes")
    if ep:
        lines += ["", "Episodes per evaluation: " + ", ".join(f"{k} {v}" for k, v in ep.items())
                  + f"; each final reward is a mean over {len(result['seeds'])} seeds of one evaluation each"]
    return lines


def evaluation_bands(per_seed: list[dict], split: str, x: str) -> tuple[list[float], ...]:
    """Per evaluation (the seeds evaluate at the same steps): the median over seeds of `x` and of the held-out
    reward, and the reward's lowest and highest seed."""
    curves = [[h for h in run["history"] if h.get(f"eval_{split}") is not None] for run in per_seed]
    n = min((len(c) for c in curves), default=0)
    rows = [[c[i] for c in curves] for i in range(n)]
    rewards = [[h[f"eval_{split}"] for h in r] for r in rows]
    return ([float(np.median([h.get(x, 0.0) for h in r])) for r in rows], [float(np.median(v)) for v in rewards],
            [min(v) for v in rewards], [max(v) for v in rewards])


def plot(result: dict, path: Path) -> None:
    """Held-out reward (ID top, OOD bottom) against training wall-clock and real executions: per mode the median
    over seeds, the band from the lowest seed to the highest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey="row")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for c, (mode, m) in zip(colors * 2, result["modes"].items()):
        for row, split in zip(axes, ("test_id", "test_ood")):
            for ax, x in zip(row, ("wall", "real_executions")):
                xs, mid, lo, hi = evaluation_bands(m["per_seed"], split, x)
                if not xs:
                    continue
                ax.plot(xs, mid, color=c, marker="o", ms=3, label=mode)
                ax.fill_between(xs, lo, hi, color=c, alpha=0.15, linewidth=0)
    for row, split in zip(axes, ("ID", "OOD")):
        row[0].set_ylabel(f"real held-out {split} reward")
        for ax, x in zip(row, ("training wall-clock (s)", "real training executions")):
            ax.set_xlabel(x)
            ax.grid(alpha=0.3)
    axes[0][1].legend(fontsize=8)
    fig.suptitle(f"wmrl bench speedup: {result['config']} ({result['profile']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
