"""A latent-dynamics world model: a policy is rolled out *inside* it, step by step.

Why this shape. For a multi-step (embodied) agent the world model must stand in
for the environment in the same rollout loop: give the policy an observation
after each action and a reward with a variance at the end. So each of M members
is a small world of its own: an encoder obs -> z (used once, on the real first
observation), a residual transition (z, a) -> z' (so "nothing changes" is the
easy default), a decoder z -> obs (what the policy sees) and a reward head
z -> r for the episode's terminal reward.

Why it is trained open-loop. Inside a WM rollout the model never sees another
real observation after the first, so training does exactly that: encode the
first observation, step the latent with the episode's real actions, and score
every decoded observation and the final reward against the real ones (MSE,
backpropagated through the whole episode). One-step training would look better
on paper and drift in use. Observations and actions are standardised (they
are dense, low-dimensional states); the reward loss is divided by the rewards'
variance so neither term dominates whatever the units.

Why the variance is what it is. Members differ by init seed and bootstrap
resample of episodes; each steps its own latent, the policy sees the
member-mean decoded observation, and the reward variance is the members'
disagreement on the final reward plus a noise floor: the members' mean squared
error on the episodes their bootstrap left out (an honest residual, not the
training fit). Each `fit` continues from the current weights on the episode
window, so calling it once per training step is cheap and converges over steps.

Episodes that end early on success (a robot task ends the moment it is solved)
need the model to say *when* an imagined episode ends. With `success_head` the
reward head is scored after every action -- 0 before the episode's last action,
the episode's reward after it -- so it reads as "solved by now", and an imagined
episode ends where the member mean crosses `success_threshold`, as a real one
ends at success.

`LatentWorldModel` wraps the ensemble as a `WorldModel` for any domain whose
reward comes at the last step. Observations reach the ensemble as numeric
vectors through an `ObservationCodec` (identity by default: the synthetic
control domain, which registers it as `latent-dynamics`, has vector
observations; the VLA domain's codec turns camera images into its policy's
frozen camera features, `domains/vla/world_model.py`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from wmrl.core.interfaces import WorldModel
from wmrl.core.types import Prediction, Task, Trajectory, Transition

Params = dict[str, torch.Tensor]

#: each member's networks: encoder, transition, decoder, reward head
_NETS = ("enc", "trans", "dec", "rew")


def _mlp(params: Params, name: str, x: torch.Tensor) -> torch.Tensor:
    """One member-batched 2-layer MLP: x [members, rows, in] -> [members, rows, out]."""
    h = F.silu(torch.bmm(x, params[f"{name}.W1"]) + params[f"{name}.b1"][:, None])
    return torch.bmm(h, params[f"{name}.W2"]) + params[f"{name}.b2"][:, None]


class LatentDynamicsEnsemble:
    def __init__(self, obs_dim: int, action_dim: int, members: int = 5, latent_dim: int = 16, hidden: int = 32,
                 epochs: int = 150, refit_epochs: int = 50, batch_episodes: int = 256, lr: float = 1e-2,
                 weight_decay: float = 1e-4, window: int = 2048, seed: int = 0, success_head: bool = False):
        if members < 2:
            raise ValueError("LatentDynamicsEnsemble needs members >= 2 (their disagreement is the variance)")
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.members, self.latent_dim, self.hidden = members, latent_dim, hidden
        self.epochs, self.refit_epochs, self.batch_episodes = epochs, refit_epochs, batch_episodes
        self.lr, self.weight_decay = lr, weight_decay
        self.window, self.seed = window, seed
        self.success_head = success_head
        self._episodes: list[tuple[np.ndarray, np.ndarray, float]] = []
        self._params: Params | None = None
        self._norm: dict[str, np.ndarray] = {}
        self._noise = 0.0
        self._fits = 0

    # ------------------------------------------------------------------ data
    @property
    def n(self) -> int:
        """Episodes in the window."""
        return len(self._episodes)

    @property
    def fitted(self) -> bool:
        return self._params is not None

    def add_episode(self, observations: np.ndarray, actions: np.ndarray, reward: float) -> None:
        """One real episode: the observation before each action ([T, obs], optionally the final
        one too), the actions taken ([T, action]) and the terminal reward after the last."""
        obs = np.asarray(observations, np.float32).reshape(-1, self.obs_dim)
        act = np.asarray(actions, np.float32).reshape(-1, self.action_dim)
        if len(act) < 1 or len(obs) not in (len(act), len(act) + 1):
            raise ValueError(f"an episode needs T >= 1 actions and T or T+1 observations; got {len(act)}, {len(obs)}")
        self._episodes.append((obs, act, float(reward)))
        self._episodes = self._episodes[-self.window :]

    # ------------------------------------------------------------------ fitting
    def _init(self) -> Params:
        d, a, L, H = self.obs_dim, self.action_dim, self.latent_dim, self.hidden
        sizes = {"enc": (d, L), "trans": (L + a, L), "dec": (L, d), "rew": (2 * L, 1)}
        per: dict[str, list[torch.Tensor]] = {}
        for m in range(self.members):  # each member its own seed: diverse inits feed the disagreement
            g = torch.Generator().manual_seed(self.seed * 1009 + m)
            for name in _NETS:
                n_in, n_out = sizes[name]
                layers = (("W1", (n_in, H), n_in), ("b1", (H,), n_in), ("W2", (H, n_out), H), ("b2", (n_out,), H))
                for key, shape, fan in layers:
                    w = (torch.rand(shape, generator=g) * 2 - 1) / math.sqrt(fan)
                    per.setdefault(f"{name}.{key}", []).append(w)
        params = {k: torch.stack(v) for k, v in per.items()}
        # the transition's first layer in two blocks, so the action part is one product per episode
        params["trans.Wz"], params["trans.Wa"] = params["trans.W1"][:, :L], params.pop("trans.W1")[:, L:]
        params["trans.W2"] *= 0.1  # a near-identity transition to start from
        params["trans.b2"].zero_()
        return params

    def _batch(self, episodes) -> dict[str, torch.Tensor]:
        """Pad episodes to the longest and standardise with the window's statistics."""
        T = max(len(a) for _, a, _ in episodes)
        N = len(episodes)
        obs = np.zeros((N, T, self.obs_dim), np.float32)
        act = np.zeros((N, T, self.action_dim), np.float32)
        obs_mask = np.zeros((N, T), np.float32)
        act_mask = np.zeros((N, T), np.float32)
        for i, (o, a, _) in enumerate(episodes):
            k = min(len(o), T)  # a final observation past the last action has no latent to score
            obs[i, :k], obs_mask[i, :k] = o[:k], 1.0
            act[i, : len(a)], act_mask[i, : len(a)] = a, 1.0
        n = self._norm
        return {
            "obs": torch.as_tensor((obs - n["obs_mu"]) / n["obs_sd"]) * torch.as_tensor(obs_mask)[..., None],
            "act": torch.as_tensor((act - n["act_mu"]) / n["act_sd"]) * torch.as_tensor(act_mask)[..., None],
            "obs_mask": torch.as_tensor(obs_mask),
            "act_mask": torch.as_tensor(act_mask),
            "reward": torch.as_tensor(np.array([r for _, _, r in episodes], np.float32)),
        }

    def _normalisers(self) -> dict[str, np.ndarray]:
        obs = np.concatenate([o for o, _, _ in self._episodes])
        act = np.concatenate([a for _, a, _ in self._episodes])
        rew = np.array([r for _, _, r in self._episodes])
        return {
            "obs_mu": obs.mean(0), "obs_sd": obs.std(0) + 1e-3,
            "act_mu": act.mean(0), "act_sd": act.std(0) + 1e-3,
            "reward_var": np.array(max(float(rew.var()), 1e-3)),  # scales the reward loss
        }

    def _transition(self, params: Params, z: torch.Tensor, a_proj: torch.Tensor) -> torch.Tensor:
        """z' = z + f(z, a), with the action's first-layer product `a_proj` computed by the caller."""
        h = F.silu(torch.bmm(z, params["trans.Wz"]) + a_proj + params["trans.b1"][:, None])
        return z + torch.bmm(h, params["trans.W2"]) + params["trans.b2"][:, None]

    def _reward(self, params: Params, z0: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # the start latent is an input: success is judged against the task (the goal), which
        # the first observation holds, and the final latent need not carry it
        return torch.sigmoid(_mlp(params, "rew", torch.cat([z0, z], -1))[..., 0])

    def _unroll(self, params: Params, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per member and episode: mean squared observation error, the reward loss (in units of the
        rewards' variance) and the predicted reward after the episode's last action."""
        M = self.members
        N, T, _ = b["obs"].shape
        z0 = _mlp(params, "enc", b["obs"][:, 0].expand(M, N, -1))
        a_proj = torch.einsum("nta,mah->mnth", b["act"], params["trans.Wa"])
        ragged = bool((b["act_mask"] < 1).any())
        z, zs = z0, []
        for t in range(T):
            zs.append(z)
            nxt = self._transition(params, z, a_proj[:, :, t])
            z = torch.where(b["act_mask"][:, t, None].bool(), nxt, z) if ragged else nxt  # shorter episodes stop
        latents = torch.stack(zs, 2)  # [M, N, T, L]: the latent before each action
        decoded = _mlp(params, "dec", latents.view(M, N * T, -1)).view(M, N, T, -1)
        sq = ((decoded - b["obs"]) ** 2).mean(-1) * b["obs_mask"]
        obs_err = sq.sum(-1) / b["obs_mask"].sum(1)
        reward_var = float(self._norm["reward_var"])
        if not self.success_head:
            r_final = self._reward(params, z0, z)
            return obs_err, (r_final - b["reward"]) ** 2 / reward_var, r_final
        # after action t the latent is latents[t + 1] (the final z after the last); "solved by now" at every step
        after = torch.cat([latents[:, :, 1:], z[:, :, None]], 2)
        r_steps = self._reward(params, z0[:, :, None].expand(-1, -1, T, -1).reshape(M, N * T, -1),
                               after.reshape(M, N * T, -1)).view(M, N, T)
        last = (b["act_mask"].sum(1).long() - 1).clamp(min=0)
        target = torch.zeros_like(b["act_mask"])
        target[torch.arange(N), last] = b["reward"]
        steps = ((r_steps - target) ** 2 * b["act_mask"]).sum(-1)
        return obs_err, steps / reward_var, r_steps.gather(2, last.expand(M, -1)[..., None])[..., 0]

    def fit(self) -> None:
        """Train on the episode window: `epochs` steps from a fresh init the first time,
        `refit_epochs` from the current weights after that. Each step sees at most
        `batch_episodes` episodes, so a fit costs the same however full the window is."""
        if self.n < 2:
            return
        self._norm = self._normalisers()
        b = self._batch(self._episodes)
        self._fits += 1
        rng = np.random.default_rng([self.seed, self._fits])
        N = self.n
        counts = np.stack([np.bincount(rng.integers(0, N, N), minlength=N) for _ in range(self.members)])
        w = torch.as_tensor(counts, dtype=torch.float32)  # bootstrap multiplicities [members, episodes]
        start = self._params if self._params is not None else self._init()
        epochs = self.epochs if self._params is None else self.refit_epochs
        params = {k: v.clone().requires_grad_() for k, v in start.items()}
        opt = torch.optim.AdamW(params.values(), lr=self.lr, weight_decay=self.weight_decay, fused=True)
        for _ in range(epochs):
            if N > self.batch_episodes:
                rows = torch.as_tensor(np.sort(rng.choice(N, self.batch_episodes, replace=False)))
                mb, wb = {k: v[rows] for k, v in b.items()}, w[:, rows]
            else:
                mb, wb = b, w
            obs_err, reward_err, _ = self._unroll(params, mb)
            loss = (wb * (obs_err + reward_err)).sum() / len(mb["reward"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if epochs and not torch.isfinite(loss):
            raise FloatingPointError(f"LatentDynamicsEnsemble fit diverged (loss {float(loss)}); lower lr")
        self._params = {k: v.detach().clone() for k, v in params.items()}
        with torch.no_grad():
            _, _, r_hat = self._unroll(self._params, b)
        sq = (r_hat - b["reward"]).double() ** 2  # [members, episodes]
        out_of_bag = torch.as_tensor(counts == 0)
        per_member = [sq[m][out_of_bag[m]].mean() if out_of_bag[m].any() else sq[m].mean() for m in range(self.members)]
        self._noise = max(float(torch.stack(per_member).mean()), 1e-4)

    # ------------------------------------------------------------------ rolling out
    def _need_fit(self) -> Params:
        if self._params is None:
            raise RuntimeError("LatentDynamicsEnsemble has not been fit yet (call fit with >= 2 episodes)")
        return self._params

    def encode(self, observations: np.ndarray) -> torch.Tensor:
        """Each member's latent for a batch of real observations: [members, batch, latent]."""
        p, n = self._need_fit(), self._norm
        obs = np.asarray(observations, np.float32).reshape(-1, self.obs_dim)
        x = torch.as_tensor((obs - n["obs_mu"]) / n["obs_sd"])
        with torch.no_grad():
            return _mlp(p, "enc", x.expand(self.members, -1, -1))

    def step(self, z: torch.Tensor, actions: np.ndarray) -> torch.Tensor:
        """Each member advances its own latent by the same actions ([batch, action])."""
        p, n = self._need_fit(), self._norm
        a = torch.as_tensor((np.asarray(actions, np.float32).reshape(-1, self.action_dim) - n["act_mu"]) / n["act_sd"])
        with torch.no_grad():
            return self._transition(p, z, torch.bmm(a.expand(self.members, -1, -1), p["trans.Wa"]))

    def observe(self, z: torch.Tensor) -> np.ndarray:
        """The member-mean decoded observation, in the observation's own units: [batch, obs]."""
        p, n = self._need_fit(), self._norm
        with torch.no_grad():
            obs = _mlp(p, "dec", z).mean(0).numpy()
        return (obs * n["obs_sd"] + n["obs_mu"]).astype(np.float32)

    def reward(self, z0: torch.Tensor, z: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Terminal reward mean and variance (member disagreement + out-of-bag noise floor),
        from the episode's first latent `z0` (what `encode` gave) and its final one."""
        p = self._need_fit()
        with torch.no_grad():
            r = self._reward(p, z0, z).double()
        return r.mean(0).numpy(), (r.var(0, unbiased=False) + self._noise).numpy()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {
            "episodes": [(o.copy(), a.copy(), r) for o, a, r in self._episodes],
            "params": None if self._params is None else {k: v.numpy().copy() for k, v in self._params.items()},
            "norm": {k: np.array(v) for k, v in self._norm.items()},
            "noise": self._noise,
            "fits": self._fits,
        }

    def load_state_dict(self, state: dict) -> None:
        self._episodes = [(np.asarray(o, np.float32), np.asarray(a, np.float32), float(r))
                          for o, a, r in state["episodes"]]
        p = state["params"]
        # a copy: a state that came through Ray's object store is read-only
        self._params = None if p is None else {k: torch.tensor(np.asarray(v)) for k, v in p.items()}
        self._norm = {k: np.asarray(v) for k, v in state["norm"].items()}
        self._noise, self._fits = float(state["noise"]), int(state["fits"])


class ObservationCodec:
    """How a domain's observations reach the ensemble: as vectors, and back as what its policy reads.

    The identity for observations that are numeric vectors already. A domain with
    richer observations (images, an instruction) overrides both: `vectors` maps a
    batch of real or imagined observations to the ensemble's vectors, and
    `observations` maps imagined vectors back, given each episode's first
    observation (for what the model does not imagine, e.g. the instruction).
    """

    def vectors(self, observations: Sequence[Any]) -> np.ndarray:
        return np.stack([np.asarray(o, np.float32).reshape(-1) for o in observations])

    def observations(self, vectors: np.ndarray, firsts: Sequence[Any]) -> list[Any]:
        return list(np.asarray(vectors, np.float32))


class LatentWorldModel(WorldModel):
    """A `LatentDynamicsEnsemble` behind the reset/step interface, learning from real anchors.

    `initial_observations(tasks)` gives the real first observation of each task's episode
    (the one thing the model is not asked to imagine); episodes end after `horizon`
    actions (an int, or a function of the task), or, with the ensemble's success head,
    as soon as the member-mean success reaches `success_threshold`; the reward and its
    variance come with the last transition. Actions are clipped to
    [action_low, action_high] as the real environment does. Before the first fit the
    model knows nothing: observations do not change and the reward is the prior.
    """

    def __init__(self, model: LatentDynamicsEnsemble,
                 initial_observations: Callable[[Sequence[Task]], Sequence[Any]], horizon: int | Callable[[Task], int],
                 action_low: float = -1.0, action_high: float = 1.0, prior_mean: float = 0.5, prior_var: float = 0.08,
                 codec: ObservationCodec | None = None, success_threshold: float = 0.5):
        self.model, self.initial_observations = model, initial_observations
        self.horizon = horizon if callable(horizon) else (lambda task, h=horizon: h)
        self.action_low, self.action_high = action_low, action_high
        self.prior_mean, self.prior_var = prior_mean, prior_var
        self.codec = codec or ObservationCodec()
        self.success_threshold = success_threshold
        self._z0: torch.Tensor | None = None  # [members, batch, latent] at reset; None before any fit
        self._z: torch.Tensor | None = None
        self._first: list[Any] = []
        self._obs: list[Any] = []
        self._t = np.zeros(0, dtype=int)
        self._limit = np.zeros(0, dtype=int)
        self._done = np.zeros(0, dtype=bool)

    def _action(self, action: Any) -> np.ndarray:
        return np.clip(np.asarray(action, np.float32), self.action_low, self.action_high).reshape(-1)

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        self._first = list(self.initial_observations(tasks))
        self._obs = list(self._first)
        self._t = np.zeros(len(tasks), dtype=int)
        self._limit = np.array([self.horizon(t) for t in tasks], dtype=int)
        self._done = np.zeros(len(tasks), dtype=bool)
        fitted = self.model.fitted and len(tasks) > 0
        self._z0 = self.model.encode(self.codec.vectors(self._first)) if fitted else None
        self._z = None if self._z0 is None else self._z0.clone()
        return list(self._obs)

    def _advance(self, live: list[int], actions: Sequence[Any]) -> tuple[np.ndarray, np.ndarray] | None:
        """Step the live episodes' latents; their reward mean and variance now (None before any fit)."""
        self._t[live] += 1
        if self._z is None:
            return None
        idx = torch.as_tensor(live)
        self._z[:, idx] = self.model.step(self._z[:, idx], np.stack([self._action(actions[i]) for i in live]))
        return self.model.reward(self._z0[:, idx], self._z[:, idx])

    def _ends(self, live: list[int], scores: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        """Which live episodes end now: out of turns, or (success head) predicted solved."""
        ended = self._t[live] >= self._limit[live]
        if scores is not None and self.model.success_head:
            ended |= scores[0] >= self.success_threshold
        return ended

    def _graded(self, scores: tuple[np.ndarray, np.ndarray] | None, k: int) -> tuple[float, float]:
        if scores is None:
            return self.prior_mean, self.prior_var
        return float(scores[0][k]), float(scores[1][k])

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        out: list[Transition | None] = [None] * len(actions)
        live = [i for i, a in enumerate(actions) if a is not None and not self._done[i]]
        if not live:
            return out
        scores = self._advance(live, actions)
        if self._z is not None:
            vectors = self.model.observe(self._z[:, torch.as_tensor(live)])
            for i, o in zip(live, self.codec.observations(vectors, [self._first[i] for i in live])):
                self._obs[i] = o
        for k, (i, end) in enumerate(zip(live, self._ends(live, scores))):
            r, v = self._graded(scores, k) if end else (0.0, 0.0)
            self._done[i] = bool(end)
            out[i] = Transition(self._obs[i], r, bool(end), reward_var=v, info={"simulated": True})
        return out

    def predict(self, trajectories: Sequence[Trajectory]) -> list[Prediction]:
        """Replay each trajectory's actions in the model: its grade is the reward where the model
        ends the episode, or, if the actions run out first, after the last of them."""
        if not trajectories:
            return []
        self.reset([t.task for t in trajectories])
        grades: list[tuple[float, float] | None] = [None] * len(trajectories)
        for turn in range(max(t.turns for t in trajectories)):
            live = [i for i, t in enumerate(trajectories) if turn < t.turns and grades[i] is None]
            if not live:
                break
            scores = self._advance(live, [t.actions[turn] if turn < t.turns else None for t in trajectories])
            for k, (i, end) in enumerate(zip(live, self._ends(live, scores))):
                if end or turn == trajectories[i].turns - 1:
                    grades[i] = self._graded(scores, k)
        return [Prediction.checked(*g) if g is not None else Prediction(None, error="no action to grade")
                for g in grades]

    def trace(self, trajectory: Trajectory) -> tuple[np.ndarray, np.ndarray]:
        """What the model imagines along one episode's actions, replayed open loop from its real first
        observation: the observation vector before each action ([T, obs]; the first is the real one's
        reconstruction) and the reward mean after each ([T]: with a success head, "solved by now")."""
        if not self.model.fitted:
            raise RuntimeError("the latent world model is not fitted yet: it imagines nothing")
        z0 = self.model.encode(self.codec.vectors(trajectory.observations[:1]))
        z, vectors, rewards = z0, [], []
        for action in trajectory.actions:
            vectors.append(self.model.observe(z)[0])
            z = self.model.step(z, self._action(action)[None])
            rewards.append(float(self.model.reward(z0, z)[0][0]))
        return np.stack(vectors), np.array(rewards)

    def fit(self, anchors: Sequence[Trajectory]) -> None:
        """Learn from complete real episodes with a known grade; the rest carry no dynamics."""
        usable = []
        for traj in anchors:
            # simulated observations would teach the model its own mistakes
            if traj.source != "real" or traj.real is None or not traj.real.known or not traj.turns:
                continue
            limit = self.horizon(traj.task)
            # an episode ends at its horizon, or before it when the model can learn when tasks are solved
            if traj.turns == limit or (self.model.success_head and traj.turns < limit):
                usable.append(traj)
        if not usable:
            return
        vectors = self.codec.vectors([o for t in usable for o in t.observations])
        start = 0
        for traj in usable:
            acts = np.stack([self._action(a) for a in traj.actions])
            self.model.add_episode(vectors[start:start + traj.turns], acts, traj.real.reward)
            start += traj.turns
        self.model.fit()

    def state_dict(self) -> dict:
        return self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.model.load_state_dict(state)
