"""Core hooks the embodied domain needs: episode-start reset, truncation, micro-batched updates."""

from __future__ import annotations

import torch

from wmrl.api import build_trainer
from wmrl.config import load_config
from wmrl.core.interfaces import Policy, RealEnv
from wmrl.core.rollout import rollout
from wmrl.core.types import GRADED_STATUSES, Task, Transition


class CountingPolicy(Policy):
    """Acts 0.0 and records when episodes start relative to its actions."""

    def __init__(self) -> None:
        self.module = torch.nn.Linear(1, 1)
        self.events: list = []

    def act(self, observations, *, generator=None, greedy=False):
        self.events.append(("act", len(observations)))
        return [0.0] * len(observations), [0.0] * len(observations)

    def log_prob(self, observations, actions):
        return torch.zeros(len(actions))

    def reset(self, tasks):
        self.events.append(("reset", [t.id for t in tasks]))


class EndlessEnv(RealEnv):
    """Never ends an episode; ends episode 'short' after one step."""

    def reset(self, tasks):
        self.ids = [t.id for t in tasks]
        return [0] * len(tasks)

    def step(self, actions):
        return [None if a is None else Transition(0, 0.0, self.ids[i] == "short", info={"status": "ok"})
                for i, a in enumerate(actions)]


def test_rollout_resets_the_policy_at_episode_start_and_marks_truncation():
    policy, env = CountingPolicy(), EndlessEnv()
    tasks = [Task("short", seed=3), Task("long", seed=4)]
    trajs = rollout(policy, env, tasks, source="real", max_turns=3)
    assert policy.events[0] == ("reset", ["short", "long"])
    assert [e for e in policy.events if e[0] == "reset"] == [policy.events[0]]  # once per rollout
    assert policy.events[1:] == [("act", 2), ("act", 1), ("act", 1)]
    short, long = (env.outcome(t) for t in trajs)
    assert short.status == "ok" and long.status == "truncated"
    assert long.known and long.reward == 0.0 and "truncated" in GRADED_STATUSES
    assert tasks[0].seed == 3 and Task("x").seed is None


def _control(run_dir, micro_batch: int):
    over = [f"run_dir={run_dir}", "trainer.steps=2", "trainer.eval_every=0", "trainer.eval_samples=1",
            "trainer.groups_per_step=3", "trainer.group_size=4", "trainer.ppo_epochs=2",
            f"trainer.micro_batch={micro_batch}", "tensorboard=false", "estimator.mode=real"]
    return load_config("synthetic-control", over)


def test_micro_batched_updates_train_like_one_batch(tmp_path):
    weights = []
    for mb in (0, 7):  # 7 turns per log_prob call: shares cut through episodes
        trainer = build_trainer(_control(tmp_path / f"mb{mb}", mb))
        start = [p.detach().clone() for p in trainer.policy.module.parameters()]
        trainer.train()
        weights.append([p.detach().clone() for p in trainer.policy.module.parameters()])
        trainer.close()
    assert any(not torch.allclose(a, b) for a, b in zip(start, weights[1])), "no update happened"
    for a, b in zip(*weights):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
