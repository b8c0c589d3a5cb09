"""Batched sampling from a causal LM with per-token log-probabilities, and scoring of given replies.

`sample` runs the token loop itself (a KV cache, left-padded rows, the caller's
`torch.Generator`) instead of `model.generate`, for two reasons: the draw is
reproducible without touching torch's global RNG, and the log-probability of
every sampled token is kept -- under the *temperature-1* distribution, which
is what `score` (summed) and `token_scores` (per token) recompute with one
batched forward pass and what a policy
gradient's ratio needs. A row stops at any of `stop_ids` (the stop token is
reported, not included in `tokens`) or after `max_new_tokens`.

Works with any causal LM whose forward takes `input_ids`, `attention_mask`,
`position_ids` and a KV cache and returns `.logits` (Hugging Face's do).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Sequence

import torch

from wmrl.lm.batch import left_pad

__all__ = ["Sampled", "SamplingParams", "sample", "score", "token_scores"]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0: greedy
    stop_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")


@dataclass
class Sampled:
    """One sampled reply: its tokens (the stop token excluded), the stop token if one ended it."""

    tokens: list[int]
    stop: int | None
    token_log_probs: list[float] = field(default_factory=list)  # temperature 1; the stop token's last

    @property
    def log_prob(self) -> float:
        return float(sum(self.token_log_probs))


def _forward_args(module: torch.nn.Module) -> tuple[bool, str]:
    params = inspect.signature(type(module).forward).parameters
    # transformers >= 5.2x names the KV cache `cache` (`past_key_values` before)
    return "logits_to_keep" in params, "cache" if "cache" in params else "past_key_values"


def _on_device(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator on the model's device, seeded by one draw of `generator` (the trainer's host generator).

    Sampling with a host generator from logits on a GPU would copy a [batch, vocab] row of probabilities
    to the host at every token; one seed drawn per call keeps the draw a function of the caller's
    generator without that copy. On the generator's own device it is used as it is.
    """
    if generator is None or generator.device == device:
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


def _nonempty(prompts: Sequence[Sequence[int]], pad_id: int) -> list[list[int]]:
    # position -1 must exist in every row: an empty prompt (never after real encoding) becomes one pad token
    return [list(p) or [pad_id] for p in prompts]


@torch.no_grad()
def sample(module: torch.nn.Module, prompts: Sequence[Sequence[int]], params: SamplingParams, *, pad_id: int,
           generator: torch.Generator | None = None, greedy: bool = False) -> list[Sampled]:
    """One reply per prompt row (repeat a row to draw several)."""
    if not prompts:
        return []
    device = next(module.parameters()).device
    greedy = greedy or params.temperature == 0.0
    _, cache_arg = _forward_args(module)
    ids, mask, pos = left_pad(_nonempty(prompts, pad_id), pad_id, device)
    n = len(prompts)
    stops = torch.tensor(list(params.stop_ids) or [-1], device=device)
    out = module(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    past = getattr(out, cache_arg)
    logits = out.logits[:, -1].float()
    next_pos = pos[:, -1] + 1
    done = torch.zeros(n, dtype=torch.bool, device=device)
    rows = [Sampled([], None) for _ in range(n)]
    draw = None if greedy else _on_device(generator, device)
    for step in range(params.max_new_tokens):
        logp = torch.log_softmax(logits, dim=-1)
        if greedy:
            tok = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / params.temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=draw).squeeze(-1)
        tok_lp = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1).tolist()
        is_stop = torch.isin(tok, stops)
        tok_list, stop_list = tok.tolist(), is_stop.tolist()
        for i in torch.nonzero(~done).flatten().tolist():
            rows[i].token_log_probs.append(tok_lp[i])
            if stop_list[i]:
                rows[i].stop = tok_list[i]
            else:
                rows[i].tokens.append(tok_list[i])
        done = done | is_stop
        if bool(done.all()) or step == params.max_new_tokens - 1:
            break
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
        out = module(input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=next_pos.unsqueeze(-1),
                     use_cache=True, **{cache_arg: past})
        past = getattr(out, cache_arg)
        logits = out.logits[:, -1].float()
        next_pos = next_pos + 1
    return rows


def token_scores(module: torch.nn.Module, prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], *,
                 pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature-1 log-probability of every reply token after its prompt, differentiable.

    Returns ([n, longest] log-probs, [n, longest] mask): each reply right-aligned in its row, the mask
    True on its tokens (in order) and the log-probs 0 elsewhere.
    """
    if len(prompts) != len(replies):
        raise ValueError(f"{len(prompts)} prompts but {len(replies)} replies")
    device = next(module.parameters()).device
    n_reply = torch.tensor([len(r) for r in replies], device=device, dtype=torch.long)
    longest = int(n_reply.max()) if len(replies) else 0
    if longest == 0:
        return torch.zeros(len(prompts), 0, device=device), torch.zeros(len(prompts), 0, dtype=torch.bool, device=device)
    keep_arg, _ = _forward_args(module)
    seqs = [p + list(r) for p, r in zip(_nonempty(prompts, pad_id), replies)]
    ids, mask, pos = left_pad(seqs, pad_id, device)
    kwargs = {"logits_to_keep": longest + 1} if keep_arg else {}
    logits = module(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, **kwargs).logits
    logits = logits[:, -(longest + 1):-1].float()  # position t predicts token t+1
    token_lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, -longest:].unsqueeze(-1)).squeeze(-1)
    in_reply = torch.arange(longest, device=device).unsqueeze(0) >= (longest - n_reply).unsqueeze(1)
    return token_lp * in_reply, in_reply


def score(module: torch.nn.Module, prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], *,
          pad_id: int) -> torch.Tensor:
    """Temperature-1 log-probability of each reply after its prompt, differentiable: shape [n]."""
    return token_scores(module, prompts, replies, pad_id=pad_id)[0].sum(-1)
