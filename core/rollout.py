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
from typing import Callable, Iterator, Sequence

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
    on_done: Callable[[list[tuple[int, Trajectory]]], None] | None = None,
) -> list[Trajectory]:
    """Roll out one episode per task; episodes still running after `max_turns` are truncated.

    `on_done` receives each batch of (index, trajectory) of episodes that just
    ended, as their last transitions arrive (`RealEnv.step_each`), so a caller can
    store a finished execution before the rest of the batch has finished. What it
    raises stops the rollout: it is the caller's failure, not the scorer's.
    """
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
        if on_done is not None:
            on_done(list(enumerate(trajs)))
        return trajs
    times.scorer += time.perf_counter() - t0
    policy.reset(tasks)
    alive = list(range(len(tasks)))
    for turn in range(max_turns):
        if not alive:
            break
        t0 = time.perf_counter()
        with torch.no_grad():
            actions, log_probs = policy.act([obs[i] for i in alive], generator=generator, greedy=greedy)
        times.generation += time.perf_counter() - t0
        batch: list = [None] * len(tasks)
        acted = {}
        for i, a, lp in zip(alive, actions, log_probs):
            batch[i] = a
            acted[i] = (a, float(lp))
        last = turn == max_turns - 1
        still: list[int] = []

        def record(i: int, tr: Transition | None) -> bool:
            """Append episode i's transition; whether that ended it."""
            tr = tr or Transition(None, None, True, info={"status": "infra", "error": "no transition"})
            a, lp = acted.pop(i)
            traj = trajs[i]
            traj.observations.append(obs[i])
            traj.actions.append(a)
            traj.log_probs.append(lp)
            traj.step_rewards.append(tr.reward)
            traj.step_reward_vars.append(tr.reward_var)
            # out of turns: a judged attempt that did not finish, not a failure of the scorer
            traj.infos.append(tr.info if tr.done or not last else {**tr.info, "status": "truncated"})
            obs[i] = tr.observation
            if not tr.done and not last:
                still.append(i)
                return False
            return True

        t0 = time.perf_counter()
        arrivals, error = _arrivals(env, batch), "the scorer gave no transition for this episode"
        while acted:
            try:
                arrived = next(arrivals, None)
                if arrived is None:
                    break
                arrived = [(i, tr) for i, tr in arrived if i in acted]  # each live episode once
            except Exception as exc:
                log.warning("%s step failed: %r; %d live episodes get an unknown grade", source, exc, len(acted))
                error = repr(exc)
                break
            ended = [(i, trajs[i]) for i, tr in arrived if record(i, tr)]
            if ended and on_done is not None:
                on_done(ended)
        failed = Transition(None, None, True, info={"status": "infra", "error": error})
        ended = [(i, trajs[i]) for i in list(acted) if record(i, failed)]
        if ended and on_done is not None:
            on_done(ended)
        times.scorer += time.perf_counter() - t0
        alive = sorted(still)
    return trajs


def _arrivals(env: RealEnv | WorldModel, batch: list) -> Iterator[list[tuple[int, Transition | None]]]:
    """A real environment's transitions as they finish; a world model's in one list."""
    if isinstance(env, RealEnv):
        yield from env.step_each(batch)
        return
    results = list(env.step(batch))
    if len(results) != len(batch):
        raise RuntimeError(f"step returned {len(results)} transitions for {len(batch)} episodes")
    yield list(enumerate(results))


def wm_prediction(traj: Trajectory) -> Prediction:
    """The world model's grade of an episode it simulated: summed means and variances."""
    mean = sum_or_none(traj.step_rewards) if traj.step_rewards else None
    if mean is None:
        err = next((i.get("error") for i in traj.infos if i.get("error")), "world model gave no reward")
        return Prediction(None, error=str(err))
    return Prediction.checked(mean, sum_or_none(traj.step_reward_vars))
