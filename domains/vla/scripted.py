"""Scripted controllers: demonstrations for each family from the simulator's privileged state.

A learned policy is trained on demonstrations; these controllers make them. Each
is a short plan of phases (approach above the object, descend, close, lift; then
for `stack` carry over the green cube, lower, open, retreat; for
`pick_place_can` carry over the target bin, lower, open, retreat). A phase steers
the gripper site to a waypoint with a proportional OSC_POSE delta and ends when
the waypoint is reached (or after a fixed number of steps, so a bad grasp cannot
stall an episode). Orientation deltas stay zero: the Panda starts pointing down.

Demos vary through `noise`: Gaussian noise on the translation deltas (rotation
noise would random-walk the gripper's orientation, so it is left out) and, per
episode, a seeded random offset of up to `offset` metres on every waypoint.

Measured success (`measure_success`, seeds 0-19 of the train split, noise 0.1,
offset 0.005; `python -m wmrl.domains.vla.scripted`): lift 20/20, stack 19/20,
pick_place_can 20/20 (test_ood, 6 each: 6/6, 5/6, 6/6).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from wmrl.domains.vla.sim import Privileged, Simulator
from wmrl.domains.vla.tasks import VLATaskSpec, family, make_tasks

log = logging.getLogger(__name__)

OPEN, CLOSE = -1.0, 1.0
#: OSC_POSE maps an action of 1 to a 5 cm target offset; gain 10 saturates at 10 cm of error
GAIN = 10.0


@dataclass(frozen=True)
class Phase:
    name: str
    #: the gripper-site waypoint, from the privileged state and the position where the grasp closed
    target: Callable[[Privileged, np.ndarray], np.ndarray] | None
    gripper: float
    #: the phase ends within this distance of its waypoint, or after max_steps
    tol: float = 0.01
    max_steps: int = 60


def _above(h: float) -> Callable[[Privileged, np.ndarray], np.ndarray]:
    return lambda p, g: p.object_pos + [0.0, 0.0, h]


def _grasp_point(p: Privileged, grasp: np.ndarray) -> np.ndarray:
    """Slightly above the object's centre: a tall object's fingers would otherwise meet the floor."""
    return p.object_pos + [0.0, 0.0, 0.3 * p.object_half_height]


def _over_target(clearance: float) -> Callable[[Privileged, np.ndarray], np.ndarray]:
    """Above the target, the held object's bottom `clearance` above the target's top."""

    def target(p: Privileged, grasp: np.ndarray) -> np.ndarray:
        z = p.target_pos[2] + p.target_half_height + p.object_half_height + clearance
        # the gripper site sits where it holds the object, not at the object's centre
        z += p.eef_pos[2] - p.object_pos[2]
        return np.array([p.target_pos[0], p.target_pos[1], z])

    return target


def _plan(family_name: str) -> list[Phase]:
    grasp = [
        Phase("approach", _above(0.08), OPEN, tol=0.01, max_steps=80),
        Phase("descend", _grasp_point, OPEN, tol=0.008, max_steps=40),
        Phase("close", None, CLOSE, max_steps=10),
        Phase("lift", lambda p, g: g + [0.0, 0.0, 0.15], CLOSE, max_steps=60),
    ]
    if family_name == "lift":
        return grasp
    # the can must clear the bin walls while carried, and is dropped from a little above the bin floor
    carry, lower = (0.06, 0.005) if family_name == "stack" else (0.15, 0.04)
    return [
        *grasp,
        Phase("carry", _over_target(carry), CLOSE, tol=0.015, max_steps=100),
        Phase("lower", _over_target(lower), CLOSE, tol=0.01, max_steps=30),
        Phase("open", None, OPEN, max_steps=10),
        Phase("retreat", lambda p, g: p.eef_pos + [0.0, 0.0, 0.05], OPEN, max_steps=40),
    ]


class ScriptedController:
    """A waypoint controller for one family; `reset(seed)` then `act(privileged)` each step."""

    def __init__(self, family_name: str, noise: float = 0.1, offset: float = 0.005):
        family(family_name)
        self.phases = _plan(family_name)
        self.noise, self.offset = noise, offset
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng([seed, 23])
        self.offsets = self.rng.uniform(-self.offset, self.offset, (len(self.phases), 3))
        self.index, self.phase_steps = 0, 0
        self.grasp = np.zeros(0)
        self.hold: np.ndarray | None = None

    @property
    def phase(self) -> str:
        return self.phases[min(self.index, len(self.phases) - 1)].name

    def act(self, p: Privileged) -> np.ndarray:
        phase = self.phases[min(self.index, len(self.phases) - 1)]
        if phase.target is None:
            # gripper-only phases hold where they began
            if self.hold is None:
                self.hold = p.eef_pos.copy()
                if phase.gripper == CLOSE:
                    self.grasp = p.eef_pos.copy()
            goal = self.hold
        else:
            goal = phase.target(p, self.grasp) + self.offsets[self.index % len(self.phases)]
        error = goal - p.eef_pos
        action = np.zeros(7)
        action[:3] = np.clip(GAIN * error + self.rng.normal(0.0, self.noise, 3), -1.0, 1.0)
        action[6] = phase.gripper
        self.phase_steps += 1
        reached = phase.target is not None and np.linalg.norm(error) < phase.tol
        if reached or self.phase_steps >= phase.max_steps:
            self.index = min(self.index + 1, len(self.phases) - 1)
            self.phase_steps, self.hold = 0, None
        return action.astype(np.float32)


def run_episode(sim: Simulator, controller: ScriptedController, spec: VLATaskSpec) -> bool:
    """Roll the controller out on `spec` until success or the horizon; return whether it succeeded."""
    sim.reset(spec)
    controller.reset(spec.seed)
    while not sim.done:
        sim.step(controller.act(sim.privileged()))
    return sim.success


def measure_success(family_name: str, n: int = 20, noise: float = 0.1, offset: float = 0.005) -> float:
    """The controller's success rate on the first `n` training tasks of the family."""
    sim = Simulator(family_name)
    controller = ScriptedController(family_name, noise, offset)
    try:
        wins = [run_episode(sim, controller, t.payload) for t in make_tasks("train", n, families=[family_name])]
    finally:
        sim.close()
    return sum(wins) / n


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    for name in ("lift", "stack", "pick_place_can"):
        log.info("%s: scripted success %.2f", name, measure_success(name))
