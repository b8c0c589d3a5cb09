"""The AutoResearch domain: an LLM agent writes experiment code, the sandbox runs it, the grade is the reward.

This file only wires the parts together under one typed config: the task suite
(`tasks.py`, optionally plus task directories on disk, `external.py`), the
sandbox pool (`sandbox/`) behind `AutoResearchEnv` (`env.py`), the code agent
(`policy.py`; by default the small LM the project trains itself, `agent.py`),
and the world models that serve it, registered by name with their typed
configs: a learned outcome predictor over (task, code) with a ridge or an NLL
ensemble (`world_model.py`), or the agent's own LM asked for the outcome
(`llm_world_model.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from importlib.metadata import version
from pathlib import Path

import numpy as np

from wmrl.core.domain import Domain
from wmrl.core.interfaces import Policy, RealEnv, WorldModel
from wmrl.core.registry import DOMAINS
from wmrl.core.types import Task, Trajectory
from wmrl.core.validation import at_least
from wmrl.core.wm_runtime import RuntimeConfig
from wmrl.core.wm_spec import WorldModelConfig, register_world_model
from wmrl.domains.autoresearch.corpus import TaskSpec, spec_for
from wmrl.domains.autoresearch.episodes import FINALS
from wmrl.domains.autoresearch.protocol import extract_code, format_reply
from wmrl.domains.autoresearch.suite import load_suite
from wmrl.domains.autoresearch.tasks import ARTask, split, test_frame, train_frame
from wmrl.lm.engines import ENGINES
from wmrl.lm.lora import LoraSettings


EXECUTORS = ("local", "ray")
#: what the agent's programs import (they run on this interpreter): a benchmark's runs are comparable only at the
#: same versions
PROGRAM_LIBRARIES = ("numpy", "pandas", "scikit-learn")


@dataclass
class AutoResearchConfig:
    name: str = "autoresearch"
    suite: str = "autoresearch-mini"
    task_root: str | None = None  # extra tasks in the documented directory format (docs/autoresearch_tasks.md)
    turns: int = 1  # agent replies per episode; each one really runs
    final: str = "best"  # episode reward: the best turn's grade or the last one's
    sandbox_slots: int | None = None  # None: one per core
    #: where programs run: "local" (threads over one zygote) or "ray" (one Ray actor per slot, any node)
    executor: str = "local"
    ray_address: str | None = None  # executor ray: None starts a local Ray; "auto" / "ray://host:10001" joins one
    timeout_scale: float = 1.0  # multiplies each task's time budget
    memory_mb: int = 2048
    agent: str = "default"  # "default": the embedded agent built locally; else a HF model path or Hub id
    agent_examples: int = 1500  # SFT corpus size for the embedded agent
    agent_steps: int = 600  # its SFT step budget (0: epochs only)
    agent_max_minutes: float = 6.0  # a guard: on a slow machine the SFT stops here, its schedule compressed
    max_new_tokens: int = 320
    temperature: float = 1.0
    #: where replies are sampled: "hf" (this process) or "vllm" (a vLLM server, weights synced after each update)
    rollout: str = "hf"
    rollout_servers: int = 1  # rollout vllm: servers behind the policy (one per rollout GPU), prompts split over them
    rollout_devices: list[str] = field(default_factory=list)  # per server, its CUDA_VISIBLE_DEVICES (e.g. ["1", "2"])
    #: LoRA adapters instead of full fine-tuning (`domain.lora.r=8`); r=0: every weight trains
    lora: LoraSettings = field(default_factory=LoraSettings)
    cache_dir: str | None = None  # tasks and agents; default ~/.cache/wmrl

    def validate(self) -> None:
        at_least(self, "domain", 1, "turns", "max_new_tokens", "memory_mb", "rollout_servers")
        at_least(self, "domain", 0, "agent_steps")
        if (self.rollout_servers > 1 or self.rollout_devices) and self.rollout != "vllm":
            raise ValueError("domain.rollout_servers > 1 and domain.rollout_devices need domain.rollout=vllm (the "
                             "hf engine samples in this process)")
        if self.rollout_devices and len(self.rollout_devices) != self.rollout_servers:
            raise ValueError(f"domain.rollout_devices names {len(self.rollout_devices)} devices for "
                             f"{self.rollout_servers} rollout servers: give one per server")
        if self.final not in FINALS:
            raise ValueError(f"domain.final must be one of {', '.join(FINALS)}, got {self.final!r}")
        if self.sandbox_slots is not None and self.sandbox_slots < 1:
            raise ValueError(f"domain.sandbox_slots must be >= 1 (or null: one per core), got {self.sandbox_slots!r}")
        if not self.timeout_scale > 0:
            raise ValueError(f"domain.timeout_scale must be > 0, got {self.timeout_scale!r}")
        if self.rollout not in ENGINES:
            raise ValueError(f"domain.rollout must be one of {', '.join(ENGINES)}, got {self.rollout!r}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"domain.executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        if self.ray_address is not None and self.executor != "ray":
            raise ValueError("domain.ray_address is set but domain.executor is not ray: set domain.executor=ray")


@dataclass
class CodeFeaturesConfig(WorldModelConfig):
    """`code-ridge`: hashed (task, code) features -> a bootstrap ridge ensemble."""

    dim: int = 512  # hashed code-feature buckets
    members: int = 8  # ensemble members

    def validate(self) -> None:
        at_least(self, "world_model", 2, "dim")
        at_least(self, "world_model", 1, "members")


@dataclass
class CodeGaussianConfig(CodeFeaturesConfig):
    """`code-gaussian`: the same features -> a deep ensemble of heteroscedastic MLPs trained by NLL."""

    members: int = 5
    # a fit is ~100 ms every step: by default it overlaps the update and the next step's real execution
    runtime: RuntimeConfig = field(default_factory=lambda: RuntimeConfig(background_fit=True))


@dataclass
class CodeLLMConfig(WorldModelConfig):
    """`code-llm`: the agent's own LM (a separate copy) fine-tuned online to write the outcome."""

    samples: int = 4  # sampled outcomes per trajectory (mean and variance)
    max_new_tokens: int = 48
    fit_steps: int = 8  # fine-tuning steps per fit, capped by fit_seconds
    fit_seconds: float = 10.0
    #: where outcomes are sampled: "hf" (this process) or "vllm" (a vLLM server, synced after every fit)
    rollout: str = "hf"

    def validate(self) -> None:
        if self.rollout not in ENGINES:
            raise ValueError(f"world_model.rollout must be one of {', '.join(ENGINES)}, got {self.rollout!r}")
        at_least(self, "world_model", 1, "samples", "max_new_tokens")
        at_least(self, "world_model", 0, "fit_steps", "fit_seconds")


def task_spec(task: ARTask) -> TaskSpec:
    """What a solution script must know about a task (the corpus generator's input)."""
    import pandas as pd

    features = pd.concat([train_frame(task), test_frame(task)])[list(task.feature_columns)]
    text = any(not pd.api.types.is_numeric_dtype(features[c]) for c in features.columns)
    return spec_for(task.task_type, task.target_columns, task.metric, task.value_columns, task.id_column, text,
                    bool(features.isna().to_numpy().any()))


@DOMAINS.register("autoresearch")
class AutoResearchDomain(Domain):
    config_class = AutoResearchConfig
    default_world_model = "code-ridge"

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
        from wmrl.domains.autoresearch.agent import AgentConfig, build_default_agent

        cache = Path(self.cfg.cache_dir) / "agents" if self.cfg.cache_dir else None
        return str(build_default_agent(
            cache, specs_and_prompts=self._corpus_tasks,
            n_examples=self.cfg.agent_examples, max_minutes=self.cfg.agent_max_minutes,
            config=AgentConfig(max_steps=self.cfg.agent_steps),
        ))

    def prior_examples(self, n: int, seed) -> list[tuple[str, str]]:
        """Fresh examples of the embedded agent's SFT corpus (the training tasks' prompts and synthetic tasks of
        every kind, `corpus.generate_corpus`) as (prompt, reply) pairs, for `trainer.objective.ptx`."""
        from wmrl.domains.autoresearch.corpus import generate_corpus

        draw = int(np.random.SeedSequence(list(seed)).generate_state(1)[0])
        return [(prompt, format_reply(script)) for prompt, script in generate_corpus(self._corpus_tasks, n, draw)]

    @cached_property
    def _corpus_tasks(self) -> list[tuple[TaskSpec, str]]:
        return [(task_spec(t), t.description) for t in split(self.suite, "train")]

    def provenance(self) -> dict[str, str]:
        """The versions of the libraries the agent's programs import, which the project does not pin and which
        change what a program does (pandas 3 reads text columns as its own string dtype); with `agent: default`
        also the agent's build, keyed by the corpus, its code and the training tasks: its cache folder."""
        stamp = {lib: version(lib) for lib in PROGRAM_LIBRARIES}
        if self.cfg.agent == "default":
            stamp["agent"] = Path(self.agent_path()).name
        return stamp

    def episode_stats(self, trajectory: Trajectory) -> dict[str, float]:
        """`parsed`: the share of the episode's replies that hold a python code block."""
        if not trajectory.actions:
            return {}
        return {"parsed": sum(extract_code(a) is not None for a in trajectory.actions) / len(trajectory.actions)}

    def make_policy(self, seed: int) -> Policy:
        from wmrl.domains.autoresearch.policy import CodeAgentPolicy

        return CodeAgentPolicy(self.agent_path(), max_new_tokens=self.cfg.max_new_tokens,
                               temperature=self.cfg.temperature, lora=self.cfg.lora, seed=seed,
                               rollout=self.cfg.rollout, rollout_servers=self.cfg.rollout_servers,
                               rollout_devices=self.cfg.rollout_devices)

    def make_real_env(self) -> RealEnv:
        from wmrl.domains.autoresearch.env import AutoResearchEnv

        slots = self.cfg.sandbox_slots or os.cpu_count() or 1
        if self.cfg.executor == "ray":
            from wmrl.domains.autoresearch.ray_pool import RaySandboxPool

            pool = RaySandboxPool(slots, address=self.cfg.ray_address)
        else:
            from wmrl.domains.autoresearch.sandbox import SandboxPool

            pool = SandboxPool(slots)
        return AutoResearchEnv(pool, turns=self.cfg.turns, final=self.cfg.final,
                               timeout_scale=self.cfg.timeout_scale, memory_mb=self.cfg.memory_mb)

    def code_outcome_model(self, wm: CodeFeaturesConfig, regressor=None) -> WorldModel:
        from wmrl.domains.autoresearch.world_model import CodeOutcomeModel

        families = [t.family for t in split(self.suite, "train")]
        return CodeOutcomeModel(families, turns=self.cfg.turns, final=self.cfg.final, dim=wm.dim,
                                members=wm.members, regressor=regressor)


@register_world_model("code-ridge", domains=["autoresearch"], config=CodeFeaturesConfig)
def _code_ridge(domain: AutoResearchDomain, wm: CodeFeaturesConfig) -> WorldModel:
    """(task, code) features -> bootstrap ridge ensemble: milliseconds per fit."""
    return domain.code_outcome_model(wm)


@register_world_model("code-gaussian", domains=["autoresearch"], config=CodeGaussianConfig)
def _code_gaussian(domain: AutoResearchDomain, wm: CodeGaussianConfig) -> WorldModel:
    """(task, code) features -> deep ensemble of heteroscedastic MLPs trained by NLL."""
    from wmrl.world_models.gaussian_ensemble import GaussianEnsemble

    return domain.code_outcome_model(wm, GaussianEnsemble(members=wm.members))


@register_world_model("code-llm", domains=["autoresearch"], config=CodeLLMConfig)
def _code_llm(domain: AutoResearchDomain, wm: CodeLLMConfig) -> WorldModel:
    """The agent's own LM (a separate copy), prompted with task and code to write the outcome."""
    from wmrl.domains.autoresearch.llm_world_model import LLMOutcomeModel

    c = domain.cfg
    return LLMOutcomeModel(domain.agent_path(), turns=c.turns, final=c.final, samples=wm.samples,
                           max_new_tokens=wm.max_new_tokens, fit_steps=wm.fit_steps, fit_seconds=wm.fit_seconds,
                           rollout=wm.rollout)
