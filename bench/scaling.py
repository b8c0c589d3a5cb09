"""`wmrl bench scaling`: the numbers that size a deployment -- rollout tokens/s and update time of our LM path.

What a step costs on a given machine, for a causal LM of a realistic shape
built from its config (random weights: throughput does not depend on them; no
download): the HF/torch rollout backend (`wmrl.lm.sample`, KV cache, the
trainer's seeded host generator, fixed reply length) in new tokens/s by batch
size, and one update through the DeepSpeed engine (`core/engine.py`: AdamW,
clipped, bf16 on a GPU) on a batch of prompt+reply sequences, in seconds and
trained tokens/s. Each figure is the median of `repeats` timed runs after one
warm-up. `docs/scaling.md` turns these into a plan.

Options (`wmrl bench scaling --help`): `shapes=` (comma-separated, from
SHAPES), `batches=1,8,32,128`, `prompt=256`, `reply=128`, `update_batch=16`,
`micro=4`, `zero=0,2`, `repeats=3`, `device=auto`, `out=`.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from wmrl.bench.harness import write_result
from wmrl.registry import register_benchmark

#: model shapes (Qwen2's published configs; "tiny" is for a CPU smoke run)
SHAPES = {
    "tiny": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=4096),  # the embedded agent's shape (head_dim 32)
    "qwen2-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, vocab_size=151936),
    "qwen2-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, vocab_size=151936),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device, repeats: int) -> list[float]:
    fn()  # warm-up (kernels, allocator, caches)
    out = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return out


def _model(shape: str, device: torch.device, dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)  # a benchmark's own model: weights do not matter, only that they are fixed
    with torch.device(device):  # initialised where it runs: a 1.5B model's CPU init alone takes a minute
        model = Qwen2ForCausalLM(cfg).to(dtype=dtype).eval()
    return model, sum(p.numel() for p in model.parameters())


def _generation(engine, vocab, device, batches, prompt, reply, repeats) -> list[dict]:
    from wmrl.lm.sampling import SamplingParams

    rows = []
    params = SamplingParams(max_new_tokens=reply, temperature=1.0)  # no stop ids: every row is `reply` long
    for b in batches:
        prompts = torch.randint(3, vocab, (b, prompt), generator=torch.Generator().manual_seed(b)).tolist()
        gen = torch.Generator().manual_seed(0)  # host generator, as the trainer passes

        def run():
            engine.generate(prompts, params, generator=gen)

        walls = _timed(run, device, repeats)
        med = statistics.median(walls)
        rows.append({"batch": b, "median_s": med, "walls_s": walls, "new_tokens_per_s": b * reply / med})
    return rows


def _engines(names, model, repeats) -> tuple[dict, dict]:
    """The rollout engines to time, and what starting them and one weight sync cost."""
    from wmrl.lm.engines import HFEngine, VLLMEngine

    engines, costs = {}, {}
    for name in names:
        if name == "hf":
            engines[name] = HFEngine(model, pad_id=0)
            continue
        folder = Path(tempfile.mkdtemp(prefix="wmrl-bench-vllm-"))
        model.save_pretrained(folder)
        t0 = time.perf_counter()
        engine = VLLMEngine(folder, dtype=str(next(model.parameters()).dtype).removeprefix("torch."))
        start = time.perf_counter() - t0
        syncs = [engine.sync(model) for _ in range(repeats)]
        engines[name] = engine
        costs[name] = {"start_s": start, "sync_median_s": statistics.median(syncs), "sync_s": syncs}
    return engines, costs


def _update(shape, device, dtype, zero, batch, micro, prompt, reply, repeats) -> list[dict]:
    from wmrl.core.engine import Engine, EngineConfig
    from wmrl.lm.sampling import token_scores

    vocab = SHAPES[shape]["vocab_size"]
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, vocab, (batch, prompt), generator=g).tolist()
    replies = torch.randint(3, vocab, (batch, reply), generator=g).tolist()
    rows = []
    for stage in zero:
        model = _model(shape, device, dtype)[0].train()  # a fresh module per engine
        try:
            engine = Engine(model, EngineConfig(zero_stage=stage, lr=1e-6, bf16=device.type == "cuda"))
        except Exception as exc:  # noqa: BLE001 - a stage this machine cannot run is reported, not fatal
            rows.append({"zero_stage": stage, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            continue

        def shares():
            def share(lo):
                lp, mask = token_scores(engine.module, prompts[lo:lo + micro], replies[lo:lo + micro], pad_id=0)
                return -(lp * mask).sum() / (batch * reply)
            return [lambda lo=lo: share(lo) for lo in range(0, batch, micro)]

        def run():
            engine.step(shares())

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        walls = _timed(run, device, repeats)
        med = statistics.median(walls)
        row = {"zero_stage": stage, "batch": batch, "micro_batch": micro, "median_s": med, "walls_s": walls,
               "trained_tokens_per_s": batch * (prompt + reply) / med}
        if device.type == "cuda":
            row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        rows.append(row)
        del engine, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


@dataclass
class ScalingOptions:
    shapes: str = field(default="tiny", metadata={"help": f"model shapes, comma-separated: {', '.join(SHAPES)}"})
    batches: str = field(default="1,8,32", metadata={"help": "rollout batch sizes"})
    prompt: int = field(default=64, metadata={"help": "prompt tokens"})
    reply: int = field(default=32, metadata={"help": "new tokens per reply (no early stop)"})
    update_batch: int = field(default=8, metadata={"help": "sequences per update"})
    micro: int = field(default=4, metadata={"help": "sequences per micro-batch"})
    zero: str = field(default="0", metadata={"help": "ZeRO stages to time the update under"})
    repeats: int = field(default=3, metadata={"help": "timed runs after one warm-up; the figure is their median"})
    device: str = field(default="auto", metadata={"help": "auto (cuda if available), cpu or cuda"})
    engines: str = field(default="hf", metadata={"help": "rollout engines to time: hf, vllm (needs `make vllm`)"})
    out: str = field(default="bench/out/scaling.json", metadata={"help": "JSON path"})

    def validate(self) -> None:
        unknown = [s for s in self.shapes.split(",") if s not in SHAPES]
        if unknown:
            raise ValueError(f"unknown shape {unknown[0]!r}: choose from {', '.join(SHAPES)}")
        if min(self.prompt, self.reply, self.update_batch, self.micro, self.repeats) < 1:
            raise ValueError("prompt, reply, update_batch, micro and repeats must be >= 1")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device={self.device!r}: choose auto, cpu or cuda")
        if not set(self.engines.split(",")) <= {"hf", "vllm"} or "hf" not in self.engines.split(","):
            raise ValueError(f"engines={self.engines!r}: hf, optionally with vllm (e.g. engines=hf,vllm)")


@register_benchmark("scaling", options=ScalingOptions)
def run(opts: ScalingOptions, _: list[str]) -> Path:
    name = "cuda" if opts.device == "auto" and torch.cuda.is_available() else opts.device.replace("auto", "cpu")
    device = torch.device(name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    batches = [int(b) for b in opts.batches.split(",")]
    started = time.time()
    shapes = {}
    for shape in opts.shapes.split(","):
        model, n_params = _model(shape, device, dtype)
        engines, costs = _engines(opts.engines.split(","), model, opts.repeats)
        per_engine = {}
        try:
            for name, engine in engines.items():
                per_engine[name] = _generation(engine, SHAPES[shape]["vocab_size"], device, batches, opts.prompt,
                                               opts.reply, opts.repeats)
        finally:
            for engine in engines.values():
                engine.close()
        generation = per_engine["hf"]
        del model
        shapes[shape] = {
            "parameters": n_params,
            "generation": generation,
            "engines": {name: {"generation": rows, **costs.get(name, {})} for name, rows in per_engine.items()},
            "update": _update(shape, device, dtype, [int(z) for z in opts.zero.split(",")], opts.update_batch,
                              opts.micro, opts.prompt, opts.reply, opts.repeats),
        }
    import transformers

    result = {
        "benchmark": "scaling",
        "what": "rollout new tokens/s of wmrl.lm.sample (HF/torch backend) by batch size, and one DeepSpeed "
                "update's time, for causal LMs of published shapes built from config; optionally the vLLM "
                "rollout engine beside it (start, new tokens/s, weight sync)",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "prompt_tokens": opts.prompt, "reply_tokens": opts.reply, "repeats": opts.repeats,
        "shapes": shapes,
        "machine": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0], "torch": torch.__version__,
                    "transformers": transformers.__version__},
        "duration_s": time.time() - started,
    }
    return write_result(Path(opts.out), result, table)


def table(result: dict) -> str:
    lines = [f"`wmrl bench scaling` on {result['device']} ({result['dtype']}): prompt {result['prompt_tokens']} "
             f"tokens, reply {result['reply_tokens']} tokens, median of {result['repeats']} runs", "",
             "| shape | parameters | rollout batch | new tokens/s |", "|---|---:|---:|---:|"]
    for shape, s in result["shapes"].items():
        lines += [f"| {shape} | {s['parameters'] / 1e6:.1f}M | {g['batch']} | {g['new_tokens_per_s']:,.0f} |"
                  for g in s["generation"]]
    vllm = {shape: s["engines"]["vllm"] for shape, s in result["shapes"].items() if "vllm" in s.get("engines", {})}
    if vllm:
        lines += ["", "| shape | rollout batch | HF new tokens/s | vLLM new tokens/s | vLLM / HF |",
                  "|---|---:|---:|---:|---:|"]
        for shape, v in vllm.items():
            for h, g in zip(result["shapes"][shape]["generation"], v["generation"]):
                lines.append(f"| {shape} | {g['batch']} | {h['new_tokens_per_s']:,.0f} | {g['new_tokens_per_s']:,.0f} "
                             f"| {g['new_tokens_per_s'] / h['new_tokens_per_s']:.2f}x |")
        lines += [""] + [f"vLLM ({shape}): server start {v['start_s']:.1f} s, weight sync {v['sync_median_s'] * 1e3:.0f} "
                         "ms (in place, no restart)" for shape, v in vllm.items()]
    lines += ["", "| shape | ZeRO | sequences per update | update (s) | trained tokens/s | peak memory (GiB) |",
              "|---|---:|---:|---:|---:|---:|"]
    for shape, s in result["shapes"].items():
        lines += [f"| {shape} | {u['zero_stage']} | {u['batch']} | {u['median_s']:.3f} | "
                  f"{u['trained_tokens_per_s']:,.0f} | {u.get('peak_memory_gib', float('nan')):.1f} |"
                  if "error" not in u else f"| {shape} | {u['zero_stage']} | failed: {u['error']} | | | |"
                  for u in s["update"]]
    return "\n".join(lines) + "\n"
