"""Configuration of the compact `wmrl_vla` policy, a lerobot `PreTrainedConfig`.

Registered with lerobot's config registry as "wmrl_vla", so `save_pretrained` writes
it to `config.json` with a `"type"` and `from_pretrained` rebuilds it. It carries
everything acting needs besides the weights: the state/action normalization
statistics (from the dataset's `meta.stats`) and the instruction vocabulary, so a
reloaded policy normalizes and tokenizes exactly as the saved one did. (lerobot's
own processor pipelines would write separate files that `from_pretrained` does not
restore; one self-contained config cannot be forgotten.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.configs.policies import PreTrainedConfig
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
from lerobot.datasets.utils import dataset_to_policy_features
from lerobot.optim.optimizers import AdamWConfig

from wmrl.domains.vla.dataset import ACTION_KEY, IMAGE_KEY, STATE_KEY, normalization_stats
from wmrl.domains.vla.policy.instruction import PAD, UNK, InstructionTokenizer


def _inputs() -> dict[str, PolicyFeature]:
    return {IMAGE_KEY: PolicyFeature(FeatureType.VISUAL, (3, 64, 64)),
            STATE_KEY: PolicyFeature(FeatureType.STATE, (9,))}


def _outputs() -> dict[str, PolicyFeature]:
    return {ACTION_KEY: PolicyFeature(FeatureType.ACTION, (7,))}


@PreTrainedConfig.register_subclass("wmrl_vla")
@dataclass
class WmrlVLAConfig(PreTrainedConfig):
    """A small conv + word-embedding + proprio policy with a diagonal-Gaussian action-chunk head.

    `chunk_size` actions are predicted per observation (one RealEnv step executes
    them all); `n_action_steps` of them feed `select_action`'s queue. The Gaussian
    lives in normalized action space, its log-std is state-independent and kept in
    [`log_std_min`, `log_std_max`] by a sigmoid so it stays differentiable.
    """

    input_features: dict[str, PolicyFeature] = field(default_factory=_inputs)
    output_features: dict[str, PolicyFeature] = field(default_factory=_outputs)

    chunk_size: int = 8
    n_action_steps: int = 8

    # architecture
    vision_channels: tuple[int, ...] = (16, 32, 64, 64)
    vision_dim: int = 128
    word_dim: int = 32
    state_dim_hidden: int = 64
    hidden_dim: int = 256
    max_instruction_tokens: int = 16

    # the action-chunk Gaussian (normalized units)
    init_log_std: float = -1.0
    log_std_min: float = -5.0
    log_std_max: float = 1.0
    nll_weight: float = 1.0

    # what acting needs besides the weights (filled by `from_dataset`)
    vocabulary: list[str] = field(default_factory=lambda: [PAD, UNK])
    state_mean: list[float] = field(default_factory=lambda: [0.0] * 9)
    state_std: list[float] = field(default_factory=lambda: [1.0] * 9)
    action_mean: list[float] = field(default_factory=lambda: [0.0] * 7)
    action_std: list[float] = field(default_factory=lambda: [1.0] * 7)

    optimizer_lr: float = 1e-3
    optimizer_weight_decay: float = 1e-5

    def __post_init__(self) -> None:
        super().__post_init__()
        self.vision_channels = tuple(self.vision_channels)
        self.validate()

    @classmethod
    def from_dataset(cls, meta: LeRobotDatasetMetadata, min_std: float = 1e-2, **kwargs) -> WmrlVLAConfig:
        """Features, normalization statistics and vocabulary taken from a dataset's metadata."""
        feats = dataset_to_policy_features(meta.features)
        missing = [k for k in (IMAGE_KEY, STATE_KEY, ACTION_KEY) if k not in feats]
        if missing:
            raise ValueError(f"the dataset lacks {missing}; record it with wmrl.domains.vla.dataset.create_dataset")
        tokenizer = InstructionTokenizer.build(list(meta.tasks.index), kwargs.get("max_instruction_tokens", 16))
        return cls(input_features={k: feats[k] for k in (IMAGE_KEY, STATE_KEY)},
                   output_features={ACTION_KEY: feats[ACTION_KEY]},
                   vocabulary=tokenizer.vocabulary, **normalization_stats(meta, min_std), **kwargs)

    def validate(self) -> None:
        for key in ("chunk_size", "n_action_steps", "vision_dim", "word_dim", "state_dim_hidden", "hidden_dim",
                    "max_instruction_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"policy.{key} must be >= 1, got {getattr(self, key)}")
        if self.n_action_steps > self.chunk_size:
            raise ValueError(f"policy.n_action_steps ({self.n_action_steps}) must be <= policy.chunk_size "
                             f"({self.chunk_size}): only a predicted chunk can be queued")
        if not self.log_std_min < self.init_log_std < self.log_std_max:
            raise ValueError(f"policy.init_log_std ({self.init_log_std}) must lie strictly inside "
                             f"[log_std_min, log_std_max] = [{self.log_std_min}, {self.log_std_max}]")
        if not self.vision_channels:
            raise ValueError("policy.vision_channels needs at least one conv layer, e.g. (16, 32, 64, 64)")
        self.validate_features()
        for key, dim in (("state_mean", self.state_dim), ("state_std", self.state_dim),
                         ("action_mean", self.action_dim), ("action_std", self.action_dim)):
            if len(getattr(self, key)) != dim:
                raise ValueError(f"policy.{key} has {len(getattr(self, key))} entries, the feature has {dim}; "
                                 "build the config with WmrlVLAConfig.from_dataset(meta)")
        if min(self.state_std + self.action_std) <= 0:
            raise ValueError("policy.state_std and policy.action_std must be > 0 (floor them, see min_std)")
        InstructionTokenizer(self.vocabulary, self.max_instruction_tokens)  # raises on a malformed vocabulary

    def validate_features(self) -> None:
        if len(self.image_features) != 1:
            raise ValueError(f"policy.input_features needs exactly one camera, got {sorted(self.image_features)}")
        c, h, w = next(iter(self.image_features.values())).shape
        if c != 3 or min(h, w) < 16:
            raise ValueError(f"policy image feature must be RGB (3, H, W) with H, W >= 16, got {(c, h, w)}")
        if self.robot_state_feature is None or self.action_feature is None:
            raise ValueError(f"policy needs {STATE_KEY!r} among input_features and {ACTION_KEY!r} among "
                             "output_features")

    @property
    def image_key(self) -> str:
        return next(iter(self.image_features))

    @property
    def state_dim(self) -> int:
        return self.robot_state_feature.shape[0]

    @property
    def action_dim(self) -> int:
        return self.action_feature.shape[0]

    @property
    def observation_delta_indices(self) -> None:
        return None

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(self.chunk_size))

    @property
    def reward_delta_indices(self) -> None:
        return None

    def get_optimizer_preset(self) -> AdamWConfig:
        return AdamWConfig(lr=self.optimizer_lr, weight_decay=self.optimizer_weight_decay)

    def get_scheduler_preset(self) -> None:
        return None
