"""CodeAgentPolicy: a Hugging Face causal LM that answers a task prompt with a script.

Observations are strings: the whole conversation so far (`format_prompt` for
turn 1; `next_observation` appends a reply and its sandbox feedback for the
next turn). Actions are the decoded reply strings.

Tokenisation is the contract between `act` and `log_prob`: a pair
(observation, reply) is scored as `prompt_ids(observation) + reply_ids(reply)`,
each encoded on its own (so the boundary never merges), where

* `prompt_ids` encodes the observation with the tokenizer's own special tokens
  (e.g. a BOS) and, when it is longer than `max_prompt_tokens`, cuts the
  *middle*: it keeps the head -- the first user turn, i.e. the task
  description, up to half the budget -- and the most recent tokens (the latest
  feedback and the assistant cue), dropping the oldest turns in between;
* `reply_ids` encodes the reply without special tokens and appends the EOS
  token when the reply is shorter than `max_new_tokens` tokens (a reply that
  long was cut at the cap, so it has no EOS; shorter ones ended by sampling
  EOS).

`act` samples token by token with a KV cache (batched, left padded) using the
caller's `torch.Generator`, at `temperature`, and returns the log-probability
of the sampled tokens under the *temperature-1* distribution -- the quantity
`log_prob` recomputes with one batched forward pass. When the sampled tokens
are not what re-encoding the decoded reply gives (a non-canonical BPE split, a
broken UTF-8 sequence, a secondary stop token), `act` returns the recomputed
log-probability of the canonical encoding instead, so `log_prob(obs,
act(obs))` always agrees with what `act` returned (`stats` counts how often).

Any causal LM loads (`model_name_or_path` is a local directory or a Hub id);
the conversation text uses the chat protocol's plain-text role markers
(`protocol.py`), not a Hub chat model's own template, and a reply ends at the tokenizer's EOS (or any
`generation_config.eos_token_id`).
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch

from wmrl.core.interfaces import Policy
from wmrl.domains.autoresearch.protocol import ASSISTANT_MARK

__all__ = ["CodeAgentPolicy", "truncate_prompt_ids"]


def truncate_prompt_ids(tokenizer: Any, text: str, max_tokens: int) -> list[int]:
    """Encode a prompt; if it is too long keep its head (the task description) and its tail.

    The head is the tokens of the first turn (up to the end of the first
    assistant cue), capped at half of `max_tokens`; the rest of the budget goes
    to the most recent tokens.
    """
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=bool(getattr(tokenizer, "is_fast", False)))
    ids = list(enc["input_ids"])
    if len(ids) <= max_tokens:
        return ids
    head = max_tokens // 2
    cut = text.find(ASSISTANT_MARK)
    offsets = enc.get("offset_mapping") if hasattr(enc, "get") else None
    if cut >= 0 and offsets is not None:
        cut += len(ASSISTANT_MARK)
        first_turn = sum(1 for (s, e) in offsets if s < cut or (s == e == 0))
        head = min(head, first_turn)
    tail = max_tokens - head
    return ids[:head] + ids[len(ids) - tail:]


class CodeAgentPolicy(Policy):
    """A causal LM policy over reply strings (see the module docstring for the token contract)."""

    def __init__(
        self,
        model_name_or_path: str,
        *,
        max_new_tokens: int = 512,
        temperature: float = 1.0,
        max_prompt_tokens: int = 1024,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        batch_size: int = 64,
    ):
        # a local directory or a Hub id; from_pretrained resolves both (offline: local only)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if temperature < 0:
            raise ValueError("temperature must be >= 0 (0 = greedy)")
        self.name = str(model_name_or_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.name)
        self.module = AutoModelForCausalLM.from_pretrained(self.name, dtype=dtype)
        self.module.eval()
        if device is not None:
            self.module.to(device)
        cfg = self.module.config
        self.temperature = float(temperature)
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        context = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        self.max_prompt_tokens = int(max_prompt_tokens)
        if context is not None and self.max_prompt_tokens + self.max_new_tokens > context:
            self.max_prompt_tokens = int(context) - self.max_new_tokens
            if self.max_prompt_tokens < 16:
                raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in a {context}-token context")
        eos = self.tokenizer.eos_token_id
        if eos is None:
            eos = getattr(cfg, "eos_token_id", None)
            eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        if eos is None:
            raise ValueError(f"{self.name}: the tokenizer has no EOS token")
        self.eos_id = int(eos)
        stops = {self.eos_id}
        gen_eos = getattr(getattr(self.module, "generation_config", None), "eos_token_id", None)
        stops.update([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or []))
        self.stop_ids = sorted(int(s) for s in stops)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_id
        #: replies sampled, and how many of them were re-scored because their tokens were not canonical
        self.stats = {"replies": 0, "recomputed": 0}
        params = inspect.signature(type(self.module).forward).parameters
        self._keep_arg = "logits_to_keep" in params
        # transformers >= 5.2x names the KV cache `cache` (`past_key_values` before)
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    # ------------------------------------------------------------------ tokenisation contract

    def prompt_ids(self, observation: str) -> list[int]:
        return truncate_prompt_ids(self.tokenizer, str(observation), self.max_prompt_tokens)

    def reply_ids(self, reply: str) -> list[int]:
        ids = list(self.tokenizer(str(reply), add_special_tokens=False)["input_ids"])
        return ids + [self.eos_id] if len(ids) < self.max_new_tokens else ids

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _device(self) -> torch.device:
        return next(self.module.parameters()).device

    @staticmethod
    def _left_pad(seqs: Sequence[Sequence[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        length = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), length), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), length), dtype=torch.long)
        for i, s in enumerate(seqs):
            if s:
                ids[i, length - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
                mask[i, length - len(s):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        return ids.to(device), mask.to(device), pos.to(device)

    # ------------------------------------------------------------------ Policy API

    def log_prob(self, observations: Sequence[Any], actions: Sequence[Any]) -> torch.Tensor:
        """Sum of reply-token log-probs (temperature 1) of each (observation, reply), shape [n]."""
        if len(observations) != len(actions):
            raise ValueError(f"{len(observations)} observations but {len(actions)} actions")
        if not observations:
            return torch.zeros(0, device=self._device())
        prompts = [self.prompt_ids(o) for o in observations]
        replies = [self.reply_ids(a) for a in actions]
        return self._score(prompts, replies)

    def _score(self, prompts: list[list[int]], replies: list[list[int]]) -> torch.Tensor:
        device = self._device()
        n_reply = torch.tensor([len(r) for r in replies], device=device)
        longest = int(n_reply.max())
        if longest == 0:
            return torch.zeros(len(prompts), device=device)
        # a prompt is never empty after encoding in practice; guard so position -1 exists
        seqs = [(p or [self.eos_id]) + r for p, r in zip(prompts, replies)]
        ids, mask, pos = self._left_pad(seqs, self.pad_id, device)
        kwargs = {"logits_to_keep": longest + 1} if self._keep_arg else {}
        logits = self.module(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, **kwargs).logits
        logits = logits[:, -(longest + 1):-1].float()  # position t predicts token t+1
        targets = ids[:, -longest:]
        token_lp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        col = torch.arange(longest, device=device).unsqueeze(0)
        in_reply = col >= (longest - n_reply).unsqueeze(1)
        return (token_lp * in_reply).sum(-1)

    @torch.no_grad()
    def act(
        self,
        observations: Sequence[Any],
        *,
        generator: torch.Generator | None = None,
        greedy: bool = False,
    ) -> tuple[list[str], list[float]]:
        replies: list[str] = []
        log_probs: list[float] = []
        obs = list(observations)
        for start in range(0, len(obs), self.batch_size):
            r, lp = self._act_batch(obs[start:start + self.batch_size], generator, greedy)
            replies += r
            log_probs += lp
        return replies, log_probs

    def _act_batch(self, obs: list[Any], generator: torch.Generator | None, greedy: bool) -> tuple[list[str], list[float]]:
        if not obs:
            return [], []
        device = self._device()
        greedy = greedy or self.temperature == 0.0
        prompts = [self.prompt_ids(o) or [self.eos_id] for o in obs]
        ids, mask, pos = self._left_pad(prompts, self.pad_id, device)
        n = len(obs)
        stops = torch.tensor(self.stop_ids, device=device)
        out = self.module(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        past = getattr(out, self._cache_arg)
        logits = out.logits[:, -1].float()
        next_pos = pos[:, -1] + 1
        done = torch.zeros(n, dtype=torch.bool, device=device)
        total = torch.zeros(n, dtype=torch.float64, device=device)
        sampled: list[list[int]] = [[] for _ in range(n)]
        stopped: list[int | None] = [None] * n  # the stop token a reply ended with
        for step in range(self.max_new_tokens):
            logp = torch.log_softmax(logits, dim=-1)
            if greedy:
                tok = logits.argmax(-1)
            else:
                probs = torch.softmax(logits / self.temperature, dim=-1)
                gen_device = generator.device if generator is not None else probs.device
                tok = torch.multinomial(probs.to(gen_device), 1, generator=generator).squeeze(-1).to(device)
            live = ~done
            total += torch.where(live, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1).double(), 0.0)
            is_stop = torch.isin(tok, stops)
            tok_list, stop_list = tok.tolist(), is_stop.tolist()
            for i in torch.nonzero(live).flatten().tolist():
                if stop_list[i]:
                    stopped[i] = tok_list[i]
                else:
                    sampled[i].append(tok_list[i])
            done = done | is_stop
            if bool(done.all()) or step == self.max_new_tokens - 1:
                break
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
            out = self.module(input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=next_pos.unsqueeze(-1),
                              use_cache=True, **{self._cache_arg: past})
            past = getattr(out, self._cache_arg)
            logits = out.logits[:, -1].float()
            next_pos = next_pos + 1
        del past, out

        replies = [self._decode(s) for s in sampled]
        log_probs = total.tolist()
        # where the sampled tokens are not the canonical encoding of the decoded text, score the
        # canonical one (what log_prob will see) so the two always agree
        redo = []
        for i, (text, toks) in enumerate(zip(replies, sampled)):
            canonical = self.reply_ids(text)
            expected = toks if stopped[i] is None else toks + [stopped[i]]
            if canonical != expected:
                redo.append(i)
        self.stats["replies"] += n
        self.stats["recomputed"] += len(redo)
        if redo:
            lp = self._score([prompts[i] for i in redo], [self.reply_ids(replies[i]) for i in redo])
            for i, v in zip(redo, lp.tolist()):
                log_probs[i] = v
        return replies, [float(v) for v in log_probs]
