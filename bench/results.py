"""`wmrl bench results`: the README's Results section, rendered from the benchmarks' JSON.

The figures in the README are never typed by hand: `make results` runs each
benchmark behind the table with its JSON going to `bench/results/` (kept in the
repository, so a reader can check every number), and this module renders those
files with each benchmark's own `table()` between the README's markers. Missing
files are listed as not yet measured rather than silently left out.

Options (`wmrl bench results --help`): `dir=PATH` (bench/results),
`readme=PATH` (README.md).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from wmrl.bench.harness import fmt
from wmrl.registry import register_benchmark

START, END = "<!-- results:start -->", "<!-- results:end -->"

#: (JSON file in the results folder, benchmark module that renders it, heading)
SECTIONS = (
    ("speedup-synthetic-program-full.json", "speedup",
     "WMRL vs standard RL: synthetic program domain (fair protocol: each mode's rate tuned on validation, 5 seeds)"),
    ("speedup-synthetic-control-full.json", "speedup",
     "WMRL vs standard RL: synthetic control domain, multi-step (fair protocol, 5 seeds)"),
    ("speedup-autoresearch-heldout.json", "speedup",
     "AutoResearch held-out before and after RL: suite v2 (the competition layout), v8 agent, 3 seeds; wmrl "
     "without and with the agent's SFT data in every update (trainer.objective.ptx=0.25 and 1)"),
    ("speedup-autoresearch-full.json", "speedup",
     "WMRL vs standard RL: AutoResearch (embedded agent, suite v1), the whole ladder"),
    ("speedup-autoresearch-trl-full.json", "speedup",
     "WMRL vs TRL's GRPOTrainer on the same AutoResearch tasks, reward and evaluator (suite v1; how they differ: "
     "docs/method.md)"),
    ("speedup-autoresearch-async.json", "speedup",
     "Asynchronous anchors on AutoResearch, suite v1, v5 agent (real and sync wmrl reused from another day: their walls are "
     "not comparable, docs/method.md)"),
    ("speedup-autoresearch-async-kl.json", "speedup",
     "AutoResearch, suite v1, v6 agent: sync, async and a KL to the step-0 policy in one invocation (2 seeds)"),
    ("speedup-vla-full.json", "speedup",
     "WMRL vs simulator GRPO and the seed's progress fusion: VLA on robosuite lift (real executions = simulator episodes)"),
    ("estimators-synthetic-program-full.json", "estimators",
     "The ablation ladder on the same groups: synthetic program, GRPO advantages"),
    ("estimators-synthetic-program-centred-full.json", "estimators",
     "The ablation ladder on the same groups: synthetic program, centring-only advantages"),
    ("estimators-synthetic-control-full.json", "estimators",
     "The ablation ladder on the same groups: synthetic control, GRPO advantages"),
    ("estimators-synthetic-control-centred-full.json", "estimators",
     "The ablation ladder on the same groups: synthetic control, centring-only advantages"),
    ("speedup-synthetic-program-centred-full.json", "speedup",
     "WMRL vs standard RL: synthetic program, centring-only advantages"),
    ("speedup-synthetic-control-centred-full.json", "speedup",
     "WMRL vs standard RL: synthetic control, centring-only advantages"),
    ("wm-autoresearch-full.json", "wm", "World-model fidelity: AutoResearch, learned predictors"),
    ("wm-autoresearch-llm-full.json", "wm", "World-model fidelity: AutoResearch, LLM outcome predictor (one seed)"),
    ("wm-synthetic-control-full.json", "wm", "World-model fidelity: synthetic control"),
    ("sandbox.json", "sandbox", "Sandbox: per-execution overhead, local vs Ray pools, cost of durable commits"),
    ("hostile.json", "hostile", "Sandbox: hostile programs against the trusted side"),
    ("rollout-full.json", "rollout", "Generation throughput (CPU)"),
    # measured on a lent GPU machine (`wmrl bench scaling shapes=qwen2-0.5b,qwen2-1.5b ...`, docs/scaling.md)
    ("scaling-cpu.json", "scaling", "Rollout engines: HF/torch against vLLM (CPU, the embedded agent's shape)"),
    ("scaling-h200.json", "scaling", "Rollout and update on one GPU (H200), HF/torch backend"),
)

#: the headline table's rows: (domain, speedup JSON, the baseline `wmrl` is measured against)
HEADLINE = (
    ("synthetic-program", "speedup-synthetic-program-full.json", "real"),
    ("synthetic-control", "speedup-synthetic-control-full.json", "real"),
    ("autoresearch", "speedup-autoresearch-full.json", "real"),
    ("autoresearch, against TRL's GRPOTrainer", "speedup-autoresearch-trl-full.json", "trl"),
    ("vla (lift)", "speedup-vla-full.json", "real"),
)

PAPER = ("The paper's headline, for comparison: about 3.1–3.4x fewer GPU-hours than GRPO on real "
         "execution at higher held-out scores, and the ablation order none < denoise-only < debias-only < both.")


def _yes(v) -> str:
    return "—" if v is None else ("yes" if v else "no")


def _best(t: dict) -> str:
    """The fastest wmrl variant whose final is not below real's interval, and how much sooner (protocol runs)."""
    if not t.get("best_wmrl_variant"):
        return "—"
    return f"{t['best_wmrl_variant']} {fmt(t.get('best_wmrl_sooner'), '{:.2f}x')}"


def headline(results_dir: Path) -> str:
    """One row per domain: `wmrl` against its baseline (our `real` mode, or TRL's GRPOTrainer) and `wm`, and the
    issue's targets, from the speedup JSON."""
    lines = [
        "| domain | seeds | baseline final (spread) | wmrl final (spread) | wm final | train wall, baseline / wmrl "
        "| wmrl sooner to baseline's final | ideal speed-up | 4x sooner | within one spread | wm below real "
        "| ablation order as paper | rates tuned on validation | best wmrl variant, sooner |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|---|",
    ]
    for domain, name, base in HEADLINE:
        path = results_dir / name
        if not path.exists():
            continue
        res = json.loads(path.read_text())
        m, t = res["modes"], res.get("targets", {})
        b, w, p = m.get(base), m.get("wmrl"), m.get("wm")
        if b is None or w is None:
            continue
        vs = w if base == "real" else w.get(f"vs_{base}", {})  # `summarize` measures against real by default
        lines.append(
            f"| {domain} | {len(res['seeds'])} | {fmt(b['final_test_id_median'])} ({fmt(b['final_test_id_spread'])}) "
            f"| {fmt(w['final_test_id_median'])} ({fmt(w['final_test_id_spread'])}) | {fmt(p and p['final_test_id_median'])} "
            f"| {b['wall_median'] / w['wall_median']:.2f}x | {fmt(vs.get('speedup_to_reference_final'), '{:.2f}x')} "
            f"| {fmt(vs.get('ideal_speedup'), '{:.2f}x')} | {_yes(t.get(f'wmrl_reaches_{base}_final_4x_sooner'))} "
            f"| {_yes(t.get(f'wmrl_final_within_one_spread_of_{base}'))} | {_yes(t.get('wm_ends_below_real'))} "
            f"| {_yes(t.get('ablation_order_matches_paper'))} | {_yes('tuning' in res)} "
            f"| {_best(t)} |"
        )
    return "\n".join(lines) + "\n"


def render(results_dir: Path) -> str:
    parts = [PAPER, "", "Held-out ID reward (real execution), medians over seeds; the tables below have the rest.", "",
             headline(results_dir).rstrip(), ""]
    missing = []
    for name, module, heading in SECTIONS:
        path = results_dir / name
        if not path.exists():
            missing.append(f"`{name}`")
            continue
        table = importlib.import_module(f"wmrl.bench.{module}").table(json.loads(path.read_text()))
        parts += [f"### {heading}", "", table.rstrip(), ""]
    if missing:
        parts += [f"Not measured yet: {', '.join(missing)}.", ""]
    return "\n".join(parts)


@dataclass
class ResultsOptions:
    dir: str = field(default="bench/results", metadata={"help": "the folder of the benchmarks' JSON"})
    readme: str = field(default="README.md", metadata={"help": "the file whose markers the section goes between"})


@register_benchmark("results", options=ResultsOptions)
def run(opts: ResultsOptions, _: list[str]) -> Path:
    results_dir, readme = Path(opts.dir), Path(opts.readme)
    text = readme.read_text()
    if START not in text or END not in text:
        raise KeyError(f"{readme} has no {START} ... {END} markers to write the results between")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{render(results_dir)}{END}{tail}")
    return readme
