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

`act` samples through a rollout engine (`lm/engines.py`): by default the LM
toolkit's `sample` on this module (`lm/sampling.py`: a KV cache, batched, left
padded, the caller's `torch.Generator`, at `temperature`), or a vLLM server
whose weights `weights_changed` syncs after every update (`rollout="vllm"`); it
returns the log-probability of the sampled tokens under the *temperature-1*
distribution -- the quantity `log_prob` recomputes with `score`. The encoding
rules are the toolkit's (`lm/tokens.py`). When the sampled tokens
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

from typing import Any, Sequence

import torch

from wmrl.core.interfaces import Policy
from wmrl.domains.autoresearch.protocol import ASSISTANT_MARK
from wmrl.lm.engines import ENGINES, RolloutEngine, open_engine
from wmrl.lm.lora import LoraSettings, apply_lora, merged
from wmrl.lm.sampling import SamplingParams, score, token_scores
from wmrl.lm.tokens import decode, encode_prompt, encode_reply, prompt_budget, special_tokens

__all__ = ["CodeAgentPolicy"]


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
        lora: LoraSettings | None = None,
        seed: int = 0,
        rollout: str = "hf",
        rollout_servers: int = 1,
        rollout_devices: Sequence[str] = (),
    ):
        """`lora` with r > 0 trains low-rank adapters only (`lm/lora.py`); `seed` draws their initial weights;
        `rollout`: the engine replies are sampled with, "hf" (this process) or "vllm" (`lm/engines.py`), on
        `rollout_servers` vLLM servers (server i on `rollout_devices[i]`, a CUDA_VISIBLE_DEVICES value)."""
        if rollout not in ENGINES:
            raise ValueError(f"rollout engine must be one of {', '.join(ENGINES)}, got {rollout!r}")
        # a local directory or a Hub id; from_pretrained resolves both (offline: local only)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.name = str(model_name_or_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.name)
        self.module = AutoModelForCausalLM.from_pretrained(self.name, dtype=dtype)
        if lora is not None and lora.enabled:
            self.module = apply_lora(self.module, lora, seed=seed)
        self.module.eval()
        if device is not None:
            self.module.to(device)
        self.tokens = special_tokens(self.tokenizer, self.module, who=self.name)
        self.eos_id, self.pad_id = self.tokens.eos_id, self.tokens.pad_id
        self.params = SamplingParams(int(max_new_tokens), float(temperature), self.tokens.stop_ids)
        self.max_new_tokens = self.params.max_new_tokens
        self.temperature = self.params.temperature
        self.batch_size = int(batch_size)
        self.max_prompt_tokens = prompt_budget(self.tokens.context, max_prompt_tokens, self.max_new_tokens,
                                               minimum=16)
        #: replies sampled, and how many of them were re-scored because their tokens were not canonical
        self.stats = {"replies": 0, "recomputed": 0}
        self.rollout, self.rollout_servers, self.rollout_devices = rollout, int(rollout_servers), list(rollout_devices)
        self._engine: RolloutEngine | None = None  # started on first use: a learner rank never samples

    # ------------------------------------------------------------------ tokenisation contract

    def prompt_ids(self, observation: str) -> list[int]:
        return encode_prompt(self.tokenizer, str(observation), self.max_prompt_tokens, head_until=ASSISTANT_MARK)

    def reply_ids(self, reply: str) -> list[int]:
        return encode_reply(self.tokenizer, reply, self.eos_id, self.max_new_tokens)

    def _device(self) -> torch.device:
        return next(self.module.parameters()).device

    def save_pretrained(self, path: str) -> None:
        """A standard HF model folder (adapters merged into the weights) with the tokenizer."""
        merged(self.module).save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    @property
    def engine(self) -> RolloutEngine:
        if self._engine is None:
            self._engine = open_engine(self.rollout, self.module, self.pad_id, self.name,
                                       servers=self.rollout_servers, devices=self.rollout_devices)
        return self._engine

    def weights_changed(self) -> None:
        if self._engine is not None:
            self._engine.sync(self.module)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    # ------------------------------------------------------------------ Policy API

    def log_prob(self, observations: Sequence[Any], actions: Sequence[Any]) -> torch.Tensor:
        """Sum of reply-token log-probs (temperature 1) of each (observation, reply), shape [n]."""
        if len(observations) != len(actions):
            raise ValueError(f"{len(observations)} observations but {len(actions)} actions")
        if not observations:
            return torch.zeros(0, device=self._device())
        prompts = [self.prompt_ids(o) for o in observations]
        replies = [self.reply_ids(a) for a in actions]
        return score(self.module, prompts, replies, pad_id=self.pad_id)

    def token_log_probs(self, observations: Sequence[Any], actions: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per reply token (EOS included when `reply_ids` has it): log-probs [n, T] and their mask."""
        if len(observations) != len(actions):
            raise ValueError(f"{len(observations)} observations but {len(actions)} actions")
        prompts = [self.prompt_ids(o) for o in observations]
        return token_scores(self.module, prompts, [self.reply_ids(a) for a in actions], pad_id=self.pad_id)

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
        prompts = [self.prompt_ids(o) for o in obs]
        drawn = self.engine.generate(prompts, self.params, generator=generator, greedy=greedy)
        replies = [decode(self.tokenizer, d.tokens) for d in drawn]
        log_probs = [d.log_prob for d in drawn]
        # where the sampled tokens are not the canonical encoding of the decoded text, score the
        # canonical one (what log_prob will see) so the two always agree
        redo = [i for i, (text, d) in enumerate(zip(replies, drawn))
                if self.reply_ids(text) != (d.tokens if d.stop is None else d.tokens + [d.stop])]
        self.stats["replies"] += len(obs)
        self.stats["recomputed"] += len(redo)
        if redo:
            lp = score(self.module, [prompts[i] for i in redo], [self.reply_ids(replies[i]) for i in redo],
                       pad_id=self.pad_id)
            for i, v in zip(redo, lp.tolist()):
                log_probs[i] = v
        return replies, [float(v) for v in log_probs]
