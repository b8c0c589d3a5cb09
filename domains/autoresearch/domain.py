"""The AutoResearch domain: an LLM agent writes experiment code, the sandbox runs it, the grade is the reward.

This file only wires the parts together under one typed config: the task suite
(`tasks.py`, optionally plus task directories on disk, `external.py`), the
sandbox pool (`sandbox/`) behind `AutoResearchEnv` (`env.py`), the code agent
(`policy.py`; by default the small LM the project trains itself, `agent.py`),
and the world models it offers, registered by name: a learned outcome
predictor over (task, code) with a ridge or an NLL ensemble (`world_model.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from wmrl.core.domain import Domain
from wmrl.core.interfaces import Policy, RealEnv, WorldModel
from wmrl.core.registry import DOMAINS, WORLD_MODELS
from wmrl.core.types import Task
from wmrl.domains.autoresearch.corpus import TaskSpec
from wmrl.domains.autoresearch.tasks import ARTask, load_suite, split


@dataclass
class AutoResearchConfig:
    name: str = "autoresearch"
    suite: str = "autoresearch-mini"
    task_root: str | None = None  # extra tasks in the documented directory format (docs/autoresearch_tasks.md)
    turns: int = 1  # agent replies per episode; each one really runs
    final: str = "best"  # episode reward: the best turn's grade or the last one's
    sandbox_slots: int | None = None  # None: one per core
    timeout_scale: float = 1.0  # multiplies each task's time budget
    memory_mb: int = 2048
    agent: str = "default"  # "default": the embedded agent built locally; else a HF model path or Hub id
    agent_examples: int = 1500  # SFT corpus size for the embedded agent
    agent_max_minutes: float = 4.0
    max_new_tokens: int = 320
    temperature: float = 1.0
    world_model: str = "code-ridge"  # one of AutoResearchDomain.world_models (docs/world_models.md)
    wm_dim: int = 512  # hashed code-feature buckets of the learned predictors
    wm_members: int = 8  # ensemble members of the learned predictors
    wm_background_fit: bool = True  # code-gaussian: fit in a thread, never blocking a step
    wm_samples: int = 4  # code-llm: sampled outcomes per trajectory (mean and variance)
    wm_max_new_tokens: int = 48  # code-llm
    wm_fit_steps: int = 8  # code-llm: fine-tuning steps per fit, capped by wm_fit_seconds
    wm_fit_seconds: float = 10.0
    cache_dir: str | None = None  # tasks and agents; default ~/.cache/wmrl


def task_spec(task: ARTask) -> TaskSpec:
    """What a solution script must know about a task (the corpus generator's input)."""
    kind = {"binary": "classification", "multiclass": "classification", "regression": "regression",
            "multi-output": "multioutput"}[task.task_type]
    # for binary ROC AUC the grader reads the positive class's probability from `prediction`
    proba = task.submission_columns if task.metric in ("roc_auc", "log_loss") else ()
    return TaskSpec(kind=kind, targets=tuple(task.target_columns), metric=task.metric, proba_columns=tuple(proba))


@DOMAINS.register("autoresearch")
class AutoResearchDomain(Domain):
    config_class = AutoResearchConfig

    world_models = ("code-ridge", "code-gaussian", "code-llm")

    def __init__(self, cfg: AutoResearchConfig):
        super().__init__(cfg)
        self.max_turns = cfg.turns

    @cached_property
    def suite(self) -> list[ARTask]:
        cache = Path(self.cfg.cache_dir) / "tasks" if self.cfg.cache_dir else None
        tasks = load_suite(self.cfg.suite, cache_dir=cache)
        if self.cfg.task_root:
            from wmrl.domains.autoresearch.external import load_task_root

            tasks = tasks + load_task_root(self.cfg.task_root)
        return tasks

    def tasks(self, split_name: str) -> list[Task]:
        return [t.to_task() for t in split(self.suite, split_name)]

    def agent_path(self) -> str:
        if self.cfg.agent != "default":
            return self.cfg.agent
        from wmrl.domains.autoresearch.agent import build_default_agent

        train = split(self.suite, "train")
        cache = Path(self.cfg.cache_dir) / "agents" if self.cfg.cache_dir else None
        return str(build_default_agent(
            cache, specs_and_prompts=[(task_spec(t), t.description) for t in train],
            n_examples=self.cfg.agent_examples, max_minutes=self.cfg.agent_max_minutes,
        ))

    def make_policy(self, seed: int) -> Policy:
        from wmrl.domains.autoresearch.policy import CodeAgentPolicy

        return CodeAgentPolicy(self.agent_path(), max_new_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature)

    def make_real_env(self) -> RealEnv:
        from wmrl.domains.autoresearch.env import AutoResearchEnv
        from wmrl.domains.autoresearch.sandbox import SandboxPool

        pool = SandboxPool(self.cfg.sandbox_slots or os.cpu_count() or 1)
        return AutoResearchEnv(pool, turns=self.cfg.turns, final=self.cfg.final,
                               timeout_scale=self.cfg.timeout_scale, memory_mb=self.cfg.memory_mb)

    def code_outcome_model(self, regressor=None, background_fit: bool = False) -> WorldModel:
        from wmrl.domains.autoresearch.world_model import CodeOutcomeModel

        families = [t.family for t in split(self.suite, "train")]
        return CodeOutcomeModel(families, turns=self.cfg.turns, final=self.cfg.final, dim=self.cfg.wm_dim,
                                members=self.cfg.wm_members, regressor=regressor, background_fit=background_fit)


@WORLD_MODELS.register("code-ridge")
def _code_ridge(domain: AutoResearchDomain) -> WorldModel:
    """(task, code) features -> bootstrap ridge ensemble: milliseconds per fit."""
    return domain.code_outcome_model()


@WORLD_MODELS.register("code-gaussian")
def _code_gaussian(domain: AutoResearchDomain) -> WorldModel:
    """(task, code) features -> deep ensemble of heteroscedastic MLPs trained by NLL."""
    from wmrl.world_models.gaussian_ensemble import GaussianEnsemble

    return domain.code_outcome_model(GaussianEnsemble(members=min(domain.cfg.wm_members, 5)),
                                     background_fit=domain.cfg.wm_background_fit)


@WORLD_MODELS.register("code-llm")
def _code_llm(domain: AutoResearchDomain) -> WorldModel:
    """The agent's own LM (a separate copy), prompted with task and code to write the outcome."""
    from wmrl.domains.autoresearch.llm_world_model import LLMOutcomeModel

    c = domain.cfg
    return LLMOutcomeModel(domain.agent_path(), turns=c.turns, final=c.final, samples=c.wm_samples,
                           max_new_tokens=c.wm_max_new_tokens, fit_steps=c.wm_fit_steps, fit_seconds=c.wm_fit_seconds)
