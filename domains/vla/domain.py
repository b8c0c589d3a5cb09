"""The VLA domain registered with the core trainer: `wmrl train vla-rl` post-trains a BC policy with RL.

`VLADomain` wires what already exists into the trainer: tasks from
`tasks.make_tasks` (per-family counts per split), a `WmrlVLAPolicy` loaded
from a `save_pretrained` folder (the BC policy `wmrl vla bc` writes), and
`VLAEnv` (robosuite simulators in worker processes) as the real environment.
One action is one action chunk, so an episode lasts at most
ceil(longest horizon / chunk) turns. The env's grades are the default
`RealEnv.outcome`: success 1.0, a truncated episode 0.0, a failed simulator
worker an unknown grade.

Every mode of the core runs here: `real` (GRPO with every group in the
simulator), `wm` and `wmrl` with the `embodied` world model (episodes imagined
in the frozen camera-feature space of the BC policy; `world_model.py`), and
`fused`, the seed method's VLA track (every group in the simulator, success
fused with the `progress` model's score of the real frames), which gets the
`progress` world model without naming it.

Imports here stay light (numpy, torch, the task and env modules): every config
load imports the registered domains, and lerobot (about 10 s to import) is only
imported when a policy or a world model is built.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from wmrl.core.archive import EpisodeArchive
from wmrl.core.domain import Domain
from wmrl.core.interfaces import Policy, RealEnv
from wmrl.core.registry import DOMAINS
from wmrl.core.types import SPLITS, Task
from wmrl.core.validation import at_least
from wmrl.domains.vla.env import VLAEnv, VLAEnvConfig
from wmrl.domains.vla.tasks import FAMILIES, make_tasks

# an optional domain: without its extra, importing it is the ImportError `load_builtin_domains` reports
for _dep in ("lerobot", "robosuite", "mujoco"):
    if importlib.util.find_spec(_dep) is None:
        raise ImportError(f"the vla domain needs {_dep!r}")

NO_POLICY = ("run `wmrl vla bc` first (it writes RUN_DIR/bc/policy) or give domain.policy=PATH "
             "of a WmrlVLAPolicy save_pretrained folder")


@dataclass
class VLADomainConfig:
    name: str = "vla"
    families: list[str] = field(default_factory=lambda: list(FAMILIES))
    #: tasks (initial states) per family and split
    n_train: int = 16
    n_test_id: int = 4
    n_test_ood: int = 4
    n_validation: int = 4
    seed: int = 0
    #: a `save_pretrained` folder of a WmrlVLAPolicy (the BC start); required
    policy: str = ""
    #: learning-rate scale of the camera encoder relative to engine.lr; 0 freezes it (required by the embodied
    #: world model, which imagines in the BC encoder's feature space)
    vision_lr_scale: float = 1.0
    #: the real environment: workers, chunk, horizon_steps, step_timeout_s, ... (env.py's VLAEnvConfig)
    env: VLAEnvConfig = field(default_factory=VLAEnvConfig)

    def validate(self) -> None:
        at_least(self, "domain", 1, "n_train")
        at_least(self, "domain", 0, "n_test_id", "n_test_ood", "n_validation")
        if not self.families:
            raise ValueError("domain.families is empty; name at least one of " + ", ".join(FAMILIES))
        for name in self.families:
            if name not in FAMILIES:
                raise ValueError(f"domain.families: unknown family {name!r}; known: {', '.join(FAMILIES)}")
        if not self.vision_lr_scale >= 0:
            raise ValueError(f"domain.vision_lr_scale must be >= 0 (0 freezes the camera encoder), "
                             f"got {self.vision_lr_scale!r}")
        chunk = self.policy_chunk()
        if chunk > self.env.chunk:
            raise ValueError(f"domain.policy {self.policy} predicts chunks of {chunk} actions, more than "
                             f"domain.env.chunk={self.env.chunk}; raise domain.env.chunk")

    def policy_config(self) -> dict:
        """The policy folder's `config.json` (a ValueError says how to get one when it is missing)."""
        if not self.policy:
            raise ValueError(f"domain.policy is empty: {NO_POLICY}")
        path = Path(self.policy) / "config.json"
        if not path.is_file():
            raise ValueError(f"domain.policy={self.policy} is not a saved policy (no config.json there): {NO_POLICY}")
        try:
            return json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"domain.policy={self.policy}: config.json does not parse ({exc})") from None

    def policy_chunk(self) -> int:
        """Actions per chunk the saved policy acts with (what one env step executes)."""
        return int(self.policy_config().get("chunk_size", self.env.chunk))


@DOMAINS.register("vla")
class VLADomain(Domain):
    config_class = VLADomainConfig
    default_world_model = "embodied"
    mode_world_models = {"fused": "progress"}

    def __init__(self, cfg: VLADomainConfig):
        super().__init__(cfg)
        longest = max(cfg.env.horizon(f) for f in cfg.families)
        self.chunk = min(cfg.env.chunk, cfg.policy_chunk())  # low-level actions per turn
        self.max_turns = math.ceil(longest / self.chunk)

    def tasks(self, split: str) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        n = {"train": self.cfg.n_train, "test_id": self.cfg.n_test_id, "test_ood": self.cfg.n_test_ood,
             "validation": self.cfg.n_validation}[split]
        return make_tasks(split, n, seed=self.cfg.seed, families=self.cfg.families)

    def make_policy(self, seed: int) -> Policy:
        """The saved (BC) policy; the same weights for every `seed`.

        RL post-training starts from the behaviour-cloned policy, not from a
        fresh initialization, so `seed` does not change the weights: the
        trainer's exploration comes from sampling chunks from the policy's
        Gaussian with the trainer's own seeded generator.
        """
        from wmrl.domains.vla.policy.adapter import VLAPolicy
        from wmrl.domains.vla.policy.modeling_wmrl_vla import WmrlVLAPolicy

        self.cfg.policy_config()  # the actionable error, before lerobot's own
        return VLAPolicy(WmrlVLAPolicy.from_pretrained(self.cfg.policy), vision_lr_scale=self.cfg.vision_lr_scale)

    def make_real_env(self) -> RealEnv:
        return VLAEnv(self.cfg.env)

    def report(self, run_dir: Path, cfg) -> list[str]:
        """Imagined-vs-real strips of the run's last anchor group (`report.py`)."""
        from wmrl.domains.vla.report import imagined_vs_real

        return imagined_vs_real(self, run_dir, cfg)

    def make_archive(self, run_dir: Path) -> EpisodeArchive:
        """Real episodes go to LeRobotDatasets under RUN_DIR/experience, a frame per chunk (`experience.py`)."""
        from wmrl.domains.vla.experience import LeRobotArchive

        return LeRobotArchive(run_dir, fps=self.cfg.env.control_freq / self.chunk)



# the domain's world models register themselves (after the domain: they name it)
from wmrl.domains.vla import world_model as _world_models  # noqa: E402,F401
