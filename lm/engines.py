"""Rollout engines: where a causal-LM policy's replies are sampled -- this process (HF/torch) or vLLM.

Generation is most of a GPU step (`docs/scaling.md`: the HF/torch loop is
launch-bound), so the sampler is a seam: `RolloutEngine.generate(prompts,
params, generator, greedy)` returns one `Sampled` per prompt -- tokens, the stop
token, and the temperature-1 log-probability of every sampled token, the
behaviour log-probs the surrogate's ratio needs -- and `sync(module)` hands the
engine the weights after an update. Both engines take the same
`SamplingParams` and draw from the caller's seeded generator, so a run stays
reproducible from its seed on either; they do not draw the *same* tokens (each
has its own sampler), only from the same distribution.

* `hf` (default): `wmrl.lm.sample` on the training module itself; `sync` has
  nothing to do.
* `vllm`: a vLLM `LLM` in a server process of its own environment
  (`lm/vllm_server.py`; vLLM pins a torch the training stack cannot share),
  loaded from the policy's model folder; `sync` ships the module's weights
  (LoRA merged) as safetensors and vLLM reloads them in place -- no restart.
  Per prompt one seed is drawn from the caller's generator.
* `vllm` with `servers` > 1 (`VLLMPool`): that many servers (one per rollout
  GPU on a node), each call's prompts split into contiguous blocks sampled at
  once, every sync sent to all; `devices` gives each its GPU. The seeds are
  drawn as for one server, so a prompt gets the same seed whatever the number
  of servers (the same replies on CPU, where a batch's make-up does not change
  the numbers; a GPU kernel may round differently by batch).
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Sequence

import torch

from wmrl.core.ranks import block
from wmrl.lm.lora import merged
from wmrl.lm.sampling import Sampled, SamplingParams, sample

log = logging.getLogger(__name__)

__all__ = ["ENGINES", "HFEngine", "RolloutEngine", "VLLMEngine", "VLLMPool", "open_engine", "vllm_python"]

SERVER = Path(__file__).with_name("vllm_server.py")
#: vLLM's CPU backend settings that work on these machines (DESIGN §4); a GPU node sets its own
CPU_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


class RolloutEngine:
    """Samples replies for a causal LM policy; `sync` after every update."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 generator: torch.Generator | None = None, greedy: bool = False) -> list[Sampled]:
        raise NotImplementedError

    def sync(self, module: torch.nn.Module) -> float:
        """Take the module's current weights; returns the seconds it took."""
        return 0.0

    def close(self) -> None:
        pass


class HFEngine(RolloutEngine):
    """`wmrl.lm.sample` on the training module: always in sync."""

    def __init__(self, module: torch.nn.Module, pad_id: int):
        self.module, self.pad_id = module, pad_id

    def generate(self, prompts, params, *, generator=None, greedy=False):
        return sample(self.module, prompts, params, pad_id=self.pad_id, generator=generator, greedy=greedy)


def vllm_python(explicit: str | None = None) -> str:
    """The Python of vLLM's environment: `explicit`, $WMRL_VLLM_PYTHON, or the repository's `.venv-vllm`."""
    candidates = [explicit, os.environ.get("WMRL_VLLM_PYTHON"),
                  str(Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python")]
    for c in candidates:
        if c and Path(c).exists():
            return c
    raise FileNotFoundError("rollout engine vllm: no vLLM environment found; build it with `make vllm` (a second "
                            "venv, .venv-vllm) or point WMRL_VLLM_PYTHON at a Python that has vllm installed")


class VLLMEngine(RolloutEngine):
    """A vLLM server process over `model_dir` (a Hugging Face model folder)."""

    def __init__(self, model_dir: str | os.PathLike, *, python: str | None = None, dtype: str = "float32",
                 start_timeout_s: float = 600.0, env: dict[str, str] | None = None):
        """`env`: what the server's environment adds (e.g. CUDA_VISIBLE_DEVICES, its GPU)."""
        self.python = vllm_python(python)
        self._dir = tempfile.mkdtemp(prefix="wmrl-vllm-")
        address = os.path.join(self._dir, "socket")
        key = secrets.token_bytes(32)
        self._listener = Listener(address, family="AF_UNIX", authkey=key)
        env = {**os.environ, **(env or {}), "WMRL_VLLM_AUTHKEY": key.hex()}
        if not torch.cuda.is_available():
            env.update({k: v for k, v in CPU_ENV.items() if k not in os.environ})
        self._log = open(os.path.join(self._dir, "server.log"), "wb")
        self._proc = subprocess.Popen([self.python, str(SERVER), address, str(model_dir), dtype], env=env,
                                      stdout=self._log, stderr=subprocess.STDOUT)
        self._conn = None
        accepted: list = []
        waiter = threading.Thread(target=lambda: accepted.append(self._listener.accept()), daemon=True)
        waiter.start()
        deadline = time.monotonic() + start_timeout_s
        while waiter.is_alive() and self._proc.poll() is None and time.monotonic() < deadline:
            waiter.join(0.2)
        if not accepted:
            self.close()
            raise RuntimeError(f"the vLLM server did not start (exit code {self._proc.returncode}); its log: "
                               f"{self._tail()}")
        self._conn = accepted[0]
        _, self.start_s = self._conn.recv()
        log.info("vLLM engine up in %.1f s (%s)", self.start_s, model_dir)

    def _tail(self) -> str:
        try:
            return Path(self._dir, "server.log").read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def _call(self, kind: str, payload) -> object:
        if self._proc.poll() is not None:
            raise RuntimeError(f"the vLLM server exited ({self._proc.returncode}); its log: {self._tail()}")
        self._conn.send((kind, payload))
        status, value = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"vLLM server: {value}")
        return value

    def generate(self, prompts, params, *, generator=None, greedy=False):
        if not prompts:  # draws nothing
            return []
        return self.generate_seeded(prompts, params, _seeds(generator, len(prompts)), greedy)

    def generate_seeded(self, prompts, params: SamplingParams, seeds: Sequence[int], greedy: bool) -> list[Sampled]:
        """One reply per prompt, prompt i sampled with `seeds[i]`."""
        if not prompts:
            return []
        spec = {"prompts": [list(map(int, p)) for p in prompts], "max_tokens": params.max_new_tokens,
                "temperature": params.temperature, "greedy": greedy or params.temperature == 0.0,
                "stop_ids": list(params.stop_ids), "seeds": list(seeds)}
        return [Sampled(tokens, stop, lps) for tokens, stop, lps in self._call("generate", spec)]

    def sync(self, module: torch.nn.Module) -> float:
        """Ship `module`'s weights (LoRA adapters merged in) and have vLLM reload them in place."""
        t0 = time.perf_counter()
        self.load(weights_payload(module))
        return time.perf_counter() - t0

    def load(self, payload: bytes) -> None:
        """Reload the weights `weights_payload` serialized."""
        self._call("load", payload)

    def close(self) -> None:
        """Stop the server (asked first, killed after 30 s). Safe to call twice."""
        if self._conn is not None and self._proc.poll() is None:
            try:
                self._conn.send(("close", None))
                self._conn.recv()
            except (OSError, EOFError):
                pass
        if self._proc.poll() is None:
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._conn = None
        self._listener.close()
        self._log.close()


class VLLMPool(RolloutEngine):
    """`servers` vLLM servers behind one policy; `devices[i]` (CUDA_VISIBLE_DEVICES) places server i."""

    def __init__(self, model_dir: str | os.PathLike, servers: int, *, devices: Sequence[str] = (), **kwargs):
        if servers < 1 or (devices and len(devices) != servers):
            raise ValueError(f"a vLLM pool needs servers >= 1 and one device entry per server, got {servers} "
                             f"servers and devices {list(devices)}")
        self.engines: list[VLLMEngine] = []
        self._threads = ThreadPoolExecutor(servers, thread_name_prefix="wmrl-vllm")
        starts = [self._threads.submit(VLLMEngine, model_dir, **kwargs,
                                       env={"CUDA_VISIBLE_DEVICES": devices[i]} if devices else None)
                  for i in range(servers)]  # started together: each start is mostly loading
        try:
            self.engines = _all(starts)
        except BaseException:  # one failed, or we were interrupted: no server outlives the pool
            for start in starts:
                start.add_done_callback(lambda f: f.exception() is None and f.result().close())
            self._threads.shutdown(wait=False)
            raise

    def generate(self, prompts, params, *, generator=None, greedy=False):
        if not prompts:
            return []
        seeds, n = _seeds(generator, len(prompts)), len(self.engines)
        blocks = [block(len(prompts), i, n) for i in range(n)]
        parts = _all([self._threads.submit(engine.generate_seeded, prompts[lo:hi], params, seeds[lo:hi], greedy)
                      for engine, (lo, hi) in zip(self.engines, blocks)])
        return [reply for part in parts for reply in part]

    def sync(self, module: torch.nn.Module) -> float:
        t0 = time.perf_counter()
        payload = weights_payload(module)  # serialized once, sent to every server at once
        _all([self._threads.submit(engine.load, payload) for engine in self.engines])
        return time.perf_counter() - t0

    def close(self) -> None:
        for engine in self.engines:
            engine.close()
        self.engines = []
        self._threads.shutdown(wait=False)


def _all(futures: Sequence[Future]) -> list:
    """Every future's result, after all of them finished (a failed one raises only then: no server is left
    with a request whose reply nobody reads)."""
    wait(futures)
    return [f.result() for f in futures]


def weights_payload(module: torch.nn.Module) -> bytes:
    """`module`'s weights (LoRA adapters merged in) as safetensors bytes, what a vLLM server reloads."""
    from safetensors.torch import save

    state, seen = {}, set()
    for name, tensor in merged(module).state_dict().items():
        if tensor.data_ptr() in seen:  # tied weights (embeddings and head): vLLM ties them itself
            continue
        seen.add(tensor.data_ptr())
        state[name] = tensor.detach().to("cpu", torch.float32).contiguous().clone()
    return save(state)


def _seeds(generator: torch.Generator | None, n: int) -> list[int]:
    """One sampling seed per prompt from the caller's generator."""
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    return torch.randint(0, 2**31 - 1, (n,), generator=gen).tolist()


ENGINES = {"hf": HFEngine, "vllm": VLLMEngine}


def open_engine(kind: str, module: torch.nn.Module, pad_id: int, model_dir: str | None, *,
                servers: int = 1, devices: Sequence[str] = ()) -> RolloutEngine:
    """The `kind` engine for `module`; a vLLM one (`servers` of them, a pool when > 1, server i on
    `devices[i]` when given) loads `model_dir` and takes the module's weights as they are now."""
    if kind not in ENGINES:
        raise ValueError(f"rollout engine must be one of {', '.join(ENGINES)}, got {kind!r}")
    if kind == "hf":
        return HFEngine(module, pad_id)
    if model_dir is None:
        raise ValueError("rollout engine vllm loads the model from its folder: pass a model path, not a loaded model")
    if servers == 1:
        engine = VLLMEngine(model_dir, env={"CUDA_VISIBLE_DEVICES": devices[0]} if devices else None)
    else:
        engine = VLLMPool(model_dir, servers, devices=devices)
    engine.sync(module)
    return engine
