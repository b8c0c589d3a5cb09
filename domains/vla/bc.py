"""Behaviour cloning of a VLA policy from a LeRobotDataset, through the same DeepSpeed engine as RL.

Why the RL engine and not a separate loop: BC is the first stage of the same
policy's life, so it shares the engine's ZeRO stage, gradient clipping, parameter
groups (a slower vision encoder) and crash-safe checkpoints; a BC checkpoint is
what `wmrl train vla` starts from.

Exact resume without saved sampler state: the minibatch of update `t` is drawn
from a generator seeded by (`seed`, `t`), so a resumed run draws the batches the
uninterrupted one would have. Validation holds out whole episodes (frames of one
episode are near-duplicates, so a frame-level split would measure memorisation).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from wmrl.core.engine import Engine, EngineConfig, ParamGroup
from wmrl.core.validation import at_least
from wmrl.domains.vla.dataset import chunk_samples, load_dataset, take

log = logging.getLogger(__name__)

_CHECKPOINTS = "checkpoints"


@dataclass
class BCConfig:
    steps: int = 2400
    batch_size: int = 32
    lr: float = 1e-3
    vision_lr_scale: float = 1.0  # learning rate of the vision encoder, relative to `lr`
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    zero_stage: int = 0
    val_episodes: int = 3  # whole episodes held out for the validation loss
    eval_every: int = 400  # updates between validation losses
    checkpoint_every: int = 800
    seed: int = 0

    def validate(self) -> None:
        at_least(self, "bc", 1, "steps", "batch_size", "eval_every", "checkpoint_every")
        at_least(self, "bc", 0, "val_episodes")
        if not (math.isfinite(self.vision_lr_scale) and self.vision_lr_scale > 0):
            raise ValueError(f"bc.vision_lr_scale must be a number > 0, got {self.vision_lr_scale!r}")

    def engine(self) -> EngineConfig:
        return EngineConfig(zero_stage=self.zero_stage, lr=self.lr, weight_decay=self.weight_decay,
                            grad_clip=self.grad_clip)


def split_episodes(n_episodes: int, val_episodes: int, seed: int) -> tuple[list[int], list[int]]:
    """(train, validation) episode indices; the validation ones drawn by `seed`, at least one episode trains."""
    val_n = min(val_episodes, n_episodes - 1)
    order = torch.randperm(n_episodes, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[val_n:]), sorted(order[:val_n])


def _batch_index(n: int, size: int, seed: int, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, n, (min(size, n),), generator=gen)


def _loss(policy: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    loss, _ = policy(batch)
    return loss


def validation_loss(policy: torch.nn.Module, samples: dict[str, Any], batch_size: int = 256) -> float:
    """Mean BC loss over `samples` (frame-weighted), without gradients."""
    n = len(samples["task"])
    total = 0.0
    with torch.no_grad():
        for i in range(0, n, batch_size):
            idx = torch.arange(i, min(i + batch_size, n))
            total += float(_loss(policy, take(samples, idx))) * len(idx)
    return total / n


def behaviour_clone(policy: torch.nn.Module, dataset: str | Path, out_dir: str | Path, cfg: BCConfig,
                    *, progress: bool = True) -> dict[str, Any]:
    """Train `policy` (a lerobot-style module: `policy(batch) -> (loss, info)`) on `dataset`.

    Checkpoints under `out_dir/checkpoints` (resumed from the latest), the final
    policy with `save_pretrained` at `out_dir/policy`, the loss history in
    `out_dir/bc.json`. Returns that history.
    """
    cfg.validate()
    out = Path(out_dir)
    meta = load_dataset(dataset, policy.config).meta
    train_eps, val_eps = split_episodes(meta.total_episodes, cfg.val_episodes, cfg.seed)
    train = chunk_samples(load_dataset(dataset, policy.config, episodes=train_eps))
    val = chunk_samples(load_dataset(dataset, policy.config, episodes=val_eps)) if val_eps else None
    groups = [ParamGroup(policy.vision_parameters(), cfg.vision_lr_scale)] if cfg.vision_lr_scale != 1 else None
    engine = Engine(policy, cfg.engine(), groups)
    state = engine.load(out / _CHECKPOINTS) or {}
    step = int(state.get("step", 0))
    history: dict[str, Any] = state.get("history") or {"train_loss": [], "val_loss": [], "config": asdict(cfg),
                                                       "train_episodes": train_eps, "val_episodes": val_eps}
    if step == 0 and val is not None:
        history["val_loss"].append([0, validation_loss(policy, val)])
    n = len(train["task"])
    bar = tqdm(total=cfg.steps, initial=step, desc="bc", disable=not progress, leave=False)
    while step < cfg.steps:
        policy.train()
        stats = engine.step(_loss(policy, take(train, _batch_index(n, cfg.batch_size, cfg.seed, step))))
        policy.eval()
        step += 1
        history["train_loss"].append([step, stats["loss"]])
        bar.update(1)
        bar.set_postfix(loss=f"{stats['loss']:.3f}")
        if val is not None and (step % cfg.eval_every == 0 or step == cfg.steps):
            history["val_loss"].append([step, validation_loss(policy, val)])
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            engine.save(out / _CHECKPOINTS, f"step{step}", {"step": step, "history": history})
    bar.close()
    policy.save_pretrained(out / "policy")
    (out / "bc.json").write_text(json.dumps(history, indent=1))
    log.info("bc: %d updates on %d frames of %d episodes; policy at %s", step, n, len(train_eps), out / "policy")
    return history
