"""wmrl: World Model RL for post-training agents when the environment is the expensive part.

Public surface: `train`, `evaluate`, `load_config`, `RunConfig`, `ConfigError`, the
registration decorators, and the four interfaces re-exported from `wmrl.core`.
"""

from wmrl.api import TrainResult, evaluate, train
from wmrl.config import ConfigError, RunConfig, load_config
from wmrl.core.domain import Domain
from wmrl.core.interfaces import Policy, RealEnv, RewardEstimator, WorldModel
from wmrl.registry import register_domain, register_estimator, register_world_model

__all__ = [
    "ConfigError", "Domain", "Policy", "RealEnv", "RewardEstimator", "RunConfig", "TrainResult", "WorldModel",
    "evaluate", "load_config", "register_domain", "register_estimator", "register_world_model", "train",
]
