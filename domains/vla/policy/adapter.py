"""wmrl `Policy` adapters over lerobot-style policies: one action = one action chunk, with its log-prob.

`VLAPolicy` wraps the compact `wmrl_vla` policy; `ACTAdapter` wraps lerobot's own
`ACTPolicy` (deterministic: VAE off at inference) and adds the learnable diagonal
Gaussian around ACT's predicted chunk that RL needs in order to explore and to
have a density.

How clipping relates to the log-prob: a sampled normalized chunk z is mapped to
raw actions and clipped into the controller's box [-1, 1]; the chunk returned is
that clipped array, and its log-prob is the Gaussian density (in normalized
units, summed over the k x 7 entries) *at the returned chunk*. `log_prob` needs
nothing but the observations and those arrays, so it recomputes `act`'s values
exactly; the price is that samples beyond the box are scored at the box's face
(the gradient still pulls the mean toward the executed action).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.utils.constants import OBS_IMAGES
from wmrl.core.engine import ParamGroup
from wmrl.core.interfaces import Policy
from wmrl.domains.vla.dataset import ACTION_KEY, FEATURES_KEY, IMAGE_KEY, STATE_KEY
from wmrl.domains.vla.policy.configuration_wmrl_vla import WmrlVLAConfig
from wmrl.domains.vla.policy.modeling_wmrl_vla import ACTION_HIGH, ACTION_LOW, BoundedLogStd, Normalizer, WmrlVLAPolicy

# ResNet backbones expect ImageNet-normalized pixels (the convention lerobot's ACT was built with)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def observations_to_batch(observations: Sequence[dict[str, Any]], image_key: str = IMAGE_KEY,
                          encode: Callable[[Tensor], Tensor] | None = None) -> dict[str, Any]:
    """Contract observations -> a lerobot batch (image float [B,3,H,W] in [0, 1], raw state, task).

    An imagined observation (an embodied world model's) holds `features`, the camera
    encoder's output, instead of `image`; a batch with any of them carries
    `observation.features` for every row, the real rows' computed by `encode`.
    """
    if not observations:
        raise ValueError("no observations to act on")
    batch: dict[str, Any] = {
        STATE_KEY: torch.from_numpy(np.stack([np.asarray(o["state"], dtype=np.float32) for o in observations])),
        "task": [str(o["instruction"]) for o in observations],
    }
    imagined = [o for o in observations if "features" in o]
    real = [o for o in observations if "features" not in o]
    images = (torch.from_numpy(np.stack([np.asarray(o["image"], dtype=np.uint8) for o in real])).permute(0, 3, 1, 2)
              .float() / 255.0) if real else None
    if not imagined:
        batch[image_key] = images
        return batch
    if encode is None:
        raise ValueError("this policy acts on camera images only; imagined observations (camera features from an "
                         "embodied world model) need a policy with a feature input, such as WmrlVLAPolicy")
    given = torch.from_numpy(np.stack([np.asarray(o["features"], dtype=np.float32) for o in imagined]))
    computed = encode(images) if real else given[:0]
    rows, k_real, k_imag = [], iter(range(len(real))), iter(range(len(imagined)))
    for o in observations:
        rows.append(computed[next(k_real)] if "features" not in o else given[next(k_imag)].to(computed.device))
    batch[FEATURES_KEY] = torch.stack(rows)
    return batch


def _sample(dist: torch.distributions.Normal, generator: torch.Generator | None, greedy: bool) -> Tensor:
    if greedy:
        return dist.mean
    # drawn where the generator lives (CPU by default), so a seed reproduces on any device
    noise = torch.randn(dist.mean.shape, generator=generator, device=generator.device if generator else "cpu")
    return dist.mean + dist.stddev * noise.to(dist.mean.device)


def _chunk_log_prob(dist: torch.distributions.Normal, action_normalizer: Normalizer, chunks: Tensor) -> Tensor:
    """Density of the executed (clipped) chunks in normalized units, summed over the chunk: [B]."""
    return dist.log_prob(action_normalizer.normalize(chunks)).sum((-2, -1))


def _stack_chunks(actions: Sequence[Any], device: torch.device) -> Tensor:
    return torch.from_numpy(np.stack([np.asarray(a, dtype=np.float32) for a in actions])).to(device)


class VLAPolicy(Policy):
    """The `wmrl_vla` policy as a wmrl Policy; actions are np.float32 [k, 7] chunks in [-1, 1]."""

    def __init__(self, policy: WmrlVLAPolicy, vision_lr_scale: float = 1.0):
        """`vision_lr_scale` 0 freezes the camera encoder (what an embodied WM's feature space needs)."""
        self.policy = policy
        self.module: nn.Module = policy
        self.vision_lr_scale = vision_lr_scale
        for p in policy.vision_parameters():
            p.requires_grad_(vision_lr_scale > 0)

    def param_groups(self) -> list[ParamGroup] | None:
        if self.vision_lr_scale in (0.0, 1.0):
            return None
        return [ParamGroup(self.policy.vision_parameters(), self.vision_lr_scale)]

    @classmethod
    def build(cls, config: WmrlVLAConfig, seed: int) -> VLAPolicy:
        """A freshly initialized policy whose weights depend only on `seed`."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(WmrlVLAPolicy(config))

    @classmethod
    def from_pretrained(cls, path: str, **kwargs) -> VLAPolicy:
        return cls(WmrlVLAPolicy.from_pretrained(path, **kwargs))

    def save_pretrained(self, path: str) -> None:
        self.policy.save_pretrained(path)

    def reset(self, *args, **kwargs) -> None:
        """Episode start: chunks are stateless here, only lerobot's `select_action` queue is cleared."""
        self.policy.reset()

    def _dist(self, observations: Sequence[dict]) -> torch.distributions.Normal:
        return self.policy.distribution(observations_to_batch(observations, self.policy.config.image_key,
                                                              encode=self.policy.visual_features))

    def act(self, observations, *, generator=None, greedy=False):
        with torch.no_grad():
            dist = self._dist(observations)
            chunks = self.policy.to_actions(_sample(dist, generator, greedy))
            log_probs = _chunk_log_prob(dist, self.policy.action_normalizer, chunks)
        return [c.cpu().numpy() for c in chunks], log_probs.tolist()

    def log_prob(self, observations, actions) -> Tensor:
        dist = self._dist(observations)
        return _chunk_log_prob(dist, self.policy.action_normalizer, _stack_chunks(actions, dist.mean.device))


def tiny_act_config(chunk_size: int = 8, image_size: int = 64, dim_model: int = 64, n_heads: int = 4,
                    dim_feedforward: int = 128, n_encoder_layers: int = 1, device: str = "cpu") -> ACTConfig:
    """An ACT small enough for a CPU: no pretrained backbone (no download), VAE and dropout off.

    Without the VAE the latent is zero, so the predicted chunk is a deterministic
    function of the observation; without dropout, train and eval mode agree, so
    `act` and `log_prob` see the same mean.
    """
    return ACTConfig(
        input_features={IMAGE_KEY: PolicyFeature(FeatureType.VISUAL, (3, image_size, image_size)),
                        STATE_KEY: PolicyFeature(FeatureType.STATE, (9,))},
        output_features={ACTION_KEY: PolicyFeature(FeatureType.ACTION, (7,))},
        chunk_size=chunk_size, n_action_steps=chunk_size, pretrained_backbone_weights=None, use_vae=False,
        dropout=0.0, dim_model=dim_model, n_heads=n_heads, dim_feedforward=dim_feedforward,
        n_encoder_layers=n_encoder_layers, n_decoder_layers=1, device=device,
    )


class ACTChunkGaussian(nn.Module):
    """ACT's predicted (normalized) chunk as the mean of a diagonal Gaussian with a learnable log-std."""

    def __init__(self, act: ACTPolicy, stats: dict[str, list[float]], init_log_std: float = -1.0,
                 log_std_min: float = -5.0, log_std_max: float = 1.0):
        super().__init__()
        cfg = act.config
        self.act = act
        self.image_key = next(iter(cfg.image_features))
        self.state_normalizer = Normalizer(stats["state_mean"], stats["state_std"])
        self.action_normalizer = Normalizer(stats["action_mean"], stats["action_std"])
        self.image_normalizer = Normalizer([[[m]] for m in IMAGENET_MEAN], [[[s]] for s in IMAGENET_STD])
        self.log_std = BoundedLogStd((cfg.chunk_size, cfg.action_feature.shape[0]), init_log_std, log_std_min,
                                     log_std_max)

    def forward(self, batch: dict[str, Any]) -> torch.distributions.Normal:
        device = self.log_std.logit.device
        inputs = {STATE_KEY: self.state_normalizer.normalize(batch[STATE_KEY].to(device)),
                  OBS_IMAGES: [self.image_normalizer.normalize(batch[self.image_key].to(device))]}
        mean = self.act.model(inputs)[0]  # ACT's own forward, with gradients (predict_action_chunk is no_grad)
        return torch.distributions.Normal(mean, self.log_std().exp().expand_as(mean))


class ACTAdapter(Policy):
    """lerobot's ACT as a wmrl Policy; it ignores the instruction (ACT has no language input)."""

    def __init__(self, act: ACTPolicy, stats: dict[str, list[float]], init_log_std: float = -1.0):
        self.module: nn.Module = ACTChunkGaussian(act, stats, init_log_std)

    @classmethod
    def build(cls, stats: dict[str, list[float]], seed: int, config: ACTConfig | None = None,
              init_log_std: float = -1.0) -> ACTAdapter:
        """A fresh ACT (`tiny_act_config()` unless given) whose weights depend only on `seed`."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(ACTPolicy(config or tiny_act_config()), stats, init_log_std)

    def reset(self, *args, **kwargs) -> None:
        self.module.act.reset()

    def _dist(self, observations: Sequence[dict]) -> torch.distributions.Normal:
        return self.module(observations_to_batch(observations, self.module.image_key))

    def act(self, observations, *, generator=None, greedy=False):
        with torch.no_grad():
            dist = self._dist(observations)
            z = _sample(dist, generator, greedy)
            chunks = self.module.action_normalizer.unnormalize(z).clamp(ACTION_LOW, ACTION_HIGH)
            log_probs = _chunk_log_prob(dist, self.module.action_normalizer, chunks)
        return [c.cpu().numpy() for c in chunks], log_probs.tolist()

    def log_prob(self, observations, actions) -> Tensor:
        dist = self._dist(observations)
        return _chunk_log_prob(dist, self.module.action_normalizer, _stack_chunks(actions, dist.mean.device))
