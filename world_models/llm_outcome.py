"""An LLM outcome predictor: a causal LM that reads a trajectory and writes its outcome as text.

This is the paper's kind of world model. A domain turns (task, trajectory)
into a prompt; the LM answers in a small structured format,

    status: ok|error|timeout|oom|invalid
    score: <number in [0, 1]>
    log: <optional free text, may span lines: a simulated execution report>

and the answer is parsed strictly (`parse_outcome`). Why text and not a
regression head: the same backbone that writes the code can read it, and the
`log` field gives multi-turn agents a simulated observation for free.

Uncertainty comes from sampling: K replies per prompt (the LM toolkit's `sample`
with a generator seeded per call, so a run is reproducible) give K scores -> mean and variance. A reply whose status is not
`ok` scores the domain's failure score (0 by default): a predicted crash is a
confident prediction of a bad outcome. A reply that does not parse is no
prediction at all; when fewer than `min_parsed` of the K parse, the grade is
*unknown* (mean None) -- never 0, because 0 would claim the attempt was bad.

Online learning: `fit` runs a few supervised steps (cross-entropy on the
target tokens only; the prompt is context) on (prompt, outcome text) pairs the
domain builds from real anchor outcomes, drawn from a FIFO replay window so the
predictor follows the policy's drift without forgetting the recent past. Each
fit is capped in steps and in seconds, so a training step is never held up
long. The backbone is copied when it is handed over already loaded (it is
usually the policy's own), so fitting the world model never moves the policy.
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from wmrl.core.types import GRADED_STATUSES, Prediction
from wmrl.lm.batch import sft_batch
from wmrl.lm.engines import RolloutEngine, open_engine
from wmrl.lm.sampling import SamplingParams
from wmrl.lm.tokens import decode, encode_prompt, encode_reply, prompt_budget, special_tokens

#: the variance of a uniform score on [0, 1]: what a single parsed sample says about the spread
_PRIOR_VAR = 1.0 / 12.0

_STATUS_LINE = re.compile(r"status:[ \t]*([A-Za-z]+)[ \t]*", re.IGNORECASE)
# a plain non-negative decimal: "nan", "inf", signs, hex and words never match
_SCORE_LINE = re.compile(r"score:[ \t]*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[ \t]*", re.IGNORECASE)
_LOG_KEY = re.compile(r"log:[ \t]?", re.IGNORECASE)


class ParsedOutcome(NamedTuple):
    status: str
    score: float
    log: str | None


def parse_outcome(text: str) -> ParsedOutcome | None:
    """Parse `status:` / `score:` / optional `log:` lines; None for anything else.

    Strict on purpose: the status must be one of GRADED_STATUSES, the score a
    plain decimal that is finite and inside [0, 1] -- out-of-range values are
    rejected rather than clipped, since every training target lies in [0, 1] and
    a reply outside it is off the format, not a confident extreme. Whatever
    follows the score line must be the `log:` field (it runs to the end).
    """
    if not isinstance(text, str):
        return None
    lines = text.strip().split("\n", 2)
    if len(lines) < 2:
        return None
    status_m = _STATUS_LINE.fullmatch(lines[0].strip())
    score_m = _SCORE_LINE.fullmatch(lines[1].strip())
    if status_m is None or score_m is None:
        return None
    status = status_m.group(1).lower()
    if status not in GRADED_STATUSES:
        return None
    try:
        score = float(score_m.group(1))
    except ValueError:  # e.g. an exponent that overflows the regex's promise
        return None
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        return None
    log = None
    if len(lines) == 3 and lines[2].strip():
        rest = lines[2].lstrip()
        key = _LOG_KEY.match(rest)
        if key is None:
            return None
        log = rest[key.end():].strip() or None
    return ParsedOutcome(status, score, log)


def format_outcome(status: str, score: float, log: str | None = None, *, digits: int = 2,
                   max_log_chars: int | None = None) -> str:
    """The target text for one real outcome; `parse_outcome` reads it back (score rounded to `digits`)."""
    if status not in GRADED_STATUSES:
        raise ValueError(f"status {status!r} is not an outcome status {GRADED_STATUSES}")
    s = float(score)
    if not math.isfinite(s) or not 0.0 <= s <= 1.0:
        raise ValueError(f"score {score!r} is outside [0, 1]")
    text = f"status: {status}\nscore: {s:.{digits}f}"
    if log is not None and log.strip():
        body = log.strip()
        if max_log_chars is not None and len(body) > max_log_chars:
            body = body[:max_log_chars].rstrip()
        text += f"\nlog: {body}"
    return text


@dataclass
class OutcomeSamples:
    """The K replies to one prompt, what parsed, and the resulting grade."""

    prediction: Prediction
    texts: list[str]
    parsed: list[ParsedOutcome | None]
    #: the score each parsed reply counts as (failure score where status != ok); None where unparsed
    scores: list[float | None] = field(default_factory=list)

    @property
    def parse_rate(self) -> float:
        return sum(p is not None for p in self.parsed) / len(self.parsed) if self.parsed else 0.0

    def representative(self) -> ParsedOutcome | None:
        """A typical outcome and log: among the parsed replies whose score is closest to the mean,
        the most frequent (status, log) -- sampled logs vary token by token, the mode is the stable one."""
        if self.prediction.mean is None:
            return None
        dist = [abs(s - self.prediction.mean) if p is not None and s is not None else math.inf
                for p, s in zip(self.parsed, self.scores)]
        nearest = [p for p, d in zip(self.parsed, dist) if d <= min(dist) + 1e-9 and p is not None]
        if not nearest:
            return None
        counts = Counter((p.status, p.log) for p in nearest)
        return max(nearest, key=lambda p: counts[(p.status, p.log)])  # max keeps the first on ties


@dataclass
class _Example:
    prompt: str
    target: str
    prompt_ids: list[int]
    target_ids: list[int]


class LLMOutcomePredictor:
    """A causal LM that predicts outcomes as text; `predict` samples, `fit` fine-tunes online.

    `model` is a local directory / Hub id (loaded here, weights our own) or an
    already-loaded causal LM with its `tokenizer` (deep-copied unless
    `copy_model=False`, so the caller's weights never change).
    """

    def __init__(
        self,
        model: str | Path | torch.nn.Module,
        tokenizer: Any = None,
        *,
        samples: int = 8,
        min_parsed: int | None = None,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        max_prompt_tokens: int = 768,
        failure_score: float = 0.0,
        var_floor: float = 1e-4,
        lr: float = 1e-3,
        fit_steps: int = 8,
        fit_seconds: float = 10.0,
        batch_size: int = 8,
        window: int = 256,
        gen_batch: int = 64,
        seed: int = 0,
        copy_model: bool = True,
        rollout: str = "hf",
    ):
        """`rollout`: the engine outcomes are sampled with (`lm/engines.py`); "vllm" needs `model` as a folder."""
        if samples < 1:
            raise ValueError("samples (K) must be >= 1")
        min_parsed = (samples + 1) // 2 if min_parsed is None else int(min_parsed)
        if not 1 <= min_parsed <= samples:
            raise ValueError(f"min_parsed must be in [1, samples={samples}], got {min_parsed}")
        if temperature < 0:
            raise ValueError("temperature must be >= 0 (0 = greedy: all K samples agree)")
        if not 0.0 <= failure_score <= 1.0:
            raise ValueError("failure_score must be in [0, 1]")
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(model))
            self.module = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
        else:
            if tokenizer is None:
                raise ValueError("a loaded model needs its tokenizer")
            self.tokenizer = tokenizer
            self.module = copy.deepcopy(model) if copy_model else model
        self.module.requires_grad_(True)
        self.module.eval()
        self.tokens = special_tokens(self.tokenizer, self.module, who="the world model")
        self.eos_id, self.pad_id = self.tokens.eos_id, self.tokens.pad_id
        self.max_new_tokens = int(max_new_tokens)
        self.max_prompt_tokens = prompt_budget(self.tokens.context, max_prompt_tokens, self.max_new_tokens)
        self.params = SamplingParams(self.max_new_tokens, float(temperature), self.tokens.stop_ids)
        self.samples, self.min_parsed = int(samples), min_parsed
        self.temperature, self.failure_score, self.var_floor = float(temperature), float(failure_score), float(var_floor)
        self.lr, self.fit_steps, self.fit_seconds = float(lr), int(fit_steps), float(fit_seconds)
        self.batch_size, self.gen_batch, self.seed = int(batch_size), max(1, int(gen_batch)), int(seed)
        self._window: deque[_Example] = deque(maxlen=int(window))
        self._optimizer: torch.optim.Optimizer | None = None
        self._generate_calls = 0  # keys each generate call's seed: reproducible, and restored on resume
        self._fits = 0
        #: running totals: replies sampled / parsed, fit steps taken
        self.stats = {"replies": 0, "parsed": 0, "fit_steps": 0}
        self.rollout = rollout
        self._model_dir = str(model) if isinstance(model, (str, Path)) else None
        if rollout == "vllm" and self._model_dir is None:
            raise ValueError("rollout engine vllm loads the model from its folder: pass a model path, not a loaded model")
        self._engine: RolloutEngine | None = None
        self._weights, self._synced = 0, 0  # weight versions: fits and loads bump the first, syncs catch up

    # ------------------------------------------------------------------ tokenisation

    def _prompt_ids(self, text: str) -> list[int]:
        # an over-long prompt loses its middle: the head holds the task, the tail the latest content and the cue
        return encode_prompt(self.tokenizer, text, self.max_prompt_tokens)

    def _target_ids(self, text: str) -> list[int]:
        return encode_reply(self.tokenizer, text, self.eos_id)

    def _device(self) -> torch.device:
        return next(self.module.parameters()).device

    # ------------------------------------------------------------------ prediction

    @torch.no_grad()
    def predict(self, prompts: Sequence[str], failure_scores: Sequence[float] | None = None) -> list[OutcomeSamples]:
        """K sampled outcomes per prompt, aggregated into a Prediction (see the module docstring)."""
        prompts = list(prompts)
        if failure_scores is not None and len(failure_scores) != len(prompts):
            raise ValueError(f"{len(failure_scores)} failure scores for {len(prompts)} prompts")
        fails = [self.failure_score] * len(prompts) if failure_scores is None else [float(f) for f in failure_scores]
        texts: list[str] = []
        per_call = max(1, self.gen_batch // self.samples)
        for start in range(0, len(prompts), per_call):
            texts += self._generate(prompts[start:start + per_call])
        out = []
        for i, fail in enumerate(fails):
            replies = texts[i * self.samples:(i + 1) * self.samples]
            out.append(self._aggregate(replies, fail))
        return out

    def _aggregate(self, replies: list[str], fail: float) -> OutcomeSamples:
        parsed = [parse_outcome(t) for t in replies]
        scores = [None if p is None else (p.score if p.status == "ok" else fail) for p in parsed]
        got = [s for s in scores if s is not None]
        self.stats["replies"] += len(replies)
        self.stats["parsed"] += len(got)
        if len(got) < self.min_parsed:
            pred = Prediction(None, error=f"only {len(got)}/{len(replies)} world-model replies parsed "
                                           f"(need {self.min_parsed})")
            return OutcomeSamples(pred, replies, parsed, scores)
        arr = np.asarray(got, dtype=float)
        var = float(arr.var(ddof=1)) if len(arr) >= 2 else _PRIOR_VAR
        # K agreeing samples are not certainty: inverse-variance weights need a floor
        pred = Prediction.checked(float(arr.mean()), max(var, self.var_floor), samples=got)
        return OutcomeSamples(pred, replies, parsed, scores)

    def _generate(self, prompts: list[str]) -> list[str]:
        """K replies per prompt (prompt-major order), sampled under a per-call seed."""
        if not prompts:
            return []
        sampled = self.temperature > 0
        rows = [ids for ids in map(self._prompt_ids, prompts) for _ in range(self.samples if sampled else 1)]
        seed = int(np.random.SeedSequence([self.seed, self._generate_calls]).generate_state(1)[0])
        self._generate_calls += 1
        generator = torch.Generator(device=self._device()).manual_seed(seed)
        drawn = self._sampler().generate(rows, self.params, generator=generator)
        texts = [decode(self.tokenizer, d.tokens, skip_special_tokens=True) for d in drawn]
        return texts if sampled else [t for t in texts for _ in range(self.samples)]  # greedy: one reply, K times

    def _sampler(self) -> RolloutEngine:
        """The rollout engine, holding the weights as they are now (started on first use)."""
        if self._engine is None:
            self._engine = open_engine(self.rollout, self.module, self.pad_id, self._model_dir)
        elif self._synced != self._weights:
            self._engine.sync(self.module)
        self._synced = self._weights
        return self._engine

    def close(self) -> None:
        """Stop the rollout engine's server, if any (the model stays usable: one starts again on use)."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    # ------------------------------------------------------------------ online learning

    def _encode(self, prompt: str, target: str) -> _Example:
        return _Example(prompt, target, self._prompt_ids(prompt), self._target_ids(target))

    @property
    def window(self) -> list[tuple[str, str]]:
        """The replay window's (prompt, target) pairs, oldest first."""
        return [(e.prompt, e.target) for e in self._window]

    def fit(self, examples: Sequence[tuple[str, str]], *, steps: int | None = None,
            max_seconds: float | None = None) -> dict:
        """Add (prompt, target outcome text) pairs to the window and take a few SFT steps.

        The new examples come first in the step order, then a shuffled pass over
        the whole window (replay). Stops after `steps` (default `fit_steps`) or
        `max_seconds` (default `fit_seconds`), whichever comes first.
        """
        fresh = []
        for prompt, target in examples:
            if parse_outcome(target) is None:
                raise ValueError(f"fit target does not parse as an outcome: {target[:80]!r}")
            fresh.append(self._encode(prompt, target))
        self._window.extend(fresh)
        steps = self.fit_steps if steps is None else int(steps)
        budget = self.fit_seconds if max_seconds is None else float(max_seconds)
        stats = {"steps": 0, "loss": float("nan"), "seconds": 0.0, "window": len(self._window), "new": len(fresh)}
        if not self._window or steps <= 0:
            return stats
        t0 = time.perf_counter()
        rng = np.random.default_rng([self.seed, self._fits, 11])
        self._fits += 1
        pool = list(self._window)
        n_fresh = min(len(fresh), len(pool))  # the window may be smaller than one batch of fresh examples
        fresh_idx = list(range(len(pool) - n_fresh, len(pool)))
        order = [int(i) for i in rng.permutation(fresh_idx)] if fresh_idx else []
        if self._optimizer is None:
            self._optimizer = torch.optim.AdamW(self.module.parameters(), lr=self.lr, weight_decay=0.0)
        self.module.train()
        losses = []
        try:
            for _ in range(steps):
                if time.perf_counter() - t0 >= budget:
                    break
                while len(order) < self.batch_size:
                    order += [int(i) for i in rng.permutation(len(pool))]
                batch, order = [pool[i] for i in order[:self.batch_size]], order[self.batch_size:]
                losses.append(self._sft_step(batch))
        finally:
            self.module.eval()
        self.stats["fit_steps"] += len(losses)
        self._weights += bool(losses)
        stats.update(steps=len(losses), loss=float(np.mean(losses)) if losses else float("nan"),
                     last_loss=losses[-1] if losses else float("nan"), seconds=round(time.perf_counter() - t0, 3))
        return stats

    def _sft_step(self, batch: list[_Example]) -> float:
        ids, mask, labels = sft_batch([e.prompt_ids for e in batch], [e.target_ids for e in batch], self.pad_id,
                                      self._device())
        loss = self.module(input_ids=ids, attention_mask=mask, labels=labels).loss
        self._optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), 1.0)
        self._optimizer.step()
        return float(loss.item())

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict:
        """Weights, optimizer state, replay window and the sampling counters: an exact resume."""
        return {
            "weights": {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()},
            "optimizer": self._optimizer.state_dict() if self._optimizer is not None else None,
            "window": [[e.prompt, e.target] for e in self._window],
            "generate_calls": self._generate_calls,
            "fits": self._fits,
        }

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        self.module.load_state_dict(state["weights"])
        self._weights += 1
        self._optimizer = None
        if state.get("optimizer") is not None:
            self._optimizer = torch.optim.AdamW(self.module.parameters(), lr=self.lr, weight_decay=0.0)
            self._optimizer.load_state_dict(state["optimizer"])
        self._window.clear()
        self._window.extend(self._encode(p, t) for p, t in state["window"])
        self._generate_calls = int(state["generate_calls"])
        self._fits = int(state["fits"])
