"""Token-level contract of a causal LM: its special tokens, prompt budget, and how text becomes ids.

A policy's `act` and `log_prob`, an LLM world model's sampling and its online
fit, and the SFT that builds a model must all turn text into the same ids, or
a behaviour log-prob is scored on different tokens than were sampled. So the
rules live here once:

* `special_tokens`: EOS from the tokenizer, else the model config; every
  `generation_config.eos_token_id` also stops a reply; PAD falls back to EOS.
* `prompt_budget`: prompt tokens left once `max_new_tokens` fit the context.
* `encode_prompt`: the tokenizer's own special tokens (e.g. a BOS); an
  over-long prompt loses its *middle*: the head (up to the end of the first
  `head_until` marker, e.g. the first assistant cue, capped at half the
  budget) holds the task, the tail the latest turns and the answer cue.
* `encode_reply`: no special tokens, then EOS, unless the reply reached the
  `max_tokens` cap (a reply that long was cut there and never sampled EOS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SpecialTokens", "decode", "encode_prompt", "encode_reply", "prompt_budget", "special_tokens"]


@dataclass(frozen=True)
class SpecialTokens:
    eos_id: int
    pad_id: int
    stop_ids: tuple[int, ...]  # every token that ends a reply (EOS among them)
    context: int | None  # the model's position limit, when its config says


def special_tokens(tokenizer: Any, model: Any, *, who: str = "the model") -> SpecialTokens:
    """EOS, PAD, the stop tokens and the context length of a tokenizer + causal LM."""
    cfg = getattr(model, "config", None)
    eos = tokenizer.eos_token_id
    if eos is None:
        eos = getattr(cfg, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    if eos is None:
        raise ValueError(f"{who}: the tokenizer has no EOS token, so a reply could never end; "
                         "set tokenizer.eos_token (or the model config's eos_token_id)")
    stops = {int(eos)}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    stops.update([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or []))
    pad = tokenizer.pad_token_id
    context = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    return SpecialTokens(int(eos), int(pad) if pad is not None else int(eos), tuple(sorted(int(s) for s in stops)),
                         int(context) if context is not None else None)


def prompt_budget(context: int | None, max_prompt_tokens: int, max_new_tokens: int, *, minimum: int = 8) -> int:
    """`max_prompt_tokens`, lowered so that prompt + reply fit `context`; an error when little is left."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    budget = int(max_prompt_tokens) if context is None else min(int(max_prompt_tokens), int(context) - max_new_tokens)
    if budget < minimum:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in a {context}-token context "
                         f"(at least {minimum} prompt tokens needed); lower max_new_tokens")
    return budget


def encode_prompt(tokenizer: Any, text: str, max_tokens: int, *, head_until: str | None = None) -> list[int]:
    """Prompt ids within `max_tokens`, cutting the middle of a long one (see the module docstring)."""
    offsets_ok = head_until is not None and bool(getattr(tokenizer, "is_fast", False))
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=offsets_ok)
    ids = list(enc["input_ids"])
    if len(ids) <= max_tokens:
        return ids
    head = max_tokens // 2
    cut = text.find(head_until) if head_until is not None else -1
    offsets = enc.get("offset_mapping") if offsets_ok and hasattr(enc, "get") else None
    if cut >= 0 and offsets is not None:
        cut += len(head_until)
        first_turn = sum(1 for (s, e) in offsets if s < cut or (s == e == 0))
        head = min(head, first_turn)
    return ids[:head] + ids[len(ids) - (max_tokens - head):]


def encode_reply(tokenizer: Any, text: str, eos_id: int, max_tokens: int | None = None) -> list[int]:
    """Reply ids and its EOS, unless it reached `max_tokens` (cut there, it never sampled EOS)."""
    ids = list(tokenizer(str(text), add_special_tokens=False)["input_ids"])
    return ids + [eos_id] if max_tokens is None or len(ids) < max_tokens else ids


def decode(tokenizer: Any, ids: list[int], *, skip_special_tokens: bool = False) -> str:
    """Text of `ids` exactly as tokenized (no clean-up of spaces)."""
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
