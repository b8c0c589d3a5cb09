"""The four interfaces every domain implements: Policy, RealEnv, WorldModel, RewardEstimator.

They are shaped so that a one-shot text agent (one action = one program, graded
once) and a multi-step control policy (many actions, a reward at the end) fit the
same loop: environments are *batched* and step a list of episodes at once, and a
world model has the same reset/step shape as the real environment so it can stand
in for it inside a rollout. What a world model adds is uncertainty (a variance per
predicted reward) and, optionally, online fitting from anchor pairs.

Batching convention: `reset(tasks)` opens one episode per task; `step(actions)`
takes a list aligned with that batch, `None` for episodes already done, and
returns a list aligned the same way (`None` where no action was given).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Iterator, Sequence

import torch

from wmrl.core.engine import ParamGroup
from wmrl.core.types import Estimate, Group, Outcome, Prediction, Task, Trajectory, Transition, sum_or_none


class Policy(ABC):
    """A stochastic policy that owns its `torch.nn.Module` (the engine wraps it)."""

    module: torch.nn.Module

    @abstractmethod
    def act(
        self,
        observations: Sequence[Any],
        *,
        generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> tuple[list[Any], list[float]]:
        """Sample one action per observation; return actions and their log-probs."""

    @abstractmethod
    def log_prob(self, observations: Sequence[Any], actions: Sequence[Any]) -> torch.Tensor:
        """Differentiable log-probabilities of `actions` given `observations`, shape [n]."""

    def token_log_probs(self, observations: Sequence[Any], actions: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probabilities of `actions` ([n, T], differentiable) and a mask [n, T] marking each
        action's tokens, in order; what `trainer.objective.ratio: token` needs. Token-free policies lack it."""
        raise NotImplementedError(f"{type(self).__name__} has no per-token log-probabilities")

    def reset(self, tasks: Sequence[Task]) -> None:
        """Episode start for a batch of `tasks` (the rollout calls it after the environment's reset).

        A policy with per-episode state (an action queue, a recurrent memory)
        clears it here; a stateless policy needs nothing.
        """

    def param_groups(self) -> list[ParamGroup] | None:
        """Optimizer groups with their own learning-rate scale (e.g. a slower vision backbone); None: one group."""
        return None

    def save_pretrained(self, path: str) -> None:
        """Write the policy as its framework's standard model folder (what `wmrl export` writes)."""
        raise NotImplementedError(f"{type(self).__name__} cannot export itself: implement save_pretrained(path)")

    def weights_changed(self) -> None:
        """The module's weights changed (an update, a checkpoint loaded): a policy that samples from its own
        copy of them (a vLLM rollout engine) syncs it here."""

    def close(self) -> None:
        """Release what the policy holds outside this process (a rollout server)."""


class RealEnv(ABC):
    """The trusted, expensive scorer (a sandbox, a simulator, a robot).

    `capacity` is how many executions it runs at once (its sandbox slots).
    """

    capacity: int = 1

    @abstractmethod
    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        """Open one episode per task and return the first observations."""

    @abstractmethod
    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        """Advance every episode that got an action."""

    def step_each(self, actions: Sequence[Any | None]) -> Iterator[list[tuple[int, Transition]]]:
        """`step`, reporting transitions as they finish: lists of (episode index, transition), each index once.

        The trainer stores an episode the moment its last transition arrives, so an
        environment that runs a batch concurrently (a sandbox pool) should yield each
        execution as it finishes: a crash then loses only what was still running. The
        default yields the whole batch once `step` returns. Implement one of the two
        and define the other with `gather_steps`."""
        yield [(i, t) for i, t in enumerate(self.step(actions)) if t is not None]

    def outcome(self, trajectory: Trajectory) -> Outcome:
        """The verdict on a finished real episode: its summed reward, unknown if any step was."""
        total = sum_or_none(trajectory.step_rewards)
        if total is None:
            return Outcome(None, "infra", {"reason": "a step's reward was unknown"})
        status = trajectory.infos[-1].get("status", "ok") if trajectory.infos else "ok"
        return Outcome(total, status)

    def close(self) -> None:
        """Release sandboxes, simulators, processes."""


def gather_steps(arrivals: Iterator[list[tuple[int, Transition]]], n: int) -> list[Transition | None]:
    """`step`'s aligned list from what `step_each` yielded for a batch of `n` episodes."""
    out: list[Transition | None] = [None] * n
    for arrived in arrivals:
        for i, tr in arrived:
            out[i] = tr
    return out


class WorldModel(ABC):
    """The cheap scorer: same reset/step shape as RealEnv, rewards with variances."""

    @abstractmethod
    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        """Open one simulated episode per task."""

    @abstractmethod
    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        """Simulate one step per episode; `Transition.reward_var` carries the uncertainty."""

    def predict(self, trajectories: Sequence[Trajectory]) -> list[Prediction]:
        """Grade trajectories rolled out elsewhere (the anchor pairing).

        The default replays each trajectory's actions inside the model, so the
        score is the same quantity a rollout inside the model would produce.
        """
        if not trajectories:
            return []
        self.reset([t.task for t in trajectories])
        rewards: list[list[float | None]] = [[] for _ in trajectories]
        variances: list[list[float | None]] = [[] for _ in trajectories]
        for turn in range(max(t.turns for t in trajectories)):
            actions = [t.actions[turn] if turn < t.turns else None for t in trajectories]
            for i, tr in enumerate(self.step(actions)):
                if tr is not None:
                    rewards[i].append(tr.reward)
                    variances[i].append(tr.reward_var)
        means = [sum_or_none(r) for r in rewards]
        return [
            Prediction.checked(m, sum_or_none(v)) if m is not None else Prediction(None, error="world model gave no reward")
            for m, v in zip(means, variances)
        ]

    def fit(self, anchors: Sequence[Trajectory]) -> None:
        """Learn from the step's real-graded anchor trajectories (each carries `.real` and,
        when the WM graded it, `.wm`); called once per step after the pairs are stored.
        World models that learn online override this; the default learns nothing. Fit
        synchronously: the trainer's runtime runs it in the background if configured."""

    def state_dict(self) -> dict:
        """What a checkpoint must hold for an exact resume (a learning WM's data/weights)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""

    def close(self) -> None:
        """Release what the world model holds outside this process (a rollout server)."""


class RewardEstimator(ABC):
    """Turns graded groups into rewards, advantages and weights (the WMRL math).

    A registered mode (`@wmrl.register_estimator("name")`) is built as `cls(cfg, plan)`: its
    `EstimatorConfig` and the `ModePlan` that `estimators.plan_mode` resolved from the class
    attributes below and `anchors.fraction`.
    """

    #: the anchor fraction this mode always runs at (real: 1, wm: 0); None: `anchors.fraction`
    fixed_anchor_fraction: ClassVar[float | None] = None
    #: whether the mode needs a positive anchor fraction (it learns from the anchor stream)
    needs_anchors: ClassVar[bool] = False
    #: whether the world model grades anything
    uses_world_model: ClassVar[bool] = True
    #: the fraction of groups graded by the real environment in this run (resolved by `plan_mode`)
    anchor_fraction: float = 0.0

    @abstractmethod
    def estimate(self, groups: Sequence[Group]) -> Estimate:
        """Grade-to-advantage for one step, in the order the method prescribes."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (exact resume)."""
