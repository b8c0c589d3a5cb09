"""The compact `wmrl_vla` policy: a lerobot `PreTrainedPolicy` whose action chunk has a tractable density.

Large VLAs cannot be trained on a CPU in a test, and RL needs `log pi(chunk | obs)`
exactly and differentiably. So: a few strided convs for the 64x64 camera, a mean of
word embeddings for the instruction, an MLP for the proprio state, fused into the
mean of a diagonal Gaussian over the whole k x 7 chunk in *normalized* action space,
with a learned state-independent log-std (sigmoid-bounded, so it never collapses or
explodes and keeps its gradient).

It speaks lerobot's batch format (`observation.images.agentview` float [B,3,H,W] in
[0, 1], `observation.state` [B,9] raw, `task` list[str], and for training `action`
[B,k,7] raw with `action_is_pad` [B,k]); a batch may carry `observation.features`
[B, vision_dim] instead of the image: the camera encoder's output, precomputed (what
an embodied world model imagines, `domains/vla/world_model.py`). Normalization and tokenization happen
inside, from what the config carries, so `save_pretrained`/`from_pretrained` (the
lerobot ones: `config.json` + `model.safetensors`) restore a policy that acts the same.
"""

from __future__ import annotations

import math
from collections import deque

import torch
from torch import Tensor, nn

from lerobot.policies.pretrained import PreTrainedPolicy
from wmrl.domains.vla.dataset import ACTION_KEY, FEATURES_KEY, STATE_KEY
from wmrl.domains.vla.policy.configuration_wmrl_vla import WmrlVLAConfig
from wmrl.domains.vla.policy.instruction import InstructionTokenizer

ACTION_LOW, ACTION_HIGH = -1.0, 1.0  # the controller's action box (contract); chunks are clipped into it


class Normalizer(nn.Module):
    """Mean/std (de)normalization; its buffers are rebuilt from the config, so they are not saved twice."""

    def __init__(self, mean: list[float], std: list[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32), persistent=False)

    def normalize(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std

    def unnormalize(self, z: Tensor) -> Tensor:
        return z * self.std + self.mean


class BoundedLogStd(nn.Module):
    """A state-independent log-std kept in [low, high] by a sigmoid: bounded, yet never without a gradient."""

    def __init__(self, shape: tuple[int, ...], init: float, low: float, high: float):
        super().__init__()
        if not low < init < high:
            raise ValueError(f"init_log_std {init} must lie strictly inside [{low}, {high}]")
        self.low, self.span = low, high - low
        frac = (init - low) / self.span
        self.logit = nn.Parameter(torch.full(shape, math.log(frac / (1 - frac))))

    def forward(self) -> Tensor:
        return self.low + self.span * torch.sigmoid(self.logit)


class VisionEncoder(nn.Module):
    """Stride-2 convs down to a 4x4 map, flattened so where things are in the image survives."""

    def __init__(self, channels: tuple[int, ...], out_dim: int):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for c_out in channels:
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.ReLU()]
            c_in = c_out
        self.convs = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.proj = nn.Sequential(nn.Linear(c_in * 16, out_dim), nn.ReLU())

    def forward(self, image: Tensor) -> Tensor:
        return self.proj(self.convs(image * 2.0 - 1.0))


class InstructionEncoder(nn.Module):
    """Masked mean of word embeddings: word order matters little in these templated instructions."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.proj = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        m = mask.unsqueeze(-1).to(self.embed.weight.dtype)
        pooled = (self.embed(ids) * m).sum(1) / m.sum(1).clamp(min=1.0)
        return self.proj(pooled)


class WmrlVLANet(nn.Module):
    """(camera features, normalized state, instruction ids) -> mean of the normalized chunk, plus its log-std."""

    def __init__(self, config: WmrlVLAConfig, vocab_size: int):
        super().__init__()
        c = config
        self.chunk_shape = (c.chunk_size, c.action_dim)
        self.vision = VisionEncoder(c.vision_channels, c.vision_dim)
        self.instruction = InstructionEncoder(vocab_size, c.word_dim)
        self.state = nn.Sequential(nn.Linear(c.state_dim, c.state_dim_hidden), nn.ReLU())
        fused = c.vision_dim + c.word_dim + c.state_dim_hidden
        self.trunk = nn.Sequential(nn.Linear(fused, c.hidden_dim), nn.ReLU(), nn.Linear(c.hidden_dim, c.hidden_dim),
                                   nn.ReLU())
        self.head = nn.Linear(c.hidden_dim, c.chunk_size * c.action_dim)
        self.log_std = BoundedLogStd(self.chunk_shape, c.init_log_std, c.log_std_min, c.log_std_max)

    def forward(self, visual: Tensor, state: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
        h = torch.cat([visual, self.instruction(ids, mask), self.state(state)], -1)
        return self.head(self.trunk(h)).view(-1, *self.chunk_shape)


class WmrlVLAPolicy(PreTrainedPolicy):
    """lerobot-layout policy; `distribution(batch)` is the differentiable chunk density RL uses."""

    config_class = WmrlVLAConfig
    name = "wmrl_vla"

    def __init__(self, config: WmrlVLAConfig, **kwargs):
        super().__init__(config)
        config.validate_features()
        self.config = config
        self.tokenizer = InstructionTokenizer(config.vocabulary, config.max_instruction_tokens)
        self.state_normalizer = Normalizer(config.state_mean, config.state_std)
        self.action_normalizer = Normalizer(config.action_mean, config.action_std)
        self.model = WmrlVLANet(config, len(self.tokenizer))
        self.reset()

    def get_optim_params(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def vision_parameters(self) -> list[nn.Parameter]:
        """The camera encoder's parameters (a parameter group of their own: often trained slower)."""
        return list(self.model.vision.parameters())

    def reset(self) -> None:
        """Drop the queued actions of the previous chunk (call at episode start)."""
        self._action_queue: deque[Tensor] = deque([], maxlen=self.config.n_action_steps)

    def _device(self) -> torch.device:
        return self.model.head.weight.device

    def visual_features(self, image: Tensor) -> Tensor:
        """The camera encoder's output [B, vision_dim] for images float [B, 3, H, W] in [0, 1]."""
        image = image.to(self._device(), torch.float32)
        expected = tuple(self.config.image_features[self.config.image_key].shape)
        if tuple(image.shape[1:]) != expected:
            raise ValueError(f"batch[{self.config.image_key!r}] has shape {tuple(image.shape[1:])} per item, the "
                             f"policy expects {expected} (float, channel-first, in [0, 1])")
        return self.model.vision(image)

    def distribution(self, batch: dict) -> torch.distributions.Normal:
        """Diagonal Gaussian over the normalized chunk [B, k, action_dim]."""
        if FEATURES_KEY in batch:
            visual = batch[FEATURES_KEY].to(self._device(), torch.float32)
            if visual.shape[1:] != (self.config.vision_dim,):
                raise ValueError(f"batch[{FEATURES_KEY!r}] has shape {tuple(visual.shape[1:])} per item, the policy's "
                                 f"camera encoder gives ({self.config.vision_dim},)")
        else:
            visual = self.visual_features(batch[self.config.image_key])
        state = self.state_normalizer.normalize(batch[STATE_KEY].to(self._device(), torch.float32))
        tasks = [batch["task"]] if isinstance(batch["task"], str) else list(batch["task"])
        ids, mask = self.tokenizer.encode(tasks)
        mean = self.model(visual, state, ids.to(self._device()), mask.to(self._device()))
        return torch.distributions.Normal(mean, self.model.log_std().exp().expand_as(mean))

    def to_actions(self, normalized: Tensor) -> Tensor:
        """Normalized chunk -> raw actions in the controller's box."""
        return self.action_normalizer.unnormalize(normalized).clamp(ACTION_LOW, ACTION_HIGH)

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict, **kwargs) -> Tensor:
        """The mean chunk [B, k, action_dim], unnormalized and clipped."""
        return self.to_actions(self.distribution(batch).mean)

    @torch.no_grad()
    def select_action(self, batch: dict, **kwargs) -> Tensor:
        """One action [B, action_dim]; a new chunk is predicted when the queue runs out."""
        if not self._action_queue:
            chunk = self.predict_action_chunk(batch)[:, : self.config.n_action_steps]
            self._action_queue.extend(chunk.transpose(0, 1))
        return self._action_queue.popleft()

    def forward(self, batch: dict) -> tuple[Tensor, dict]:
        """BC loss: MSE of the mean on the normalized chunk, plus the Gaussian NLL for the log-std.

        The NLL sees the mean detached, so the std learns the residual scale without
        rescaling the mean's gradient by 1/sigma^2; padded steps (past the episode's
        end) count for neither.
        """
        dist = self.distribution(batch)
        target = self.action_normalizer.normalize(batch[ACTION_KEY].to(self._device(), torch.float32))
        if target.shape != dist.mean.shape:
            raise ValueError(f"batch['action'] has shape {tuple(target.shape)}, expected {tuple(dist.mean.shape)}: "
                             "open the dataset with load_dataset(root, config) so items carry the action chunk")
        pad = batch.get(f"{ACTION_KEY}_is_pad")
        keep = torch.ones(target.shape[:2], device=target.device) if pad is None else (~pad.to(target.device)).float()
        weight = keep.unsqueeze(-1).expand_as(target)
        denom = weight.sum().clamp(min=1.0)
        mse = ((dist.mean - target) ** 2 * weight).sum() / denom
        nll = -(torch.distributions.Normal(dist.mean.detach(), dist.stddev).log_prob(target) * weight).sum() / denom
        loss = mse + self.config.nll_weight * nll
        return loss, {"mse": mse.item(), "nll": nll.item()}
