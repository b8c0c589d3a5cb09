"""wmrl: World Model RL for post-training agents when the environment is the expensive part.

The public surface a downstream project builds on (everything else may move):

- running: `train`, `evaluate`, `export`, `build_trainer`, `Trainer`, `TrainResult`;
- configuring: `load_config`, `RunConfig`, `ConfigError`, `WorldModelConfig`
  (base of every `world_model:` section), `RuntimeConfig` (its `runtime:`);
- extending: `Domain`, the four interfaces `Policy`, `RealEnv`, `WorldModel`,
  `RewardEstimator`, and `register_domain`, `register_world_model`,
  `register_estimator`, `register_benchmark`;
- the data they exchange: `Task`, `Transition`, `Trajectory`, `Outcome`,
  `Prediction`, `Group`, `Estimate`, `SPLITS`, `STATUSES`, and `StepObserver`.
"""

from wmrl.api import TrainResult, build_trainer, evaluate, export, train
from wmrl.config import ConfigError, RunConfig, load_config
from wmrl.core.domain import Domain
from wmrl.core.interfaces import Policy, RealEnv, RewardEstimator, WorldModel
from wmrl.core.observers import StepObserver
from wmrl.core.trainer import Trainer
from wmrl.core.types import SPLITS, STATUSES, Estimate, Group, Outcome, Prediction, Task, Trajectory, Transition
from wmrl.core.wm_runtime import RuntimeConfig
from wmrl.core.wm_spec import WorldModelConfig
from wmrl.registry import register_benchmark, register_domain, register_estimator, register_world_model

__all__ = [
    "SPLITS", "STATUSES", "ConfigError", "Domain", "Estimate", "Group", "Outcome", "Policy", "Prediction", "RealEnv",
    "RewardEstimator", "RunConfig", "RuntimeConfig", "StepObserver", "Task", "TrainResult", "Trainer", "Trajectory",
    "Transition", "WorldModel", "WorldModelConfig", "build_trainer", "evaluate", "export", "load_config", "register_benchmark",
    "register_domain", "register_estimator", "register_world_model", "train",
]
