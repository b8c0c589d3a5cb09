"""Real success of a VLA policy on held-out splits, and pictures of what it did (`wmrl vla eval`).

Success is the simulator's own check at the episode's end, never a model's
guess; an episode whose simulator failed is counted as unknown, apart from
successes and failures. Each held-out task is an initial state drawn from its
seed, and `seeds` sampled rollouts per task (plus a greedy one when asked)
measure the policy rather than one lucky draw.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from wmrl.core.interfaces import Policy
from wmrl.core.rollout import rollout
from wmrl.core.types import Task, Trajectory
from wmrl.core.validation import at_least
from wmrl.domains.vla.env import VLAEnv, VLAEnvConfig

log = logging.getLogger(__name__)


@dataclass
class EvalConfig:
    splits: list[str] = field(default_factory=lambda: ["test_id", "test_ood"])
    #: sampled rollouts per task (different action noise, same initial state)
    samples: int = 1
    greedy: bool = True  # the mean chunk instead of a sample
    seed: int = 0

    def validate(self) -> None:
        at_least(self, "eval", 1, "samples")


def episode_outcome(traj: Trajectory) -> bool | None:
    """Success of a real episode; None when its grade is unknown (the simulator failed)."""
    if not traj.infos or traj.infos[-1].get("status") == "infra":
        return None
    return bool(traj.infos[-1].get("success", False))


def run_episodes(policy: Policy, env: VLAEnv, tasks: Sequence[Task], *, max_turns: int, greedy: bool,
                 seed: int) -> list[Trajectory]:
    gen = torch.Generator().manual_seed(seed)
    return rollout(policy, env, tasks, source="real", max_turns=max_turns, generator=gen, greedy=greedy)


def summarize(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """Success rate overall and per family, with the unknown count kept apart."""
    by_family: dict[str, list[bool | None]] = {}
    for t in trajs:
        by_family.setdefault(t.task.payload.family, []).append(episode_outcome(t))

    def rate(outcomes: list[bool | None]) -> dict[str, Any]:
        known = [o for o in outcomes if o is not None]
        return {"success": float(np.mean(known)) if known else float("nan"), "n": len(known),
                "unknown": len(outcomes) - len(known)}

    return {**rate([o for v in by_family.values() for o in v]), "families": {k: rate(v) for k, v in by_family.items()}}


def evaluate_policy(policy: Policy, tasks_by_split: dict[str, list[Task]], env_cfg: VLAEnvConfig,
                    cfg: EvalConfig) -> tuple[dict[str, Any], dict[str, list[Trajectory]]]:
    """Per-split success summaries, and every split's trajectories (observations carry the frames)."""
    cfg.validate()
    max_turns = max_turns_for(env_cfg, [t for ts in tasks_by_split.values() for t in ts])
    results, trajs = {}, {}
    with VLAEnv(env_cfg) as env:
        for split in cfg.splits:
            batch = [t for t in tasks_by_split[split] for _ in range(cfg.samples)]
            trajs[split] = run_episodes(policy, env, batch, max_turns=max_turns, greedy=cfg.greedy, seed=cfg.seed)
            results[split] = summarize(trajs[split])
            log.info("eval %s: success %.3f over %d episodes", split, results[split]["success"], len(batch))
    return results, trajs


def max_turns_for(env_cfg: VLAEnvConfig, tasks: Sequence[Task]) -> int:
    """Chunks needed to reach the longest horizon among `tasks` (the env ends episodes at their horizon)."""
    longest = max((env_cfg.horizon(t.payload.family) for t in tasks), default=1)
    return -(-longest // env_cfg.chunk)


def frames_of(traj: Trajectory) -> list[np.ndarray]:
    """The camera frames of an episode, one per chunk, ending with the last observation seen."""
    return [o["image"] for o in traj.observations if isinstance(o, dict) and "image" in o]


def write_strip(frames: Sequence[np.ndarray], path: Path, columns: int = 10) -> Path:
    """`columns` frames evenly spaced over the episode, side by side, as one PNG."""
    from PIL import Image

    idx = np.linspace(0, len(frames) - 1, num=min(columns, len(frames))).round().astype(int)
    Image.fromarray(np.concatenate([frames[i] for i in idx], axis=1)).save(path)
    return path


def write_gif(frames: Sequence[np.ndarray], path: Path, fps: int = 5, scale: int = 2) -> Path:
    from PIL import Image

    images = [Image.fromarray(f).resize((f.shape[1] * scale, f.shape[0] * scale), Image.NEAREST) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return path
