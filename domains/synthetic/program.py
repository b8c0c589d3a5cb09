"""One-shot synthetic domain: write a "program" (a choice per slot), get it graded once.

It stands in for the AutoResearch shape -- one action, one expensive grade -- with
a known true reward, so tests and benchmarks can check what WMRL's corrections
actually buy. A task is a feature vector phi; option m of slot k is worth
v[k, m] = sigmoid(2 phi . U[k, m]) and a program's true reward is the mean worth
of its choices, in (0, 1). Held-out OOD tasks draw phi from a shifted
distribution the policy never trains on.

The world model (`world_model.type=program-distorted`, keys in
`DistortedConfig`) scores with the three failure modes the method is about,
each controllable:
- a non-affine monotone distortion r -> r**shape (GRPO's standardization
  cancels affine maps, not this);
- a *reordering* bias: each slot has a "hack" option the world model overrates
  by `hack`/n_slots, so it prefers worse programs (a policy trained on it
  alone learns the hacks);
- heteroscedastic noise: std `noise` plus `noise_hetero` times the share
  of "exotic" choices (the upper half of options), reported as the variance.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from wmrl.core.domain import Domain
from wmrl.core.interfaces import Policy, RealEnv, WorldModel, gather_steps
from wmrl.core.registry import DOMAINS
from wmrl.core.types import SPLITS, Task, Trajectory, Transition
from wmrl.core.validation import at_least
from wmrl.core.wm_spec import register_world_model
from wmrl.domains.synthetic.common import DistortionConfig, ExecutionCost, seeded_mlp


@dataclass
class ProgramConfig:
    name: str = "synthetic-program"
    n_slots: int = 4
    n_choices: int = 6
    feature_dim: int = 8
    n_train: int = 32
    n_test_id: int = 16
    n_test_ood: int = 16
    n_validation: int = 16
    ood_shift: float = 1.5
    seed: int = 0
    hidden: int = 32
    real_delay_s: float = 0.0
    real_capacity: int = 4
    ledger: str | None = None

    def validate(self) -> None:
        ExecutionCost.check(self.real_delay_s, self.real_capacity)
        at_least(self, "domain", 1, "n_slots", "n_choices", "feature_dim", "n_train", "hidden")


@dataclass
class DistortedConfig(DistortionConfig):
    """`program-distorted`: the true reward bent, with a reordering hack; noisier on exotic programs."""

    hack: float = 0.0


class ProgramWorld:
    """The ground truth shared by the real env and (distorted) the world model."""

    def __init__(self, cfg: ProgramConfig):
        self.cfg = cfg
        rng = np.random.default_rng([cfg.seed, 1])
        self.U = rng.normal(size=(cfg.n_slots, cfg.n_choices, cfg.feature_dim)) / np.sqrt(cfg.feature_dim)
        # the hack option per slot: one that is worse than average over training-like tasks
        phis = rng.normal(size=(256, cfg.feature_dim))
        mean_worth = self._worth(phis).mean(axis=0)  # [K, M]
        self.hack = np.argsort(mean_worth, axis=1)[:, cfg.n_choices // 3]

    def _worth(self, phi: np.ndarray) -> np.ndarray:
        z = np.einsum("kmd,nd->nkm", self.U, np.atleast_2d(phi))
        return 1.0 / (1.0 + np.exp(-2.0 * z))

    def reward(self, phi: np.ndarray, action: np.ndarray) -> float:
        worth = self._worth(phi)[0]
        return float(worth[np.arange(self.cfg.n_slots), action].mean())

    def tasks(self, split: str) -> list[Task]:
        cfg = self.cfg
        n = {"train": cfg.n_train, "test_id": cfg.n_test_id, "test_ood": cfg.n_test_ood,
         "validation": cfg.n_validation}[split]
        rng = np.random.default_rng([cfg.seed, 2, SPLITS.index(split)])
        phi = rng.normal(size=(n, cfg.feature_dim))
        if split == "test_ood":
            phi[:, : cfg.feature_dim // 2] += cfg.ood_shift
        return [Task(f"{split}-{i}", split, phi[i].astype(np.float32)) for i in range(n)]


class ProgramEnv(RealEnv):
    def __init__(self, world: ProgramWorld):
        self.world = world
        c = world.cfg
        self.cost = ExecutionCost(c.real_delay_s, c.real_capacity, c.ledger)
        self.capacity = c.real_capacity
        self._tasks: list[Task] = []

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        self._tasks = list(tasks)
        return [t.payload for t in self._tasks]

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        return gather_steps(self.step_each(actions), len(actions))

    def step_each(self, actions: Sequence[Any | None]) -> Iterator[list[tuple[int, Transition]]]:
        """`capacity` executions at a time, each wave reported when it finishes (as a pool would)."""
        live = [i for i, a in enumerate(actions) if a is not None]
        for w in range(0, len(live), self.capacity):
            wave = live[w : w + self.capacity]
            self.cost.pay([f"{self._tasks[i].id}:{','.join(map(str, actions[i]))}" for i in wave])
            yield [(i, Transition(None, self.world.reward(self._tasks[i].payload, np.asarray(actions[i])), True,
                                  info={"status": "ok"})) for i in wave]


class ProgramWorldModel(WorldModel):
    """Deterministic per (task, program), like a world model decoding greedily: resume is exact."""

    def __init__(self, world: ProgramWorld, cfg: DistortedConfig):
        self.world, self.cfg = world, cfg
        self._tasks: list[Task] = []

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        self._tasks = list(tasks)
        return [t.payload for t in self._tasks]

    def score(self, task: Task, action: np.ndarray) -> tuple[float, float]:
        c, w = self.cfg, self.world.cfg
        r = self.world.reward(task.payload, action)
        hacked = float(np.mean(action == self.world.hack))
        exotic = float(np.mean(action >= w.n_choices // 2))
        std = c.noise + c.noise_hetero * exotic
        noise = np.random.default_rng([w.seed, 3, zlib.crc32(task.id.encode()), *action.tolist()]).normal()
        mean = r**c.shape + c.hack * hacked + std * noise
        return float(np.clip(mean, 0.0, 1.0)), std**2

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        out: list[Transition | None] = [None] * len(actions)
        for i, a in enumerate(actions):
            if a is not None:
                m, v = self.score(self._tasks[i], np.asarray(a))
                out[i] = Transition(None, m, True, reward_var=v)
        return out


class ProgramPolicy(Policy):
    """Independent categorical per slot, conditioned on the task features."""

    def __init__(self, cfg: ProgramConfig, seed: int):
        self.K, self.M = cfg.n_slots, cfg.n_choices
        self.module = seeded_mlp([cfg.feature_dim, cfg.hidden, self.K * self.M], seed)

    def _logits(self, observations: Sequence[Any]) -> torch.Tensor:
        x = torch.as_tensor(np.stack(observations), dtype=torch.float32)
        return self.module(x).view(-1, self.K, self.M)

    def act(self, observations, *, generator=None, greedy=False):
        logits = self._logits(observations)
        logp = torch.log_softmax(logits, -1)
        if greedy:
            a = logits.argmax(-1)
        else:
            a = torch.multinomial(logp.exp().view(-1, self.M), 1, generator=generator).view(-1, self.K)
        lp = logp.gather(-1, a.unsqueeze(-1)).squeeze(-1).sum(-1)
        return [row.numpy() for row in a], lp.tolist()

    def log_prob(self, observations, actions) -> torch.Tensor:
        logp = torch.log_softmax(self._logits(observations), -1)
        a = torch.as_tensor(np.stack(actions), dtype=torch.long)
        return logp.gather(-1, a.unsqueeze(-1)).squeeze(-1).sum(-1)


@DOMAINS.register("synthetic-program")
class ProgramDomain(Domain):
    config_class = ProgramConfig
    default_world_model = "program-distorted"
    max_turns = 1

    def __init__(self, cfg: ProgramConfig):
        super().__init__(cfg)
        self.world = ProgramWorld(cfg)

    def tasks(self, split: str) -> list[Task]:
        return self.world.tasks(split)

    def make_policy(self, seed: int) -> Policy:
        return ProgramPolicy(self.cfg, seed)

    def make_real_env(self) -> RealEnv:
        return ProgramEnv(self.world)

    def oracle_reward(self, trajectory: Trajectory) -> float | None:
        if not trajectory.actions:
            return None
        return self.world.reward(trajectory.task.payload, np.asarray(trajectory.actions[-1]))


@register_world_model("program-distorted", domains=["synthetic-program"], config=DistortedConfig)
def _distorted(domain: ProgramDomain, cfg: DistortedConfig) -> WorldModel:
    """The true reward bent by the configured biases and noise."""
    return ProgramWorldModel(domain.world, cfg)
