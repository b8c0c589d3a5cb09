"""`wmrl bench vla`: what the embodied domain's real environment and BC cost on this machine.

In robot RL the simulator is the expensive part, so its cost is measured the way
the trainer pays it:

* per process (one `Simulator`, in this process): low-level 20 Hz steps/s with
  no camera frame, and with a 64x64 frame rendered after every step;
* through `VLAEnv` (action chunks of `chunk` steps, one frame per chunk, each
  simulator in its own worker process) with 1 and 2 workers: episodes/s and
  low-level env steps/s over a batch of `episodes` episodes of random chunks;
* one BC update (batch `bc_batch`, through the DeepSpeed engine) on a dataset
  of random frames written with lerobot's API.

Each figure is the median over `repeats` rounds (spread = max - min), the
conditions of one round interleaved so drift hits all alike. Options
(`wmrl bench vla --help`): families, episodes, repeats, steps, bc_batch, out.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from wmrl.bench.harness import write_result
from wmrl.core.validation import at_least
from wmrl.registry import register_benchmark


@dataclass
class VLABenchOptions:
    families: list[str] = field(default_factory=lambda: ["lift", "stack", "pick_place_can"])
    #: low-level steps per per-process measurement
    steps: int = 200
    #: episodes per VLAEnv batch (random chunks until the horizon)
    episodes: int = 4
    repeats: int = 3
    bc_batch: int = 32
    bc_updates: int = 20
    out: str = "bench/out/vla.json"

    def validate(self) -> None:
        at_least(self, "bench vla", 1, "steps", "episodes", "repeats", "bc_batch", "bc_updates")


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "spread": max(values) - min(values), "rounds": values}


def _per_process(family: str, steps: int, rng: np.random.Generator) -> dict[str, float]:
    from wmrl.domains.vla.sim import Simulator
    from wmrl.domains.vla.tasks import make_tasks

    sim = Simulator(family)
    try:
        spec = make_tasks("train", 1, families=[family])[0].payload
        out = {}
        for label, render in (("no_render", False), ("render_every_step", True)):
            sim.reset(spec)
            t0, n = time.perf_counter(), 0
            while n < steps:
                if sim.done:
                    sim.reset(spec)
                sim.step(rng.uniform(-1, 1, 7).astype(np.float32))
                if render:
                    sim.image()
                n += 1
            out[f"{label}_steps_per_s"] = steps / (time.perf_counter() - t0)
        return out
    finally:
        sim.close()


def _env_batch(families: list[str], workers: int, episodes: int, rng: np.random.Generator) -> dict[str, float]:
    from wmrl.domains.vla.env import VLAEnv, VLAEnvConfig
    from wmrl.domains.vla.tasks import make_tasks

    cfg = VLAEnvConfig(workers=workers)
    tasks = make_tasks("train", episodes, families=families)[:: len(families)]  # every family, `episodes` in all
    with VLAEnv(cfg) as env:
        env.reset(tasks)  # simulators are built once per worker: not part of the steady state
        t0 = time.perf_counter()
        env.reset(tasks)
        alive, steps = set(range(len(tasks))), 0
        while alive:
            acts = [rng.uniform(-1, 1, (cfg.chunk, 7)).astype(np.float32) if i in alive else None
                    for i in range(len(tasks))]
            for i, tr in enumerate(env.step(acts)):
                if tr is not None:
                    steps += cfg.chunk
                    if tr.done:
                        alive.discard(i)
        wall = time.perf_counter() - t0
    return {"episodes_per_s": len(tasks) / wall, "env_steps_per_s": steps / wall}


def _bc_step(batch: int, updates: int, work: Path) -> float:
    from wmrl.core.engine import Engine, EngineConfig
    from wmrl.domains.vla.dataset import chunk_samples, create_dataset, load_dataset, record_episode, take
    from wmrl.domains.vla.policy.adapter import VLAPolicy
    from wmrl.domains.vla.policy.configuration_wmrl_vla import WmrlVLAConfig

    rng = np.random.default_rng(0)
    root = work / "bc-data"
    ds = create_dataset(root, "local/bench-bc")
    for _ in range(4):
        record_episode(ds, [{"image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
                             "state": rng.normal(size=9).astype(np.float32),
                             "action": rng.uniform(-1, 1, 7).astype(np.float32),
                             "instruction": "lift the cube"} for _ in range(40)])
    ds.finalize()
    cfg = WmrlVLAConfig.from_dataset(ds.meta, device="cpu")
    samples = chunk_samples(load_dataset(root, cfg))
    policy = VLAPolicy.build(cfg, seed=0).policy
    engine = Engine(policy, EngineConfig())
    gen = torch.Generator().manual_seed(0)
    n = len(samples["task"])
    times = []
    for _ in range(updates + 2):  # two warm-up updates
        b = take(samples, torch.randint(0, n, (batch,), generator=gen))
        t0 = time.perf_counter()
        engine.step(policy(b)[0])
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


@register_benchmark("vla", options=VLABenchOptions)
def run(opts: VLABenchOptions, _: list[str]) -> Path:
    rng = np.random.default_rng(0)
    per: dict[str, dict[str, list[float]]] = {f: {} for f in opts.families}
    env: dict[str, dict[str, list[float]]] = {"1": {}, "2": {}}
    bc: list[float] = []
    with tempfile.TemporaryDirectory(prefix="wmrl-bench-vla-") as tmp:
        for r in range(opts.repeats):
            for f in opts.families:
                for k, v in _per_process(f, opts.steps, rng).items():
                    per[f].setdefault(k, []).append(v)
            for w in ("1", "2"):
                for k, v in _env_batch(opts.families, int(w), opts.episodes, rng).items():
                    env[w].setdefault(k, []).append(v)
            bc.append(_bc_step(opts.bc_batch, opts.bc_updates, Path(tmp) / f"r{r}"))
    result = {
        "benchmark": "vla", "options": opts.__dict__, "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "per_process": {f: {k: _stats(v) for k, v in d.items()} for f, d in per.items()},
        "env": {w: {k: _stats(v) for k, v in d.items()} for w, d in env.items()},
        "bc_update_s": _stats(bc),
    }
    result["env_2_over_1"] = result["env"]["2"]["episodes_per_s"]["median"] / result["env"]["1"]["episodes_per_s"]["median"]
    return write_result(Path(opts.out), result, _table)


def _table(r: dict) -> str:
    lines = ["| family | steps/s, no camera | steps/s, a frame every step |", "|---|---:|---:|"]
    for f, d in r["per_process"].items():
        lines.append(f"| {f} | {d['no_render_steps_per_s']['median']:.0f} | {d['render_every_step_steps_per_s']['median']:.0f} |")
    lines += ["", "| VLAEnv workers | episodes/s | env steps/s |", "|---|---:|---:|"]
    for w, d in r["env"].items():
        lines.append(f"| {w} | {d['episodes_per_s']['median']:.2f} | {d['env_steps_per_s']['median']:.0f} |")
    lines += ["", f"BC update (batch {r['options']['bc_batch']}): {r['bc_update_s']['median'] * 1000:.1f} ms median; "
              f"2 workers / 1 worker: {r['env_2_over_1']:.2f}x episodes/s.", ""]
    return "\n".join(lines)
