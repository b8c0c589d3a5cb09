"""The data that flows between the roles of one training step.

One batch type travels through the step (verl's lesson): tasks become groups of
trajectories, scorers attach grades to them, the estimator attaches advantages
and weights, the engine consumes them. Keeping grades on the trajectory, with
`None` meaning *unknown*, is what lets every later stage exclude an ungraded
attempt instead of silently scoring it 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

#: task splits every domain provides: train, held-out in-distribution, held-out out-of-distribution, and
#: validation (in-distribution, disjoint from test_id: what hyperparameters are chosen on, bench/speedup.py).
#: New splits go last: domains seed each split's tasks by its index here.
SPLITS = ("train", "test_id", "test_ood", "validation")

#: Outcome statuses of an attempt that was judged: a real outcome, good or bad.
#: `truncated`: the episode ran out of steps or turns before it ended (graded as it stands).
GRADED_STATUSES = ("ok", "error", "timeout", "oom", "invalid", "truncated")
#: Outcome statuses a real environment may report. `infra` is the environment's
#: own failure: the grade is unknown, never a judgement of the attempt.
STATUSES = (*GRADED_STATUSES, "infra")


def sum_or_none(values: Sequence[float | None]) -> float | None:
    """The sum of per-step rewards or variances; None (unknown) if any one is unknown."""
    return None if any(v is None for v in values) else float(sum(values))


@dataclass(frozen=True)
class Task:
    """One prompt / episode specification. `payload` is domain-specific.

    `seed` fixes the episode's initial state where the environment draws one
    (a simulator's object placement), so the same task replays exactly.
    """

    id: str
    split: str = "train"
    payload: Any = None
    seed: int | None = None


@dataclass
class Transition:
    """What an environment (real or world model) returns for one action."""

    observation: Any
    reward: float | None
    done: bool
    reward_var: float | None = None
    info: dict = field(default_factory=dict)


@dataclass
class Outcome:
    """A real environment's verdict on a whole trajectory.

    `reward` is None exactly when the grade is unknown (status `infra`). A
    program that runs and fails is a real outcome with the task's failure reward.
    """

    reward: float | None
    status: str = "ok"
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown outcome status {self.status!r}; expected one of {STATUSES}")
        if self.reward is not None:
            if not math.isfinite(self.reward) or not 0.0 <= self.reward <= 1.0:
                raise ValueError(
                    f"real reward {self.reward!r} is outside [0, 1]: a RealEnv must normalise its "
                    "rewards to [0, 1] (WMRL's calibration works in that range)"
                )

    @property
    def known(self) -> bool:
        return self.reward is not None


@dataclass
class Prediction:
    """A world model's grade: mean and variance of the predicted reward.

    `mean` is None when the world model could not grade (raised, returned NaN,
    produced an unparsable reply); `error` says why.
    """

    mean: float | None
    var: float | None = None
    samples: Sequence[float] | None = None
    error: str | None = None

    @classmethod
    def checked(cls, mean: Any, var: Any = None, samples: Sequence[float] | None = None) -> "Prediction":
        """Build a prediction, turning non-finite values into an unknown grade."""
        try:
            m = float(mean)
        except (TypeError, ValueError):
            return cls(None, error=f"world model returned a non-number mean {mean!r}")
        if not math.isfinite(m):
            return cls(None, error=f"world model returned a non-finite mean {m!r}")
        v = None
        if var is not None:
            v = float(var)
            if not math.isfinite(v) or v < 0:
                return cls(None, error=f"world model returned an invalid variance {v!r}")
        return cls(m, v, samples)

    @property
    def known(self) -> bool:
        return self.mean is not None


@dataclass
class Trajectory:
    """One attempt at a task: the observations the policy saw and what it did.

    `log_probs` are the behaviour policy's per-turn log-probabilities at sampling
    time (the PPO ratio's denominator). `source` says where the episode was
    rolled out: "real" (the RealEnv) or "wm" (inside the world model).
    """

    task: Task
    observations: list[Any] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    step_rewards: list[float | None] = field(default_factory=list)
    step_reward_vars: list[float | None] = field(default_factory=list)
    infos: list[dict] = field(default_factory=list)
    source: str = "wm"
    # grades attached by the scorers
    real: Outcome | None = None
    wm: Prediction | None = None

    @property
    def turns(self) -> int:
        return len(self.actions)


@dataclass
class Group:
    """The G trajectories sampled for one task in one step (GRPO's unit)."""

    id: str
    task: Task
    trajectories: list[Trajectory]
    anchor: bool = False
    #: False: graded for calibration only, never in the loss (a late anchor group under `stale_use: calibrate`)
    train: bool = True


@dataclass
class Estimate:
    """The estimator's output for one step: what the update consumes.

    Per trajectory (aligned with the flattened groups): the reward used (None =
    excluded), its advantage and its weight. `diagnostics` holds the four
    WMRL diagnostics and anything else worth logging.
    """

    rewards: list[list[float | None]]
    advantages: list[list[float | None]]
    weights: list[list[float]]
    diagnostics: dict[str, float] = field(default_factory=dict)
