"""`wmrl bench rollout`: generation throughput of the code agent, tokens per second by batch size.

Generation is the other half of a training step's cost (the sandbox is the
first): the rollout engine batches all groups' prompts, so what matters is
throughput at the batch sizes a step uses. This measures the AutoResearch
policy's own sampling loop (`CodeAgentPolicy.act`, KV cache, left padding) on
the training tasks' real prompts: per batch size, `repeats` rounds, tokens =
reply tokens actually generated; the figure is the median tokens/s over rounds
and the spread max - min. CPU only here (the vLLM engine is the GPU path).

Options (`wmrl bench rollout --help`): `batch=1,4,8,16`, `repeats=N`,
`profile=quick|full`, `out=PATH`, and any run-config key of the autoresearch
config (e.g. `domain.agent=PATH` for another model).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from wmrl.bench.harness import write_result
from wmrl.config import load_config
from wmrl.core.registry import DOMAINS
from wmrl.domains.autoresearch.protocol import format_prompt
from wmrl.registry import register_benchmark

PROFILES = {"quick": ([1, 8], 2), "full": ([1, 4, 8, 16, 32], 3)}


@dataclass
class RolloutOptions:
    profile: str = field(default="full", metadata={"help": "quick | full"})
    batch: str | None = field(default=None, metadata={"help": "comma-separated batch sizes (default: the profile's)"})
    repeats: int | None = field(default=None, metadata={"help": "rounds per batch size (default: the profile's)"})
    out: str | None = field(default=None, metadata={"help": "JSON path (default: bench/out/rollout-<profile>.json)"})

    def validate(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile={self.profile!r}: choose quick or full")


@register_benchmark("rollout", options=RolloutOptions, run_config=True)
def run(opts: RolloutOptions, user: list[str]) -> Path:
    profile = opts.profile
    batches, repeats = PROFILES[profile]
    batches = [int(b) for b in opts.batch.split(",")] if opts.batch else batches
    repeats = opts.repeats or repeats
    cfg = load_config("autoresearch", user)
    domain = DOMAINS.get(cfg.domain.name)(cfg.domain)
    policy = domain.make_policy(0)
    prompts = [format_prompt(t.payload.description) for t in domain.tasks("train")]
    gen = torch.Generator().manual_seed(0)
    policy.act([prompts[0]], generator=gen)  # warm-up: allocator, lazy init
    rows = []
    for b in batches:
        rates, tokens = [], []
        for r in range(repeats):
            obs = [prompts[(r * b + i) % len(prompts)] for i in range(b)]
            t0 = time.perf_counter()
            actions = policy.act(obs, generator=gen)[0]
            dt = time.perf_counter() - t0
            n = sum(len(policy.reply_ids(a)) for a in actions)
            rates.append(n / dt)
            tokens.append(n)
        rows.append({"batch": b, "tokens_per_s_median": statistics.median(rates),
                     "tokens_per_s_spread": max(rates) - min(rates), "tokens_per_round_median": statistics.median(tokens)})
    result = {"benchmark": "rollout", "profile": profile, "agent": cfg.domain.agent,
              "max_new_tokens": cfg.domain.max_new_tokens, "repeats": repeats, "device": "cpu",
              "torch_threads": torch.get_num_threads(), "rows": rows}
    out = Path(opts.out or f"bench/out/rollout-{profile}.json")
    return write_result(out, result, table)


def table(result: dict) -> str:
    lines = [f"`wmrl bench rollout profile={result['profile']}`: agent {result['agent']}, max_new_tokens "
             f"{result['max_new_tokens']}, {result['repeats']} rounds, CPU, {result['torch_threads']} torch thread(s)", "",
             "| batch | tokens/s (median) | spread | tokens per round |", "|---:|---:|---:|---:|"]
    lines += [f"| {r['batch']} | {r['tokens_per_s_median']:.0f} | {r['tokens_per_s_spread']:.0f} | "
              f"{r['tokens_per_round_median']:.0f} |" for r in result["rows"]]
    return "\n".join(lines) + "\n"
