"""bench/trl_grpo.run_trl: TRL's GRPOTrainer trains the agent on the real reward; the project's evaluator reads it.

A real (tiny) TRL run on the bundled suite: real sandboxed programs, real TRL
updates, TRL's own checkpoints evaluated by `Trainer.evaluate`. What makes the
comparison fair is checked against the project's own code: TRL's settings are
the run config's, its prompt tokens are the ones the project's policy samples
from, and its start is evaluated exactly as the `real` mode evaluates it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys

import pytest
import torch

if not sys.platform.startswith("linux") or os.geteuid() != 0:
    pytest.skip("the sandbox needs Linux and root", allow_module_level=True)

from transformers import AutoTokenizer

from wmrl.api import build_trainer
from wmrl.bench.speedup import SpeedupOptions
from wmrl.bench.trl_grpo import grpo_args, prompt_dataset, run_trl
from wmrl.config import load_config
from wmrl.core.registry import DOMAINS
from wmrl.domains.autoresearch.policy import CodeAgentPolicy


def _args(agent) -> list[str]:
    return [f"domain.agent={agent}", "domain.sandbox_slots=2", "trainer.steps=2", "trainer.groups_per_step=2",
            "trainer.group_size=2", "trainer.eval_every=1", "trainer.eval_samples=1", "trainer.eval_splits=[test_id]",
            "trainer.objective.ptx=0"]  # TRL has no prior-data term


def test_trl_is_configured_from_the_run_config(tmp_path):
    cfg = load_config("autoresearch", ["engine.lr=3e-4", "engine.grad_clip=0.5", "engine.weight_decay=0.01",
                                       "trainer.clip_eps=0.3", "trainer.objective.beta=0.02", "trainer.steps=7",
                                       "trainer.eval_every=3", "estimator.advantage.standardize=false",
                                       "domain.max_new_tokens=99", "domain.temperature=0.7", "trainer.seed=4"])
    a = grpo_args(cfg, tmp_path, (1, 5))
    t = cfg.trainer
    # one generation batch (groups_per_step prompts x group_size completions) per optimizer step
    assert (a.per_device_train_batch_size, a.gradient_accumulation_steps, a.num_generations) == (
        t.groups_per_step * t.group_size, 1, t.group_size)
    assert (a.max_steps, a.num_iterations, a.save_steps, a.seed) == (7, t.ppo_epochs, 3, 4)
    assert (a.learning_rate, a.max_grad_norm, a.weight_decay, a.warmup_steps) == (3e-4, 0.5, 0.01, 0)
    assert a.lr_scheduler_type == "constant"  # a str enum
    assert (a.epsilon, a.beta, a.scale_rewards) == (0.3, 0.02, "none")
    assert (a.max_completion_length, a.temperature, a.top_p, a.top_k) == (99, 0.7, 1.0, 0)
    assert a.generation_kwargs == {"eos_token_id": [1, 5]}
    # the machinery as our engine's: no activation recomputation (TRL's default), its device and precision
    assert not a.gradient_checkpointing and a.bf16 == cfg.engine.bf16 and a.use_cpu == (not torch.cuda.is_available())


def test_trl_is_offered_for_autoresearch_only():
    SpeedupOptions(config="autoresearch", modes="real,wmrl,trl").validate()
    with pytest.raises(ValueError, match="config=autoresearch only"):
        SpeedupOptions(config="synthetic-program", modes="real,trl").validate()
    for override, needle in (("domain.lora.r=4", "domain.lora"), ("trainer.ppo_epochs=2", "ppo_epochs=1"),
                             ("trainer.objective.beta=0.01", "beta=0"), ("trainer.objective.ptx=0.5", "ptx=0"),
                             ("engine.world_size=2", "world_size=1")):
        with pytest.raises(ValueError, match=needle):
            run_trl("autoresearch", [override], "unused", "trl", 0)


def test_trl_samples_from_the_prompt_tokens_the_project_policy_samples_from(suite_agent):
    domain = DOMAINS.get("autoresearch")(load_config("autoresearch", [f"domain.agent={suite_agent}"]).domain)
    prompts = list(prompt_dataset(domain)["prompt"])
    policy = CodeAgentPolicy(str(suite_agent), max_new_tokens=320)
    # GRPOTrainer._tokenize_prompts on standard (text) prompts: processing_class(text=prompts)
    assert AutoTokenizer.from_pretrained(str(suite_agent))(text=prompts)["input_ids"] == [
        policy.prompt_ids(p) for p in prompts]


def test_a_trl_run_is_evaluated_at_its_checkpoints_by_the_project_evaluator_and_read_back(suite_agent, tmp_path):
    run = tmp_path / "trl"
    rec = run_trl("autoresearch", _args(suite_agent), run, "trl", 0)
    assert (rec.mode, rec.seed, rec.steps) == ("trl", 0, 2)
    assert [h["step"] for h in rec.history] == [0, 1, 2]
    assert [h["real_executions"] for h in rec.history] == [0, 4, 8] and rec.real_executions == 8
    walls = [h["wall"] for h in rec.history]
    assert walls[0] == 0.0 < walls[1] < walls[2] == rec.wall and 0.0 < rec.real_wall < rec.wall
    assert all(0.0 <= h["eval_test_id"] <= 1.0 for h in rec.history)
    # TRL's own checkpoints were what got evaluated, each in an evaluation run of its own
    for step in (1, 2):
        assert (run / "trl" / f"checkpoint-{step}" / "model.safetensors").is_file()
        assert (run / "eval" / f"step{step}" / "store.sqlite").is_file()
    logged = [json.loads(line) for line in (run / "trl_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged if "reward" in row] == [1, 2]

    # the start is evaluated exactly as the real mode evaluates it: same agent, same draws
    real = build_trainer(load_config("autoresearch", [*_args(suite_agent), "estimator.mode=real", "trainer.seed=0",
                                                      f"run_dir={tmp_path / 'real'}", "tensorboard=false"]))
    try:
        assert real.evaluate("test_id")["reward"] == rec.history[0]["eval_test_id"]
    finally:
        real.close()

    shutil.rmtree(run / "trl")  # a finished run is read back, not trained again
    again = run_trl("autoresearch", _args(suite_agent), run, "trl", 0, reuse=True)
    assert (again.history, again.wall, again.real_executions) == (rec.history, rec.wall, rec.real_executions)
    assert math.isnan(again.signal_cosine)
