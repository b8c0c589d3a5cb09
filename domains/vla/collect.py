"""Scripted demonstrations recorded as a LeRobotDataset (`wmrl vla collect`).

The scripted controllers see privileged state (object poses); what is recorded
is only what a policy sees (camera, proprio, instruction) and the action taken,
so the dataset is an ordinary lerobot one. Only successful episodes are kept:
BC imitates what works, and a failed scripted attempt (a slipped grasp) would
teach the policy to fail the same way. Attempts continue on fresh seeds until
each family has its quota or its attempt budget is spent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from wmrl.core.validation import at_least
from wmrl.domains.vla.dataset import create_dataset, record_episode
from wmrl.domains.vla.scripted import ScriptedController
from wmrl.domains.vla.sim import Simulator
from wmrl.domains.vla.tasks import family, make_tasks

log = logging.getLogger(__name__)


@dataclass
class CollectConfig:
    episodes_per_family: int = 16
    #: attempts per family at most, as a multiple of the quota (scripted grasps sometimes slip)
    max_attempts_factor: int = 3
    noise: float = 0.1
    offset: float = 0.005
    families: list[str] = field(default_factory=lambda: ["lift", "stack", "pick_place_can"])
    image_size: int = 64
    seed: int = 0

    def validate(self) -> None:
        at_least(self, "collect", 1, "episodes_per_family", "max_attempts_factor", "image_size")
        if not self.families:
            raise ValueError("collect.families is empty; name at least one task family")
        for name in self.families:
            family(name)


def collect_demos(root: str | Path, cfg: CollectConfig, *, progress: bool = True) -> dict[str, dict[str, int]]:
    """Write a LeRobotDataset of successful scripted episodes at `root`; returns kept/attempted per family."""
    cfg.validate()
    root = Path(root)
    ds = create_dataset(root, f"local/{root.name}", image_size=cfg.image_size)
    counts: dict[str, dict[str, int]] = {}
    bar = tqdm(total=cfg.episodes_per_family * len(cfg.families), desc="demos", disable=not progress, leave=False)
    try:
        for name in cfg.families:
            sim = Simulator(name, image_size=cfg.image_size)
            controller = ScriptedController(name, cfg.noise, cfg.offset)
            kept = attempts = 0
            try:
                budget = cfg.episodes_per_family * cfg.max_attempts_factor
                for task in make_tasks("train", budget, seed=cfg.seed, families=[name]):
                    if kept == cfg.episodes_per_family:
                        break
                    attempts += 1
                    frames = _scripted_episode(sim, controller, task.payload)
                    if frames is not None:
                        record_episode(ds, frames)
                        kept += 1
                        bar.update(1)
            finally:
                sim.close()
            counts[name] = {"kept": kept, "attempts": attempts}
            log.info("collect %s: %d successful demos in %d attempts", name, kept, attempts)
    finally:
        bar.close()
        ds.finalize()
    return counts


def _scripted_episode(sim: Simulator, controller: ScriptedController, spec) -> list[dict] | None:
    """The frames of one scripted episode, or None if it did not succeed."""
    obs = sim.reset(spec)
    controller.reset(spec.seed)
    frames = []
    while not sim.done:
        action = controller.act(sim.privileged())
        frames.append({"image": obs["image"], "state": obs["state"], "action": action,
                       "instruction": spec.instruction})
        sim.step(action)
        obs = sim.observation()
    return frames if sim.success else None
