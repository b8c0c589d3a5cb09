"""The VLA domain's world models: `embodied` imagines whole episodes, `progress` scores real frames.

`embodied` (the default) stands in for the simulator. It is the domain-agnostic
`LatentWorldModel` (`world_models/latent.py`) with a success head, over what the
policy itself reads: the camera features of the BC policy's encoder (frozen, so
imagined and real observations live in one space; hence `domain.vision_lr_scale=0`)
and the proprioceptive state. An action is one chunk, flattened. Imagined
observations are `{"features", "state", "instruction"}`, which `WmrlVLAPolicy`
acts on as it acts on images. An imagined episode starts from the task's real
first observation -- rendered once per task by a one-worker `VLAEnv` (a reset,
never a step) and cached -- and ends where the model predicts success, as a real
one ends at success, or at the family's horizon. Its grade is the predicted
success with a variance (member disagreement + out-of-bag noise) that the
denoiser uses per trajectory.

Why pixels are not imagined: a decoder to 64x64 frames costs far more than the
policy on a CPU and the policy needs only the encoder's output; a pixel-space
model can be registered beside this one (`@register_world_model(..., domains=["vla"])`)
with the same interface.

It starts from the demonstrations the BC policy was trained on (every `chunk`
frames a turn, solved after the last) and refits from every real anchor episode
(the runtime fits in the background).

`progress` is the seed method's VLA signal, kept as the baseline `estimator.mode=fused`
runs with: a regressor from a real frame's features to task progress (frame
index / length on successful episodes, 0 on failed ones), trained on the
demonstrations and refitted on every real episode; an episode's score is its
highest progress. It cannot imagine episodes, only grade real ones.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from wmrl.core.interfaces import WorldModel
from wmrl.core.types import Prediction, Task, Trajectory, Transition
from wmrl.core.validation import at_least
from wmrl.core.wm_runtime import RuntimeConfig
from wmrl.core.wm_spec import WorldModelConfig, register_world_model
from wmrl.domains.vla.env import VLAEnv
from wmrl.world_models.latent import LatentDynamicsEnsemble, LatentWorldModel, ObservationCodec

log = logging.getLogger(__name__)

NO_DEMOS = "give world_model.demos=PATH of a LeRobotDataset (RUN_DIR/demos of `wmrl vla collect`), or none"


@dataclass
class _VLAModelConfig(WorldModelConfig):
    #: a LeRobotDataset the model starts from; "auto": RUN_DIR/demos beside domain.policy=RUN_DIR/bc/policy;
    #: "none": start unfitted
    demos: str = "auto"
    #: refits overlap the policy update and the next step's simulator episodes
    runtime: RuntimeConfig = field(default_factory=lambda: RuntimeConfig(background_fit=True))

    def demos_root(self, policy: str) -> Path | None:
        if self.demos == "none":
            return None
        root = Path(policy).parent.parent / "demos" if self.demos == "auto" else Path(self.demos)
        if not (root / "meta" / "info.json").is_file():
            raise ValueError(f"world_model.demos: no LeRobotDataset at {root}; {NO_DEMOS}")
        return root


@dataclass
class EmbodiedConfig(_VLAModelConfig):
    """`embodied`: latent dynamics over the policy's frozen camera features + proprio, on action chunks."""

    members: int = 5
    latent_dim: int = 32
    hidden: int = 128
    epochs: int = 300
    refit_epochs: int = 60
    lr: float = 3e-3
    window: int = 2048
    #: an imagined episode ends when the members' mean success reaches this
    success_threshold: float = 0.5

    def validate(self) -> None:
        at_least(self, "world_model", 1, "members", "latent_dim", "hidden", "epochs", "window")
        at_least(self, "world_model", 0, "refit_epochs")
        if not self.lr > 0:
            raise ValueError(f"world_model.lr must be > 0, got {self.lr!r}")
        if not 0 < self.success_threshold < 1:
            raise ValueError(f"world_model.success_threshold must be in (0, 1), got {self.success_threshold!r}")


@dataclass
class ProgressConfig(_VLAModelConfig):
    """`progress`: a progress regressor on real frames (the baseline `estimator.mode=fused` uses)."""

    members: int = 5
    hidden: int = 64
    epochs: int = 200
    window: int = 8192

    def validate(self) -> None:
        at_least(self, "world_model", 1, "members", "hidden", "epochs", "window")


class FeatureCodec(ObservationCodec):
    """Observations <-> [camera features, state] vectors, through a frozen copy of the BC policy's encoder."""

    def __init__(self, encode: Callable[[torch.Tensor], torch.Tensor]):
        self.encode = encode

    def features(self, images: np.ndarray) -> np.ndarray:
        """Camera features of uint8 images [N, H, W, 3] (or float [N, 3, H, W] in [0, 1])."""
        x = torch.as_tensor(images)
        if x.dtype == torch.uint8:
            x = x.permute(0, 3, 1, 2).float() / 255.0
        with torch.no_grad():
            return torch.cat([self.encode(x[i:i + 256]) for i in range(0, len(x), 256)]).cpu().numpy()

    def vectors(self, observations: Sequence[dict]) -> np.ndarray:
        real = [i for i, o in enumerate(observations) if "features" not in o]
        computed = self.features(np.stack([observations[i]["image"] for i in real])) if real else None
        rows, k = [], 0
        for o in observations:
            if "features" in o:
                f = np.asarray(o["features"], np.float32)
            else:
                f, k = computed[k], k + 1
            rows.append(np.concatenate([f, np.asarray(o["state"], np.float32)]))
        return np.stack(rows).astype(np.float32)

    def observations(self, vectors: np.ndarray, firsts: Sequence[dict]) -> list[dict]:
        d = len(vectors[0]) - len(firsts[0]["state"])
        return [{"features": v[:d].copy(), "state": v[d:].copy(), "instruction": f["instruction"]}
                for v, f in zip(np.asarray(vectors, np.float32), firsts)]


class FirstObservations:
    """Each task's real first observation, rendered once by a one-worker VLAEnv (reset only) and cached."""

    def __init__(self, env_cfg):
        self.env_cfg = replace(env_cfg, workers=1, faults={})
        self._cache: dict[Any, dict] = {}
        self._env: VLAEnv | None = None
        self.rendered = 0  # how many first observations were rendered (each task once)

    def __call__(self, tasks: Sequence[Task]) -> list[dict]:
        missing = list({t.payload: t for t in tasks if t.payload not in self._cache}.values())
        if missing:
            if self._env is None:
                self._env = VLAEnv(self.env_cfg)
            for t, obs in zip(missing, self._env.reset(missing)):
                self._cache[t.payload] = obs
            self.rendered += len(missing)
        return [self._cache[t.payload] for t in tasks]

    def close(self) -> None:
        if self._env is not None:
            env, self._env = self._env, None
            env.close()


def demo_episodes(root: Path, chunk: int) -> list[tuple[list[dict], np.ndarray]]:
    """The demonstrations at `root` as turns: the frame every `chunk` steps and the chunk of actions from it
    (the last one padded with its final action), each episode solved after its last turn."""
    from wmrl.domains.vla.dataset import ACTION_KEY, IMAGE_KEY, STATE_KEY, load_dataset

    ds = load_dataset(root)
    loader = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=False, num_workers=0)
    frames: dict[int, list[tuple[int, np.ndarray, np.ndarray, np.ndarray, str]]] = {}
    for b in loader:
        for i in range(len(b["task"])):
            frames.setdefault(int(b["episode_index"][i]), []).append(
                (int(b["frame_index"][i]), (b[IMAGE_KEY][i].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8),
                 b[STATE_KEY][i].numpy().astype(np.float32), b[ACTION_KEY][i].numpy().astype(np.float32),
                 str(b["task"][i])))
    episodes = []
    for ep in sorted(frames):
        rows = sorted(frames[ep], key=lambda r: r[0])
        actions = np.stack([r[3] for r in rows])
        obs, chunks = [], []
        for start in range(0, len(rows), chunk):
            _, image, state, _, task = rows[start]
            part = actions[start:start + chunk]
            chunks.append(np.concatenate([part, np.repeat(part[-1:], chunk - len(part), 0)]))
            obs.append({"image": image, "state": state, "instruction": task})
        episodes.append((obs, np.stack(chunks)))
    return episodes


def _bc_encoder(policy_path: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The saved BC policy's camera encoder, frozen, on the CPU."""
    from wmrl.domains.vla.policy.modeling_wmrl_vla import WmrlVLAPolicy

    bc = WmrlVLAPolicy.from_pretrained(policy_path).eval()
    for p in bc.parameters():
        p.requires_grad_(False)
    return bc.visual_features


class EmbodiedWorldModel(LatentWorldModel):
    """`LatentWorldModel` over the VLA policy's feature space, started from the demonstrations."""

    def __init__(self, model: LatentDynamicsEnsemble, first: FirstObservations, codec: FeatureCodec,
                 horizon: Callable[[Task], int], chunk: int, demos: Path | None, success_threshold: float):
        super().__init__(model, first, horizon, codec=codec, success_threshold=success_threshold, prior_mean=0.0,
                         prior_var=0.25)
        self.first, self.chunk, self.demos = first, chunk, demos
        self._started = False

    def _start(self) -> None:
        """Fit on the demonstrations once, before first use (a checkpoint's state replaces this)."""
        if self._started:
            return
        self._started = True
        if self.demos is None or self.model.fitted:
            return
        episodes = demo_episodes(self.demos, self.chunk)
        vectors = self.codec.vectors([o for obs, _ in episodes for o in obs])
        start = 0
        for obs, chunks in episodes:
            self.model.add_episode(vectors[start:start + len(obs)], chunks.reshape(len(chunks), -1), 1.0)
            start += len(obs)
        self.model.fit()
        log.info("embodied world model: fitted on %d demonstrations (%d turns) from %s", len(episodes), start, self.demos)

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        self._start()
        return super().reset(tasks)

    def predict(self, trajectories: Sequence[Trajectory]) -> list[Prediction]:
        self._start()
        return super().predict(trajectories)

    def fit(self, anchors: Sequence[Trajectory]) -> None:
        self._start()
        super().fit(anchors)

    def trace(self, trajectory: Trajectory) -> tuple[np.ndarray, np.ndarray]:
        self._start()
        return super().trace(trajectory)

    def open_loop_error(self, trajectories: Sequence[Trajectory]) -> list[float]:
        """Per turn after the first: the mean squared error of the imagined observation vector against the
        real one, the real actions replayed open loop from the real first observation, relative to the
        data's variance (0: exact; 1: as far off as the spread of the observations themselves)."""
        self._start()
        sums: dict[int, list[float]] = {}
        scale = float(np.mean(self.model._norm["obs_sd"] ** 2)) if self.model.fitted else 1.0
        for traj in trajectories:
            imagined, _ = self.trace(traj)
            real = self.codec.vectors(traj.observations)
            for t in range(1, traj.turns):
                sums.setdefault(t, []).append(float(((imagined[t] - real[t]) ** 2).mean()) / scale)
        return [float(np.mean(sums[t])) for t in sorted(sums)]

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._started = True

    def close(self) -> None:
        self.first.close()


class ProgressWorldModel(WorldModel):
    """Progress of real frames (`GaussianEnsemble` on [camera features, state]); grades real episodes only."""

    def __init__(self, codec: FeatureCodec, cfg: ProgressConfig, demos: Path | None, chunk: int, seed: int):
        from wmrl.world_models.gaussian_ensemble import GaussianEnsemble

        self.codec, self.demos, self.chunk = codec, demos, chunk
        self.model = GaussianEnsemble(members=cfg.members, hidden=cfg.hidden, epochs=cfg.epochs, prior_mean=0.0,
                                      prior_var=0.25, window=cfg.window, seed=seed)
        self._started = False

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        raise NotImplementedError("the progress model grades real frames and cannot imagine episodes: run it with "
                                  "estimator.mode=fused (every group in the simulator), or use world_model.type=embodied")

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        raise NotImplementedError("the progress model cannot imagine episodes (see reset)")

    def _add(self, observations: Sequence[dict], success: bool) -> None:
        n = len(observations)
        labels = np.arange(1, n + 1) / n if success else np.zeros(n)
        self.model.add(self.codec.vectors(observations), labels)

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.demos is not None and self.model.n == 0:
            for obs, _ in demo_episodes(self.demos, self.chunk):
                self._add(obs, True)
            self.model.fit()

    def predict(self, trajectories: Sequence[Trajectory]) -> list[Prediction]:
        """An episode's progress: the highest over its frames, with that frame's variance."""
        self._start()
        if not trajectories:
            return []
        mean, var = self.model.predict(self.codec.vectors([o for t in trajectories for o in t.observations]))
        out, start = [], 0
        for t in trajectories:
            if not t.turns:
                out.append(Prediction(None, error="an episode without a frame"))
                continue
            k = start + int(np.argmax(mean[start:start + t.turns]))
            out.append(Prediction.checked(float(np.clip(mean[k], 0.0, 1.0)), float(var[k])))
            start += t.turns
        return out

    def fit(self, anchors: Sequence[Trajectory]) -> None:
        self._start()
        added = [t for t in anchors if t.source == "real" and t.real is not None and t.real.known and t.turns]
        for t in added:
            self._add(t.observations, t.real.reward >= 1.0)
        if added:
            self.model.fit()

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.model.load_state_dict(state["model"])
            self._started = True


def _frozen_vision_required(domain: Any, name: str) -> None:
    if domain.cfg.vision_lr_scale != 0:
        raise ValueError(f"world_model.type={name} works in the BC policy's camera-feature space, which must not move: "
                         f"set domain.vision_lr_scale=0 (freezes the camera encoder), got {domain.cfg.vision_lr_scale:g}")


@register_world_model("embodied", domains=["vla"], config=EmbodiedConfig)
def _embodied(domain: Any, cfg: EmbodiedConfig) -> WorldModel:
    """Whole episodes imagined in the policy's frozen feature space, fitted on demos and anchors."""
    _frozen_vision_required(domain, "embodied")
    codec = FeatureCodec(_bc_encoder(domain.cfg.policy))
    chunk = domain.chunk
    state_dim = len(domain.cfg.policy_config().get("state_mean", [0.0] * 9))
    vision_dim = int(domain.cfg.policy_config().get("vision_dim", 128))
    model = LatentDynamicsEnsemble(obs_dim=vision_dim + state_dim, action_dim=chunk * 7, members=cfg.members,
                                   latent_dim=cfg.latent_dim, hidden=cfg.hidden, epochs=cfg.epochs,
                                   refit_epochs=cfg.refit_epochs, lr=cfg.lr, window=cfg.window, seed=domain.cfg.seed,
                                   success_head=True)
    env_cfg = domain.cfg.env

    def horizon(task: Task) -> int:
        return math.ceil(env_cfg.horizon(task.payload.family) / chunk)

    return EmbodiedWorldModel(model, FirstObservations(env_cfg), codec, horizon, chunk,
                              cfg.demos_root(domain.cfg.policy), cfg.success_threshold)


@register_world_model("progress", domains=["vla"], config=ProgressConfig)
def _progress(domain: Any, cfg: ProgressConfig) -> WorldModel:
    """The fused baseline's progress regressor on real frames (it grades, it does not imagine)."""
    return ProgressWorldModel(FeatureCodec(_bc_encoder(domain.cfg.policy)), cfg, cfg.demos_root(domain.cfg.policy),
                              domain.chunk, domain.cfg.seed)
