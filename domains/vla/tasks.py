"""Task families and their train / test_id / test_ood splits for the robosuite Panda domain.

A task is one episode's full specification (`VLATaskSpec`): which robosuite
environment, the seed that fixes its initial state (the same seed replays the
same scene exactly), the instruction the policy reads, and for out-of-distribution
tasks a `Variation` of the scene. Splits differ in what the policy has seen:

- `train` and `test_id` share families, training phrasings and the default scene;
  their seeds are disjoint, so `test_id` measures generalisation to new initial states.
- `test_ood` changes what training never showed: held-out phrasings, object
  colours outside the default palette, other object sizes, wider placement ranges.

- `validation` is in-distribution like `test_id`, for choosing hyperparameters.

Seeds are disjoint across splits by construction (train, test_id and test_ood are
the seed's residue mod 3; validation takes test_id's residue from episode index
`VALIDATION_INDEX` on), so no `make_tasks` arguments can make a test scene a
training scene.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from wmrl.core.types import SPLITS, Task


@dataclass(frozen=True)
class Variation:
    """An out-of-distribution change to the scene, applied to the manipulated object.

    `rgba` replaces the object's colour (its texture is dropped), `size_scale`
    scales its box half-sizes, `placement_scale` widens the placement ranges.
    """

    rgba: tuple[float, float, float, float] | None = None
    size_scale: float = 1.0
    placement_scale: float = 1.0


@dataclass(frozen=True)
class VLATaskSpec:
    family: str
    seed: int
    instruction: str
    variation: Variation | None = None


@dataclass(frozen=True)
class Family:
    """One robosuite task and the language used for it."""

    env_name: str
    train_phrasings: tuple[str, ...]
    ood_phrasings: tuple[str, ...]
    #: default episode length in low-level (20 Hz) steps
    horizon_steps: int
    #: whether the manipulated object is a box (a mesh cannot be resized after load)
    resizable: bool
    ood_sizes: tuple[float, ...]
    ood_placements: tuple[float, ...]


FAMILIES: dict[str, Family] = {
    "lift": Family(
        env_name="Lift",
        train_phrasings=(
            "lift the red cube",
            "pick up the cube",
            "raise the block off the table",
            "grab the cube and lift it",
        ),
        ood_phrasings=("hoist the little box into the air", "get that block up off the tabletop"),
        horizon_steps=150,
        resizable=True,
        ood_sizes=(0.8, 1.2),
        ood_placements=(2.0, 2.5),
    ),
    "stack": Family(
        env_name="Stack",
        train_phrasings=(
            "stack the red cube on the green cube",
            "put the red block on top of the green block",
            "place the red cube onto the green one",
            "pick up the red cube and stack it on the green cube",
        ),
        ood_phrasings=("build a two-block tower, small block on top", "set the smaller cube upon the larger cube"),
        horizon_steps=300,
        resizable=True,
        ood_sizes=(0.85, 1.15),
        ood_placements=(1.25,),
    ),
    "pick_place_can": Family(
        env_name="PickPlaceCan",
        train_phrasings=(
            "put the can in its bin",
            "pick up the can and place it in the right bin",
            "move the soda can to the target bin",
            "transfer the can into the bin on the right",
        ),
        ood_phrasings=("relocate the tin to its compartment", "carry the drink can over to where it belongs"),
        horizon_steps=300,
        resizable=False,
        ood_sizes=(1.0,),
        # the can is sampled over the whole source bin already; a wider range leaves the bin
        ood_placements=(1.0,),
    ),
}

#: colours no training scene shows (training objects are red / green wood, the can its label)
OOD_COLOURS: tuple[tuple[float, float, float, float], ...] = (
    (0.1, 0.3, 0.9, 1.0),
    (0.95, 0.85, 0.1, 1.0),
    (0.6, 0.1, 0.8, 1.0),
    (0.1, 0.8, 0.8, 1.0),
)


def family(name: str) -> Family:
    """The family called `name`; a ValueError lists the known ones."""
    if name not in FAMILIES:
        raise ValueError(f"unknown VLA task family {name!r}; known families: {sorted(FAMILIES)}")
    return FAMILIES[name]


#: validation episode i is test_id's episode VALIDATION_INDEX + i (no test_id list is that long)
VALIDATION_INDEX = 1_000_000


def episode_seed(split: str, family_name: str, index: int, seed: int = 0) -> int:
    """The initial-state seed of episode `index`: its residue mod 3 is the split, so splits never share one
    (validation: test_id's residue, on indices no test_id list reaches)."""
    f = list(FAMILIES).index(family_name)
    if split == "validation":
        split, index = "test_id", VALIDATION_INDEX + index
    return 3 * (seed * 10_000_000 + index * len(FAMILIES) + f) + SPLITS.index(split)


def make_tasks(
    split: str, n_per_family: int, seed: int = 0, families: Sequence[str] = ("lift", "stack", "pick_place_can")
) -> list[Task]:
    """`n_per_family` tasks of each family for `split`, the same list for the same arguments."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if n_per_family < 0:
        raise ValueError(f"n_per_family must be >= 0, got {n_per_family}")
    tasks = []
    for name in families:
        fam = family(name)
        for i in range(n_per_family):
            s = episode_seed(split, name, i, seed)
            rng = np.random.default_rng([s, 17])
            variation = None
            if split == "test_ood":
                phrasings = fam.ood_phrasings
                variation = Variation(
                    rgba=OOD_COLOURS[int(rng.integers(len(OOD_COLOURS)))],
                    size_scale=float(rng.choice(fam.ood_sizes)),
                    placement_scale=float(rng.choice(fam.ood_placements)),
                )
            else:
                phrasings = fam.train_phrasings
            instruction = phrasings[int(rng.integers(len(phrasings)))]
            tasks.append(Task(f"{split}-{name}-{i}", split, VLATaskSpec(name, s, instruction, variation), seed=s))
    return tasks
