"""LoRA adapters (PEFT) on a causal LM: train a few million parameters instead of all of them.

`apply_lora` wraps a Hugging Face causal LM in a PEFT model whose only
trainable parameters are the low-rank adapters; the engine optimizes exactly
the parameters that require gradients, and checkpoints only those (the frozen
base comes from the same `from_pretrained` path at every start, so storing it
per checkpoint would only cost disk). `merged` folds the adapters into a copy
of the base weights, which is what an export writes: a plain model directory
that `from_pretrained` loads without peft.

The adapters' initial weights come from a generator seeded here (PEFT draws
them from torch's global RNG), so a run's start depends on its seed alone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

__all__ = ["LoraSettings", "apply_lora", "merged"]


@dataclass
class LoraSettings:
    #: adapter rank; 0 turns LoRA off (every weight trains)
    r: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    #: module names to adapt (Llama/Qwen attention projections by default)
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    @property
    def enabled(self) -> bool:
        return self.r > 0

    def validate(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 0:
            raise ValueError(f"lora.r must be an integer >= 0 (0: no LoRA), got {self.r!r}")
        if not self.alpha > 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        if self.enabled and not self.target_modules:
            raise ValueError("lora.target_modules is empty: name the linear layers to adapt (e.g. q_proj, v_proj)")


def apply_lora(model: torch.nn.Module, settings: LoraSettings, *, seed: int = 0) -> torch.nn.Module:
    """`model` with LoRA adapters on `settings.target_modules`; only the adapters require gradients."""
    from peft import LoraConfig, get_peft_model

    settings.validate()
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in settings.target_modules if t not in names]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"lora.target_modules {missing} are not modules of {type(model).__name__}; "
                         f"its linear layers are named {linear}")
    cfg = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                     target_modules=list(settings.target_modules), task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, cfg)


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model with the adapters folded into its weights (the input is left as it is)."""
    if not hasattr(model, "merge_and_unload"):
        return model
    return copy.deepcopy(model).merge_and_unload()
