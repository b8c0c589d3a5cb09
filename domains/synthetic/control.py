"""Multi-step synthetic domain: steer a point mass to a goal in a small numpy dynamical system.

It stands in for the embodied (VLA) shape: many actions per episode, a success
reward at the end, and a world model that is a *model of the dynamics* the
policy is rolled out inside, so WM-graded groups see simulated observations.

Real dynamics (per step, dt fixed): v <- (1 - drag) v + gain * a * dt,
x <- x + v dt, with the action a clipped to [-1, 1]^2, drawn from a Gaussian
policy. The episode's reward (at its last step) is 1 within `tol` of the goal,
else 0.5 * max(0, 1 - d_final / d_start), so failures still carry a signal.

The world model `perturbed-dynamics` (keys in `PerturbedConfig`) perturbs the
dynamics (`gain_error`, `drag_error`), bends its reward monotonically
(r -> r**shape), overrates arriving fast (`speed_bonus` * final speed, a
reordering bias a WM-only policy exploits by overshooting), and adds noise
whose std grows with speed (`noise_hetero`), reported as the variance.
`latent-dynamics` learns the dynamics instead (`world_models/latent.py`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from wmrl.core.domain import Domain
from wmrl.core.interfaces import Policy, RealEnv, WorldModel
from wmrl.core.registry import DOMAINS
from wmrl.core.types import SPLITS, Task, Trajectory, Transition
from wmrl.core.validation import at_least
from wmrl.core.wm_spec import WorldModelConfig, register_world_model
from wmrl.domains.synthetic.common import DistortionConfig, ExecutionCost, seeded_mlp


@dataclass
class ControlConfig:
    name: str = "synthetic-control"
    horizon: int = 12
    dt: float = 0.25
    gain: float = 1.0
    drag: float = 0.2
    tol: float = 0.15
    n_train: int = 32
    n_test_id: int = 16
    n_test_ood: int = 16
    n_validation: int = 16
    seed: int = 0
    hidden: int = 32
    init_log_std: float = -0.5
    real_delay_s: float = 0.0
    real_capacity: int = 4
    ledger: str | None = None

    def validate(self) -> None:
        ExecutionCost.check(self.real_delay_s, self.real_capacity)
        at_least(self, "domain", 1, "horizon", "n_train", "hidden")
        if not (self.dt > 0 and self.tol > 0):
            raise ValueError("domain.dt and domain.tol must be > 0")


@dataclass
class PerturbedConfig(DistortionConfig):
    """`perturbed-dynamics`: the real dynamics with errors, the reward bent, a speed bonus; noisier when fast."""

    gain_error: float = 0.0
    drag_error: float = 0.0
    speed_bonus: float = 0.0


@dataclass
class LatentConfig(WorldModelConfig):
    """`latent-dynamics`: a learned latent-dynamics ensemble (`world_models/latent.py`), fitted on anchors."""

    members: int = 5
    latent_dim: int = 16
    hidden: int = 32
    epochs: int = 150
    refit_epochs: int = 50
    lr: float = 1e-2
    window: int = 2048

    def validate(self) -> None:
        at_least(self, "world_model", 1, "members", "latent_dim", "hidden", "epochs", "refit_epochs", "window")
        if not self.lr > 0:
            raise ValueError(f"world_model.lr must be > 0, got {self.lr!r}")


def _tasks(cfg: ControlConfig, split: str) -> list[Task]:
    n = {"train": cfg.n_train, "test_id": cfg.n_test_id, "test_ood": cfg.n_test_ood,
         "validation": cfg.n_validation}[split]
    rng = np.random.default_rng([cfg.seed, 5, SPLITS.index(split)])
    angle = rng.uniform(0, 2 * np.pi, n)
    # in-distribution goals lie 0.5-1.0 away; OOD goals 1.2-1.5 away (never trained on)
    radius = rng.uniform(1.2, 1.5, n) if split == "test_ood" else rng.uniform(0.5, 1.0, n)
    goals = np.stack([radius * np.cos(angle), radius * np.sin(angle)], 1)
    return [Task(f"{split}-{i}", split, goals[i]) for i in range(n)]


class PointMass:
    """Batched point-mass dynamics; the real env and the world model differ only in constants."""

    def __init__(self, cfg: ControlConfig, gain: float, drag: float):
        self.cfg, self.gain, self.drag = cfg, gain, drag
        self.goal = np.zeros((0, 2))
        self.x = np.zeros((0, 2))
        self.v = np.zeros((0, 2))
        self.t = np.zeros(0, dtype=int)

    def reset(self, goals: np.ndarray) -> list[np.ndarray]:
        self.goal = np.asarray(goals, float).reshape(-1, 2)
        self.x = np.zeros_like(self.goal)
        self.v = np.zeros_like(self.goal)
        self.t = np.zeros(len(self.goal), dtype=int)
        return [self.obs(i) for i in range(len(self.goal))]

    def obs(self, i: int) -> np.ndarray:
        return np.concatenate([self.goal[i] - self.x[i], self.v[i]]).astype(np.float32)

    def advance(self, i: int, action: np.ndarray) -> bool:
        a = np.clip(np.asarray(action, float), -1.0, 1.0)
        self.v[i] = (1 - self.drag) * self.v[i] + self.gain * a * self.cfg.dt
        self.x[i] = self.x[i] + self.v[i] * self.cfg.dt
        self.t[i] += 1
        return self.t[i] >= self.cfg.horizon

    def success_reward(self, i: int) -> float:
        d = float(np.linalg.norm(self.goal[i] - self.x[i]))
        if d < self.cfg.tol:
            return 1.0
        return 0.5 * max(0.0, 1.0 - d / float(np.linalg.norm(self.goal[i])))


class ControlEnv(RealEnv):
    def __init__(self, cfg: ControlConfig):
        self.sim = PointMass(cfg, cfg.gain, cfg.drag)
        self.cost = ExecutionCost(cfg.real_delay_s, cfg.real_capacity, cfg.ledger)
        self.capacity = cfg.real_capacity
        self._ids: list[str] = []

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        self._ids = [t.id for t in tasks]
        return self.sim.reset(np.array([t.payload for t in tasks]))

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        live = [i for i, a in enumerate(actions) if a is not None]
        self.cost.pay([f"{self._ids[i]}@{self.sim.t[i]}" for i in live])
        out: list[Transition | None] = [None] * len(actions)
        for i in live:
            done = self.sim.advance(i, actions[i])
            out[i] = Transition(self.sim.obs(i), self.sim.success_reward(i) if done else 0.0, done, info={"status": "ok"})
        return out


class ControlWorldModel(WorldModel):
    """Its noise is a function of the episode (task and final state), so resume is exact."""

    def __init__(self, cfg: ControlConfig, wm: PerturbedConfig):
        self.cfg, self.wm = cfg, wm
        self.sim = PointMass(cfg, cfg.gain * (1 + wm.gain_error), cfg.drag + wm.drag_error)
        self._ids: list[str] = []

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        self._ids = [t.id for t in tasks]
        return self.sim.reset(np.array([t.payload for t in tasks]))

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        c, w = self.cfg, self.wm
        out: list[Transition | None] = [None] * len(actions)
        for i, a in enumerate(actions):
            if a is None:
                continue
            if not self.sim.advance(i, a):
                out[i] = Transition(self.sim.obs(i), 0.0, False, reward_var=0.0)
                continue
            speed = float(np.linalg.norm(self.sim.v[i]))
            std = w.noise + w.noise_hetero * speed
            r = self.sim.success_reward(i) ** w.shape + w.speed_bonus * min(speed, 1.0)
            key = zlib.crc32(self._ids[i].encode() + self.sim.x[i].tobytes())
            r = float(np.clip(r + std * np.random.default_rng([c.seed, 6, key]).normal(), 0.0, 1.0))
            out[i] = Transition(self.sim.obs(i), r, True, reward_var=std**2)
        return out


class GaussianPolicy(Policy):
    """Gaussian over actions (the dynamics clip them to [-1, 1]); a state-independent log-std."""

    def __init__(self, cfg: ControlConfig, seed: int):
        self.module = nn.ModuleDict(
            {
                "mean": seeded_mlp([4, cfg.hidden, 2], seed),
                "log_std": nn.ParameterList([nn.Parameter(torch.full((2,), cfg.init_log_std))]),
            }
        )

    def _dist(self, observations) -> torch.distributions.Normal:
        x = torch.as_tensor(np.stack(observations), dtype=torch.float32)
        return torch.distributions.Normal(self.module["mean"](x), self.module["log_std"][0].exp())

    def act(self, observations, *, generator=None, greedy=False):
        d = self._dist(observations)
        a = d.mean if greedy else d.mean + d.stddev * torch.randn(d.mean.shape, generator=generator)
        return [row.numpy() for row in a], d.log_prob(a).sum(-1).tolist()

    def log_prob(self, observations, actions) -> torch.Tensor:
        a = torch.as_tensor(np.stack(actions), dtype=torch.float32)
        return self._dist(observations).log_prob(a).sum(-1)


@DOMAINS.register("synthetic-control")
class ControlDomain(Domain):
    config_class = ControlConfig
    default_world_model = "perturbed-dynamics"

    def __init__(self, cfg: ControlConfig):
        super().__init__(cfg)
        self.max_turns = cfg.horizon

    def tasks(self, split: str) -> list[Task]:
        return _tasks(self.cfg, split)

    def make_policy(self, seed: int) -> Policy:
        return GaussianPolicy(self.cfg, seed)

    def make_real_env(self) -> RealEnv:
        return ControlEnv(self.cfg)

    def oracle_reward(self, trajectory: Trajectory) -> float | None:
        """Replay the actions open-loop in the real dynamics (free here, expensive for real)."""
        if not trajectory.actions:
            return None
        sim = PointMass(self.cfg, self.cfg.gain, self.cfg.drag)
        sim.reset(np.array([trajectory.task.payload]))
        for a in trajectory.actions:
            sim.advance(0, a)
        return sim.success_reward(0)


@register_world_model("perturbed-dynamics", domains=["synthetic-control"], config=PerturbedConfig)
def _perturbed(domain: ControlDomain, wm: PerturbedConfig) -> WorldModel:
    """The real dynamics with the configured errors, bias and noise."""
    return ControlWorldModel(domain.cfg, wm)


@register_world_model("latent-dynamics", domains=["synthetic-control"], config=LatentConfig)
def _latent(domain: ControlDomain, wm: LatentConfig) -> WorldModel:
    """A learned latent-dynamics ensemble, fitted online on the real anchor episodes."""
    from wmrl.world_models.latent import LatentDynamicsEnsemble, LatentWorldModel

    cfg = domain.cfg

    def first(tasks: Sequence[Task]) -> list[np.ndarray]:
        return PointMass(cfg, cfg.gain, cfg.drag).reset(np.array([t.payload for t in tasks]))

    model = LatentDynamicsEnsemble(obs_dim=4, action_dim=2, members=wm.members, latent_dim=wm.latent_dim,
                                   hidden=wm.hidden, epochs=wm.epochs, refit_epochs=wm.refit_epochs, lr=wm.lr,
                                   window=wm.window, seed=cfg.seed)
    return LatentWorldModel(model, first, cfg.horizon)
