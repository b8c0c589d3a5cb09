"""Batched rollouts of a policy against anything with the reset/step shape.

The same loop runs an episode in the real environment or inside the world model
(the WM standing in for the environment), which is what lets a multi-step agent
see simulated observations in WM-graded groups. A scorer that raises does not
stop training: the episodes it was stepping end with an unknown reward, which
the estimator excludes. Time is split between the policy (generation) and the
scorer, because that split is the whole case for WMRL.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from wmrl.core.interfaces import Policy, RealEnv, WorldModel
from wmrl.core.types import Prediction, Task, Trajectory, Transition, sum_or_none

log = logging.getLogger(__name__)


@dataclass
class RolloutTimes:
    generation: float = 0.0
    scorer: float = 0.0


def rollout(
    policy: Policy,
    env: RealEnv | WorldModel,
    tasks: Sequence[Task],
    *,
    source: str,
    max_turns: int,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    times: RolloutTimes | None = None,
) -> list[Trajectory]:
    """Roll out one episode per task; episodes still running after `max_turns` are truncated."""
    times = times if times is not None else RolloutTimes()
    trajs = [Trajectory(task=t, source=source) for t in tasks]
    if not tasks:
        return trajs
    t0 = time.perf_counter()
    try:
        obs = list(env.reset(tasks))
    except Exception as exc:  # the scorer failed: every episode's grade is unknown
        log.warning("%s reset failed: %r; %d episodes get an unknown grade", source, exc, len(tasks))
        for tr in trajs:
            tr.step_rewards.append(None)
            tr.infos.append({"status": "infra", "error": repr(exc)})
        return trajs
    times.scorer += time.perf_counter() - t0
    policy.reset(tasks)
    alive = list(range(len(tasks)))
    for _ in range(max_turns):
        if not alive:
            break
        t0 = time.perf_counter()
        with torch.no_grad():
            actions, log_probs = policy.act([obs[i] for i in alive], generator=generator, greedy=greedy)
        times.generation += time.perf_counter() - t0
        batch: list = [None] * len(tasks)
        for i, a in zip(alive, actions):
            batch[i] = a
        t0 = time.perf_counter()
        try:
            results: list[Transition | None] = list(env.step(batch))
            if len(results) != len(tasks):
                raise RuntimeError(f"step returned {len(results)} transitions for {len(tasks)} episodes")
        except Exception as exc:
            log.warning("%s step failed: %r; %d live episodes get an unknown grade", source, exc, len(alive))
            results = [Transition(None, None, True, info={"status": "infra", "error": repr(exc)})] * len(tasks)
        times.scorer += time.perf_counter() - t0
        still = []
        for i, a, lp in zip(alive, actions, log_probs):
            tr = results[i] or Transition(None, None, True, info={"status": "infra", "error": "no transition"})
            traj = trajs[i]
            traj.observations.append(obs[i])
            traj.actions.append(a)
            traj.log_probs.append(float(lp))
            traj.step_rewards.append(tr.reward)
            traj.step_reward_vars.append(tr.reward_var)
            traj.infos.append(tr.info)
            obs[i] = tr.observation
            if not tr.done:
                still.append(i)
        alive = still
    for i in alive:  # out of turns: a judged attempt that did not finish, not a failure of the scorer
        trajs[i].infos[-1] = {**trajs[i].infos[-1], "status": "truncated"}
    return trajs


def wm_prediction(traj: Trajectory) -> Prediction:
    """The world model's grade of an episode it simulated: summed means and variances."""
    mean = sum_or_none(traj.step_rewards) if traj.step_rewards else None
    if mean is None:
        err = next((i.get("error") for i in traj.infos if i.get("error")), "world model gave no reward")
        return Prediction(None, error=str(err))
    return Prediction.checked(mean, sum_or_none(traj.step_reward_vars))
