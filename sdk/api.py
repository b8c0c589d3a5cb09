"""The Python API: `wmrl.train(cfg)`, `wmrl.evaluate(run_dir)` and `wmrl.export(run_dir, out)`.

Both take what the CLI takes (a config path or shipped name, a mapping, or a
RunConfig, plus dotlist overrides), so a notebook and a shell run the same job.
A run folder is self-describing: the resolved `config.yaml`, `metrics.jsonl`,
TensorBoard events, the run store, checkpoints, and `summary.json`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from wmrl.config import ConfigError, RunConfig, load_config, load_run_config, to_yaml
from wmrl.core.engine import Engine
from wmrl.core.files import write_atomic
from wmrl.core.registry import DOMAINS
from wmrl.core.trainer import Trainer
from wmrl.evaluation import evaluate_run


@dataclass
class TrainResult:
    run_dir: Path
    history: list[dict]  # one row per evaluation: step, wall, real_wall, eval_<split>
    config: RunConfig
    finished_before: bool = False  # the run had finished: this is its stored result, nothing ran

    @property
    def final(self) -> dict:
        return self.history[-1] if self.history else {}


def build_trainer(cfg: RunConfig, *, checkpoint: str | None = None) -> Trainer:
    """The trainer `cfg` describes, restored from `checkpoint` (a tag; None: the latest, if any)."""
    domain = DOMAINS.get(cfg.domain.name)(cfg.domain)
    try:
        return Trainer(
            domain, trainer=cfg.trainer, estimator=cfg.estimator, anchors=cfg.anchors, engine=cfg.engine,
            world_model=cfg.world_model, run_dir=cfg.run_dir, run_id=cfg.run_id, tensorboard=cfg.tensorboard,
            checkpoint=checkpoint,
        )
    except ValueError as exc:  # what the config asks of the domain's parts and they cannot do: one line
        raise ConfigError(str(exc)) from exc


def _check_same_config(run_dir: Path, cfg: RunConfig) -> None:
    """Resuming with another config would silently mix two experiments; only `trainer.steps` may grow."""
    if not (run_dir / "config.yaml").exists():
        return
    old = load_run_config(run_dir)
    old.trainer.steps = cfg.trainer.steps
    if to_yaml(old) != to_yaml(cfg):
        raise ConfigError(
            f"{run_dir} holds a run with a different config; resume it with the same config "
            "(see its config.yaml; only trainer.steps may change) or pass another run_dir"
        )


def train(cfg: Any = None, overrides: Sequence[str] = (), *, progress: bool = False) -> TrainResult:
    """Train (or resume, if `run_dir` holds a checkpoint of the same run) and return the history.

    A run that already finished is not trained or evaluated again: its stored
    result comes back (`TrainResult.finished_before`); raise `trainer.steps` to
    train on, or use `evaluate` for a fresh evaluation.
    """
    cfg = load_config(cfg, overrides)
    logging.getLogger("wmrl").setLevel(cfg.log_level)
    run_dir = Path(cfg.run_dir)
    _check_same_config(run_dir, cfg)
    trainer = build_trainer(cfg)  # takes the run directory's lock before anything is written
    try:
        summary_path = run_dir / "summary.json"
        if trainer.step >= cfg.trainer.steps and summary_path.exists():
            summary = json.loads(summary_path.read_text())
            return TrainResult(run_dir, summary["history"], cfg, finished_before=True)
        if not trainer.ranks.leader:  # a learner rank writes nothing of the run folder
            return TrainResult(run_dir, trainer.train(), cfg)
        write_atomic(run_dir / "config.yaml", to_yaml(cfg))
        history = trainer.train(progress=progress)
        summary = {
            "domain": cfg.domain.name,
            "mode": cfg.estimator.mode,
            "steps": cfg.trainer.steps,
            "real_executions": trainer.store.count_executions(cfg.run_id),
            "anchor_pairs": trainer.store.count_anchor_pairs(cfg.run_id),
            "history": history,
        }
        write_atomic(summary_path, json.dumps(summary, indent=2))
    finally:
        trainer.close()
    return TrainResult(run_dir, history, cfg)


def resumed_trainer(run_dir: str | Path, overrides: Sequence[str] = (), *, step: int | None = None) -> Trainer:
    """The trainer of the run in `run_dir` (wherever it now lies), restored from its latest checkpoint or `step`'s."""
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir, overrides)
    cfg.run_dir = str(run_dir)  # the saved run_dir is where it was trained, maybe relative to another cwd
    cfg.engine.world_size = int(os.environ.get("WORLD_SIZE", "1"))  # a multi-rank run's checkpoint, in this process
    checkpoints = run_dir / "checkpoints"
    if Engine.latest_tag(checkpoints) is None:
        raise ConfigError(f"{run_dir} has no checkpoint yet: train it first (`wmrl train ... run_dir={run_dir}`)")
    tag = None if step is None else f"step{step:06d}"
    if tag is not None and not (checkpoints / tag).is_dir():
        have = sorted(int(p.name[4:]) for p in checkpoints.glob("step[0-9]*") if p.is_dir())
        raise ConfigError(f"{run_dir} has no checkpoint of step {step}; it has steps {have}")
    return build_trainer(cfg, checkpoint=tag)


def evaluate(run_dir: str | Path, splits: Sequence[str] | None = None, overrides: Sequence[str] = (), *,
             step: int | None = None, reuse: bool = False) -> dict[str, Any]:
    """Real held-out reward of the run in `run_dir` at its latest checkpoint (or `step`), per split and per task.

    Fresh episodes unless `reuse` (then the run's own evaluation at that step);
    `overrides` as for `train`. Writes RUN_DIR/eval/TAG.json and .md (`evaluation.py`).
    """
    return evaluate_run(run_dir, splits, overrides, step=step, reuse=reuse)


def export(run_dir: str | Path, out: str | Path) -> Path:
    """Write the policy of a run's latest checkpoint as a standard model folder (`from_pretrained` loads it).

    A causal-LM policy becomes a Hugging Face model directory with its tokenizer,
    LoRA adapters merged into the weights; a VLA policy a lerobot policy folder.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not empty; export into a new folder")
    trainer = resumed_trainer(run_dir)
    try:
        with trainer.engine.gathered():  # ZeRO-3 keeps them sharded outside
            trainer.policy.save_pretrained(str(out))
    finally:
        trainer.close()
    return out
