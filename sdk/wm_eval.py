"""`wmrl eval-wm`: how good a world model is against the real outcomes of a run, none of which it was fitted on.

A run's store holds every real execution it paid for. Replaying them in order
measures a world model the way training uses it: at each step the WM predicts
that step's real trajectories with only the earlier steps' to learn from
(prequential, so every prediction is out of sample and drift over the run is
visible), then learns from them, as the trainer's `fit` does. The held-out
evaluation episodes (tasks never trained on), one section per held-out split,
are then predicted by the WM fitted on the whole training stream; and, as a WM
deployed on new tasks would be used, each evaluation round after the first is
predicted again having also learned from the earlier rounds on those tasks
(sections `<split>_warm`). Any world model the run's domain offers
can be measured on the same stream (`--world-model`), so two are compared on
identical data. The model runs under the same `WorldModelRuntime` as in
training (failures become unknown grades, fits may run in the background).
Metrics are `wmrl.world_models.fidelity`'s (with the success AUC where real
outcomes are success/failure, as on the VLA domain); a model that imagines
observations (the embodied VLA world model) adds `open_loop_error`: per held-out
split and turn, its imagined observations against the real ones with the real
actions replayed. JSON and a plot per section go to RUN_DIR/wm_eval/.
"""

from __future__ import annotations

import json
from itertools import groupby
from pathlib import Path
from typing import Sequence

import yaml

from wmrl.config import ConfigError, load_config, load_run_config
from wmrl.core.registry import DOMAINS
from wmrl.core.replay import StoredTrajectory, read_trajectories
from wmrl.core.wm_runtime import WorldModelRuntime
from wmrl.world_models.fidelity import fidelity, write_report


def _predict(wm: WorldModelRuntime, batch: Sequence[StoredTrajectory]) -> list[dict]:
    wm.grade([s.trajectory for s in batch])  # a failing WM is measured as unknown grades, like in training
    return [
        {"group_id": s.group, "step": s.step, "real": s.trajectory.real.reward,
         "wm_mean": s.trajectory.wm.mean, "wm_var": s.trajectory.wm.var}
        for s in batch
    ]


def _columns(rows: list[dict]) -> dict:
    return {k: [r[k] for r in rows] for k in ("group_id", "step", "wm_mean", "wm_var", "real")}


def evaluate_world_model(run_dir: str | Path, world_model: str | None = None, *, warmup: int = 32) -> dict:
    """Fidelity of `world_model` (default: the run's own) on the run's real executions; see the module doc."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists() or not (run_dir / "store.sqlite").exists():
        raise ConfigError(f"{run_dir} is not a wmrl run folder with a store (config.yaml, store.sqlite)")
    cfg = load_run_config(run_dir)
    if world_model and (cfg.world_model is None or world_model != cfg.world_model.type):
        # another world model, with its own defaults: the run's keys were for its own
        raw = yaml.safe_load((run_dir / "config.yaml").read_text())
        raw["world_model"] = {"type": world_model}
        cfg = load_config(raw)
    if cfg.world_model is None:
        raise ConfigError(f"domain {cfg.domain.name!r} of {run_dir} has no world model to measure")
    domain = DOMAINS.get(cfg.domain.name)(cfg.domain)
    name = cfg.world_model.type
    wm = WorldModelRuntime(domain.make_world_model(cfg.world_model), cfg.world_model.runtime)
    stored = read_trajectories(run_dir / "store.sqlite", cfg.run_id, include_eval=True)
    train = [s for s in stored if s.split == "train"]
    if not train:
        raise ConfigError(f"{run_dir} holds no real training executions to measure a world model on")

    stream, seen = [], 0
    for _, batch in groupby(train, key=lambda s: s.step):
        batch = list(batch)
        if seen >= warmup:
            stream.extend(_predict(wm, batch))
        wm.learn([s.trajectory for s in batch])
        seen += len(batch)
    held = sorted((s for s in stored if s.split != "train"), key=lambda s: s.step)
    splits = list(dict.fromkeys(s.split for s in held))
    sections = {"stream": stream}
    for split in splits:
        sections[split] = _predict(wm, [s for s in held if s.split == split])
    # then as a WM would be used on new tasks: warmed up on their earlier evaluation rounds
    warm: dict[str, list[dict]] = {f"{split}_warm": [] for split in splits}
    for i, (_, batch) in enumerate(groupby(held, key=lambda s: s.step)):
        batch = list(batch)
        if i:
            for split in splits:
                warm[f"{split}_warm"].extend(_predict(wm, [s for s in batch if s.split == split]))
        wm.learn([s.trajectory for s in batch])
    sections.update(warm)
    # a model that imagines observations (the embodied WM): their error against the real held-out episodes
    open_loop = getattr(wm.model, "open_loop_error", None)
    errors = {split: open_loop([s.trajectory for s in held if s.split == split]) for split in splits} \
        if open_loop is not None else {}
    wm.close()  # a fit still running in a thread must not outlive the process's torch runtime

    out_dir = run_dir / "wm_eval"
    result: dict = {"run_dir": str(run_dir), "world_model": name, "warmup": warmup, "fitted_on": seen}
    if errors:
        result["open_loop_error"] = errors  # per split, per turn after the first: relative squared error
    for section, rows in sections.items():
        if rows:
            metrics = fidelity(**_columns(rows))
            write_report(metrics, out_dir, name=f"{name}-{section}")
            result[section] = {k: v for k, v in metrics.items() if k != "points"}
        else:
            result[section] = None
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2))
    return result
