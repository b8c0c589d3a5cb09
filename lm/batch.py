"""Padding a batch of token sequences for a causal LM: left for generation and scoring, right for SFT.

Left padding puts every row's last real token in the last column, so one
forward pass gives each row's next-token logits at position -1; positions
restart at 0 on the first real token (`position_ids`), so a padded row sees the
same positions as it would alone. SFT rows are right padded and their labels
are -100 (ignored by the loss) everywhere but on the target tokens: the prompt
is context, not something to learn to write.
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["left_pad", "sft_batch"]


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int,
             device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids), left padded to the longest row."""
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, length - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, length - len(s):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def sft_batch(prompts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], pad_id: int,
              device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels) of prompt + target rows, right padded; labels only on targets."""
    if len(prompts) != len(targets):
        raise ValueError(f"{len(prompts)} prompts but {len(targets)} targets")
    seqs = [list(p) + list(t) for p, t in zip(prompts, targets)]
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    labels = torch.full((len(seqs), length), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for r, (p, s) in enumerate(zip(prompts, seqs)):
        row = torch.as_tensor(s, dtype=torch.long)
        ids[r, :len(s)] = row
        mask[r, :len(s)] = 1
        labels[r, len(p):len(s)] = row[len(p):]
    return ids.to(device), mask.to(device), labels.to(device)
