"""`wmrl bench results`: the README's Results section, rendered from the benchmarks' JSON.

The figures in the README are never typed by hand: `make results` runs each
benchmark behind the table with its JSON going to `bench/results/` (kept in the
repository, so a reader can check every number), and this module renders those
files with each benchmark's own `table()` between the README's markers. Missing
files are listed as not yet measured rather than silently left out.

Overrides: `dir=PATH` (bench/results), `readme=PATH` (README.md).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

START, END = "<!-- results:start -->", "<!-- results:end -->"

#: (JSON file in the results folder, benchmark module that renders it, heading)
SECTIONS = (
    ("speedup-synthetic-program-full.json", "speedup", "WMRL vs standard RL: synthetic program domain"),
    ("speedup-synthetic-control-full.json", "speedup", "WMRL vs standard RL: synthetic control domain (multi-step)"),
    ("speedup-autoresearch-full.json", "speedup", "WMRL vs standard RL: AutoResearch (embedded agent)"),
    ("wm-autoresearch-full.json", "wm", "World-model fidelity: AutoResearch, learned predictors"),
    ("wm-autoresearch-llm-full.json", "wm", "World-model fidelity: AutoResearch, LLM outcome predictor (one seed)"),
    ("wm-synthetic-control-full.json", "wm", "World-model fidelity: synthetic control"),
    ("sandbox.json", "sandbox", "Sandbox: per-execution overhead and pool throughput"),
    ("rollout-full.json", "rollout", "Generation throughput (CPU)"),
)

PAPER = ("The paper's headline, for comparison: about 3.1–3.4x fewer GPU-hours than GRPO on real "
         "execution at higher held-out scores, and the ablation order none < denoise-only < debias-only < both.")


def render(results_dir: Path) -> str:
    parts = [PAPER, ""]
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


def run(overrides: list[str]) -> Path:
    opts = dict(o.split("=", 1) for o in overrides)
    results_dir, readme = Path(opts.get("dir", "bench/results")), Path(opts.get("readme", "README.md"))
    text = readme.read_text()
    if START not in text or END not in text:
        raise KeyError(f"{readme} has no {START} ... {END} markers to write the results between")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{render(results_dir)}{END}{tail}")
    return readme
