"""LoRA (PEFT) on a causal-LM policy through the DeepSpeed engine: adapters train, checkpoints hold only them,
and the export is a plain model folder that `from_pretrained` loads without peft and that scores as the policy did."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from wmrl.core.engine import Engine, EngineConfig  # noqa: E402
from wmrl.domains.autoresearch.policy import CodeAgentPolicy  # noqa: E402
from wmrl.lm.lora import LoraSettings, apply_lora  # noqa: E402

OBS = ["<|user|>\ntask 3: fit a model to column y0\n<|assistant|>\n", "<|user|>\ntask 7: fit\n<|assistant|>\n"]
REPLIES = ["import numpy as np\nprint(3)\n", "print(7)\n"]


def _policy(path, r=4, seed=0):
    return CodeAgentPolicy(str(path), max_new_tokens=16, max_prompt_tokens=64, lora=LoraSettings(r=r), seed=seed)


def _trained(policy, tmp_path, steps=3):
    engine = Engine(policy.module, EngineConfig(lr=1e-2))
    for _ in range(steps):
        engine.step(-policy.log_prob(OBS, REPLIES).mean())
    return engine


def test_only_the_adapters_train_and_checkpoints_hold_only_them(tiny_lm, tmp_path):
    _, _, path = tiny_lm
    policy = _policy(path)
    base = {n: p.detach().clone() for n, p in policy.module.named_parameters() if not p.requires_grad}
    trainable = [n for n, p in policy.module.named_parameters() if p.requires_grad]
    total = sum(p.numel() for p in policy.module.parameters())
    assert trainable and all("lora_" in n for n in trainable)
    assert sum(p.numel() for p in policy.module.parameters() if p.requires_grad) < 0.2 * total
    before = policy.log_prob(OBS, REPLIES).detach()
    engine = _trained(policy, tmp_path)
    assert (policy.log_prob(OBS, REPLIES).detach() > before).all()  # the adapters moved the policy
    assert all(torch.equal(p, base[n]) for n, p in policy.module.named_parameters() if n in base)

    engine.save(tmp_path / "ckpt", "step1", {"step": 1})
    saved = torch.load(next((tmp_path / "ckpt" / "step1").glob("*model_states.pt")), weights_only=False)["module"]
    assert set(saved) == set(trainable)  # adapter-only: no frozen base weight in the checkpoint

    fresh = _policy(path, seed=1)  # other initial adapters, the same base
    assert not torch.allclose(fresh.log_prob(OBS, REPLIES), policy.log_prob(OBS, REPLIES))
    assert Engine(fresh.module, EngineConfig(lr=1e-2)).load(tmp_path / "ckpt") == {"step": 1}
    assert torch.allclose(fresh.log_prob(OBS, REPLIES), policy.log_prob(OBS, REPLIES), atol=1e-6)


def test_the_export_is_a_plain_model_folder_that_scores_and_acts_as_the_policy(tiny_lm, tmp_path):
    from transformers import AutoModelForCausalLM

    _, _, path = tiny_lm
    policy = _policy(path)
    _trained(policy, tmp_path)
    policy.save_pretrained(str(tmp_path / "export"))
    assert not (tmp_path / "export" / "adapter_config.json").exists()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    assert not any("lora_" in n for n, _ in plain.named_parameters())
    reloaded = CodeAgentPolicy(str(tmp_path / "export"), max_new_tokens=16, max_prompt_tokens=64)
    assert torch.allclose(reloaded.log_prob(OBS, REPLIES), policy.log_prob(OBS, REPLIES), atol=1e-5)
    assert reloaded.act(OBS, greedy=True)[0] == policy.act(OBS, greedy=True)[0]
    assert "lora_" in "".join(n for n, _ in policy.module.named_parameters())  # exporting merged a copy


def test_bad_lora_settings_are_clear_errors(tiny_lm):
    _, model, _ = tiny_lm
    with pytest.raises(ValueError, match=r"lora.target_modules \['c_attn'\] are not modules of LlamaForCausalLM; "
                                         r"its linear layers are named .*q_proj"):
        apply_lora(model, LoraSettings(r=4, target_modules=["c_attn"]))
    with pytest.raises(ValueError, match="lora.r must be an integer >= 0"):
        LoraSettings(r=-1).validate()
