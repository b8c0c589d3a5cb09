"""The vLLM side of `VLLMEngine`: a process in vLLM's own environment that samples and takes new weights.

vLLM pins its own torch and transformers, which do not co-resolve with the
training stack's, so it runs in a second virtual environment (`make vllm`,
`.venv-vllm`; on a GPU node `pip install wmrl[gpu]` can share one). This file
imports nothing of wmrl: the trainer starts it with that environment's Python,

    VENV/bin/python lm/vllm_server.py SOCKET MODEL_DIR DTYPE

and talks to it over a Unix socket (`multiprocessing.connection`, an authkey
in the environment). Requests: ("generate", spec) -> one (tokens, stop,
token_log_probs) per prompt, sampled with the per-prompt seeds in `spec`;
("load", safetensors bytes) -> the weights replaced in place
(`reload_weights`), the prefix cache reset (it holds keys of the old weights);
("close", None). Log-probabilities are vLLM's raw ones: temperature 1, before
any processing, which is what the trainer's ratio recomputes.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from multiprocessing.connection import Client


def _serve(address: str, model: str, dtype: str) -> None:
    from safetensors.torch import load as load_tensors
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(os.environ["WMRL_VLLM_AUTHKEY"]))
    t0 = time.perf_counter()
    # token ids in, token ids out: the trainer owns tokenization, so the folder needs no tokenizer vLLM can read;
    # no chunked prefill: a seeded request resumed mid-prompt fails in vLLM's CPU sampler ("does not use offset")
    llm = LLM(model=model, dtype=dtype, enforce_eager=True, seed=0, enable_prefix_caching=True,
              skip_tokenizer_init=True, max_model_len=int(os.environ.get("WMRL_VLLM_MAX_LEN", "0")) or None,
              enable_chunked_prefill=False)
    conn.send(("ready", time.perf_counter() - t0))
    while True:
        kind, payload = conn.recv()
        try:
            if kind == "close":
                conn.send(("ok", None))
                return
            if kind == "generate":
                conn.send(("ok", _generate(llm, SamplingParams, TokensPrompt, payload)))
            elif kind == "load":
                t0 = time.perf_counter()
                weights = load_tensors(payload)
                llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})
                llm.reset_prefix_cache()
                conn.send(("ok", time.perf_counter() - t0))
            else:
                conn.send(("error", f"unknown request {kind!r}"))
        except Exception:  # noqa: BLE001 - the client raises it with this traceback
            conn.send(("error", traceback.format_exc(limit=6)))


def _generate(llm, SamplingParams, TokensPrompt, spec: dict) -> list[tuple[list[int], int | None, list[float]]]:
    stops = set(spec["stop_ids"])
    params = [SamplingParams(n=1, max_tokens=spec["max_tokens"], temperature=0.0 if spec["greedy"] else spec["temperature"],
                             seed=seed, logprobs=0, stop_token_ids=list(stops), ignore_eos=True, detokenize=False)
              for seed in spec["seeds"]]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]], params, use_tqdm=False)
    rows = []
    for out in outs:
        c = out.outputs[0]
        tokens = list(c.token_ids)
        lps = [float(step[tok].logprob) for step, tok in zip(c.logprobs, tokens)]
        stop = tokens.pop() if tokens and tokens[-1] in stops else None
        rows.append((tokens, stop, lps))
    return rows


if __name__ == "__main__":
    _serve(*sys.argv[1:4])
