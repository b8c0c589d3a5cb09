"""The embedded default agent: a tiny causal LM the project builds itself, offline, on CPU.

`build_default_agent` (a) generates the SFT corpus (`corpus.generate_corpus`:
the given tasks' prompts, half of them perturbed, some second-turn ones, plus
~20% synthetic tasks of every kind so that held-out descriptions and task kinds
still get valid scripts), (b) trains a byte-level BPE tokenizer on the prompts
and replies, (c) builds a small Llama-architecture causal LM, (d) fine-tunes it
on the replies (next-token loss on the reply tokens only; the prompt is
context) within a wall-clock budget, and (e) saves model and tokenizer with
`save_pretrained` into a cache directory keyed by a hash of everything that
determines the result. A second call with the same arguments returns the
cached path at once. `CodeAgentPolicy(path)` loads it like any Hub model.

The tokenizer is line-aware: its pre-tokenizer splits text after every newline
and isolates numbers, so BPE merges frequent whole lines of code
(`X_test = test[FEATURES]\\n`) into single tokens, rarer lines into pieces,
and every number (a hyperparameter value) is a token of its own. A script is
then ~35 tokens -- the tiny model trains on CPU in minutes and its sampled
replies are nearly always valid Python -- and the action space RL explores is
"which lines, which numbers". The 256 bytes of the ByteLevel alphabet are
always in the vocabulary, so any text encodes.

Training is deterministic given the seed as long as it finishes its step
budget (`AgentConfig.max_steps`, else its epochs) inside `max_minutes`; on a
slower (or busier) machine it stops at the time guard with the learning-rate
schedule compressed to fit (the schedule follows max(step fraction, time
fraction)), so the weights then depend on the speed; `stopped_by` in the
agent's metadata says which bound ended it.
The first steps alternate `threads` and 1 torch thread and keep the faster (on
a shared CPU one thread often wins). The cache key also hashes this file's,
corpus.py's and protocol.py's source, so editing the generator, the prompt
format or the trainer rebuilds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from wmrl.domains.autoresearch.corpus import CORPUS_VERSION, TaskSpec, generate_corpus
from wmrl.domains.autoresearch.protocol import ASSISTANT_MARK, END_MARK, SYSTEM_MARK, USER_MARK, format_reply
from wmrl.lm.batch import sft_batch
from wmrl.lm.tokens import encode_prompt, encode_reply

log = logging.getLogger(__name__)

AGENT_VERSION = "ar-agent-v2"
PAD_TOKEN = "<|pad|>"
DEFAULT_CACHE_DIR = Path("~/.cache/wmrl/agents")
META_FILE = "wmrl_agent.json"
_PROBE = 5  # steps per thread count in the probe


@dataclass(frozen=True)
class AgentConfig:
    """Model, tokenizer and SFT settings of the default agent (all part of the cache key)."""

    vocab_size: int = 4096  # an upper bound: a small corpus saturates BPE earlier
    hidden_size: int = 128  # 4 x 128 (~1.2M params): on a shared 2-core CPU, more steps beat more width
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    context: int = 2048
    max_prompt_tokens: int = 1024  # SFT prompts are truncated like CodeAgentPolicy's
    lr: float = 5e-3
    min_lr_frac: float = 0.05
    warmup_steps: int = 30
    weight_decay: float = 0.01
    batch_tokens: int = 6144  # padded tokens per batch (length-bucketed batches)
    max_batch_size: int = 32
    epochs: int = 20  # an upper bound
    #: the step budget (0: epochs only); the weights then do not depend on the machine's speed unless
    #: `max_minutes` (a guard) stops the run first
    max_steps: int = 0
    grad_clip: float = 1.0
    threads: int = 2  # torch threads for SFT (a probe falls back to 1 when that is faster)


def _cache_key(cfg: AgentConfig, pairs: Sequence[tuple[TaskSpec, str]], n_examples: int, seed: int,
               max_minutes: float) -> str:
    from wmrl.domains.autoresearch import corpus, protocol

    # the generator's, the prompt format's and the trainer's own source is part of the key: an edit rebuilds
    sources = (corpus.__file__, protocol.__file__, __file__)
    code = hashlib.sha256(b"".join(Path(f).read_bytes() for f in sources)).hexdigest()
    blob = json.dumps(
        {
            "corpus": CORPUS_VERSION,
            "agent": AGENT_VERSION,
            "code": code,
            "config": dataclasses.asdict(cfg),
            "tasks": [[dataclasses.asdict(s), d] for s, d in pairs],
            "n_examples": n_examples,
            "seed": seed,
            "max_minutes": max_minutes,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def train_tokenizer(texts: Sequence[str], cfg: AgentConfig):
    """A byte-level BPE tokenizer on `texts`, as a `PreTrainedTokenizerFast` (left padding)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD_TOKEN, END_MARK, SYSTEM_MARK, USER_MARK, ASSISTANT_MARK]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n"), "merged_with_previous"),  # merges never cross a line end
        # numbers (not digits inside identifiers like r2_score or p_0) are tokens of their own
        pre_tokenizers.Split(Regex(r"(?<![A-Za-z0-9_.])[0-9][0-9.e+-]*"), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(texts), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=END_MARK, pad_token=PAD_TOKEN, padding_side="left",
        additional_special_tokens=[SYSTEM_MARK, USER_MARK, ASSISTANT_MARK], model_max_length=cfg.context,
        clean_up_tokenization_spaces=False,
    )


def build_model(cfg: AgentConfig, tokenizer, seed: int):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    mcfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.context, tie_word_embeddings=True, attention_dropout=0.0,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    # HF initialises from torch's global RNG: seed a forked copy, leaving the caller's stream as it was
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(mcfg)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return model


def _batches(lengths: list[int], cfg: AgentConfig) -> list[list[int]]:
    """Length-bucketed batches of example indices under a padded-token budget."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out, cur, longest = [], [], 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if cur and (new_longest * (len(cur) + 1) > cfg.batch_tokens or len(cur) >= cfg.max_batch_size):
            out.append(cur)
            cur, new_longest = [], lengths[i]
        cur.append(i)
        longest = new_longest
    if cur:
        out.append(cur)
    return out


def sft(model, tokenizer, examples: Sequence[tuple[str, str]], cfg: AgentConfig, *, seed: int,
        max_seconds: float) -> dict:
    """Next-token SFT on the reply tokens of (prompt, script) pairs; returns training stats."""
    t0 = time.perf_counter()
    eos = tokenizer.eos_token_id
    prompts, replies = [], []
    for prompt, script in examples:
        p = encode_prompt(tokenizer, prompt, cfg.max_prompt_tokens, head_until=ASSISTANT_MARK)
        r = encode_reply(tokenizer, format_reply(script), eos)
        if len(p) + len(r) > cfg.context:
            continue
        prompts.append(p)
        replies.append(r)
    if not prompts:
        raise ValueError("no SFT example fits the model context")
    batches = _batches([len(p) + len(r) for p, r in zip(prompts, replies)], cfg)
    total_steps = cfg.epochs * len(batches)
    if cfg.max_steps:
        total_steps = min(total_steps, cfg.max_steps)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    rng = np.random.default_rng([seed, 7])
    model.train()
    step, ema, tokens, epochs_done = 0, None, 0, 0.0
    threads = [max(1, cfg.threads), 1]
    per_token: list[list[float]] = [[], []]
    chosen = threads[0]
    stopped_by = "epochs"
    for epoch in range(cfg.epochs):
        for b_i, b in enumerate(rng.permutation(len(batches))):
            progress = max(step / total_steps, (time.perf_counter() - t0) / max_seconds)
            if progress >= 1.0:
                stopped_by = "steps" if step >= total_steps else "time"
                break
            warm = min(1.0, (step + 1) / cfg.warmup_steps)
            cos = 0.5 * (1 + math.cos(math.pi * progress))
            for g in opt.param_groups:
                g["lr"] = cfg.lr * warm * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * cos)
            idx = batches[b]
            ids, mask, labels = sft_batch([prompts[i] for i in idx], [replies[i] for i in idx], tokenizer.pad_token_id)
            if step < 2 * _PROBE:  # alternate cfg.threads and 1 thread: on a shared CPU one can be faster
                torch.set_num_threads(threads[step % 2])
            ts = time.perf_counter()
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            if 2 <= step < 2 * _PROBE:  # the first step of each is a warm-up
                per_token[step % 2].append((time.perf_counter() - ts) / int(mask.sum()))
            if step == 2 * _PROBE - 1:
                best = min((float(np.median(v)) if v else math.inf, t) for v, t in zip(per_token, threads))
                torch.set_num_threads(best[1])
                chosen = best[1]
            step += 1
            tokens += int(mask.sum())
            value = loss.item()
            ema = value if ema is None else 0.95 * ema + 0.05 * value
            epochs_done = epoch + (b_i + 1) / len(batches)
        else:
            continue
        break
    model.eval()
    return {"steps": step, "epochs": round(epochs_done, 3), "train_loss_ema": ema, "tokens": tokens,
            "examples": len(prompts), "batches_per_epoch": len(batches), "stopped_by": stopped_by, "threads": chosen,
            "sft_s": round(time.perf_counter() - t0, 2)}


def build_default_agent(
    cache_dir: Path | str | None = None,
    *,
    specs_and_prompts: Sequence[tuple[TaskSpec, str]],
    n_examples: int = 3000,
    seed: int = 0,
    max_minutes: float = 5.0,
    config: AgentConfig | None = None,
) -> Path:
    """Build (or find in the cache) the default agent for these tasks; returns its directory.

    `specs_and_prompts` are (TaskSpec, task description) pairs -- the training
    tasks; the description is what `format_prompt` wraps into the first
    observation. `max_minutes` bounds the SFT wall time (corpus, tokenizer and
    saving come on top: seconds).
    """
    cfg = config or AgentConfig()
    pairs = [(spec, str(desc)) for spec, desc in specs_and_prompts]
    if not pairs:
        raise ValueError("build_default_agent needs at least one (TaskSpec, description) pair")
    root = Path(cache_dir).expanduser() if cache_dir is not None else DEFAULT_CACHE_DIR.expanduser()
    key = _cache_key(cfg, pairs, n_examples, seed, max_minutes)
    final = root / f"agent-{key}"
    if (final / META_FILE).is_file():
        return final

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, cfg.threads))
    tmp = root / f".building-{key}-{os.getpid()}"
    try:
        corpus = generate_corpus(pairs, n_examples, seed)
        texts = [p + format_reply(s) + END_MARK for p, s in corpus]
        tokenizer = train_tokenizer(texts, cfg)
        model = build_model(cfg, tokenizer, seed)
        n_params = sum(p.numel() for p in model.parameters())
        log.info("default agent %s: %d params, vocab %d, %d examples", key, n_params, len(tokenizer), len(corpus))
        stats = sft(model, tokenizer, corpus, cfg, seed=seed, max_seconds=max_minutes * 60.0)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        meta = {"key": key, "corpus_version": CORPUS_VERSION, "agent_version": AGENT_VERSION,
                "config": dataclasses.asdict(cfg), "n_params": n_params, "vocab": len(tokenizer),
                "n_examples": len(corpus), "seed": seed, "max_minutes": max_minutes,
                "build_s": round(time.perf_counter() - t0, 2), **stats}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same build first: keep theirs
            if not (final / META_FILE).is_file():
                raise
        log.info("default agent built in %.1fs: %s", meta["build_s"], final)
        return final
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(tmp, ignore_errors=True)


def agent_info(path: Path | str) -> dict:
    """The build metadata saved next to an agent."""
    return json.loads((Path(path) / META_FILE).read_text())
