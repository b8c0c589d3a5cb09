"""`VLAEnv`: the real environment of the VLA domain, robosuite simulators in worker processes.

Why processes: MuJoCo and its GL context are native code that can crash, hang
or leak; a worker process bounds the damage. A worker that dies or does not
answer within `step_timeout_s` is killed and replaced by a fresh one, and the
episodes it held end with an *unknown* grade (`reward=None`, status `infra`)
instead of a made-up failure, so the estimator excludes them. A Python
exception inside one episode's simulation ends only that episode (status
`infra`); the worker discards that simulator and goes on with its others.

One `step` executes one action chunk ([k, 7], k <= `chunk`) per live episode,
stopping early at success. The reward is sparse: 1.0 on the transition that
ends the episode in success, 0.0 everywhere else; an episode that reaches its
horizon unsolved ends with status `truncated`.

Episodes are spread round-robin over the `workers` processes (`capacity`); a
worker keeps one simulator per concurrent episode of a family, built once and
reused across resets. With `executor: ray` each worker is a Ray actor instead
(any node of a Ray cluster; `core/ray_slots.py`), with the same rules: a dead or
silent actor is replaced and its live episodes are unknown grades.

Test hook (no mocks needed): `VLAEnvConfig.faults` maps a task id to "raise",
"hang" or "exit"; the worker then really raises, sleeps past the timeout, or
exits (as a segfault would) on that episode's first step.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from wmrl.core.interfaces import RealEnv
from wmrl.core.types import Task, Transition
from wmrl.core.validation import at_least
from wmrl.domains.vla.tasks import FAMILIES, VLATaskSpec, family

log = logging.getLogger(__name__)

FAULTS = ("raise", "hang", "exit")


@dataclass
class VLAEnvConfig:
    image_size: int = 64
    #: the most low-level actions one step (one chunk) may carry
    chunk: int = 8
    #: per-family episode length in 20 Hz steps; families not named keep their default (tasks.FAMILIES)
    horizon_steps: dict[str, int] = field(default_factory=dict)
    workers: int = 2
    step_timeout_s: float = 60.0
    #: a reset may build simulators (seconds each) in a freshly started worker
    reset_timeout_s: float = 300.0
    control_freq: int = 20
    #: test hook: task id -> "raise" | "hang" | "exit" on that episode's first step
    faults: dict[str, str] = field(default_factory=dict)
    #: where simulators run: "local" (worker processes) or "ray" (one Ray actor per worker, any node)
    executor: str = "local"
    ray_address: str | None = None  # executor ray: None starts a local Ray; "auto" joins a running cluster

    def validate(self) -> None:
        at_least(self, "env", 1, "image_size", "chunk", "workers", "control_freq")
        if not (self.step_timeout_s > 0 and self.reset_timeout_s > 0):
            raise ValueError("env.step_timeout_s and env.reset_timeout_s must be > 0")
        for name, steps in self.horizon_steps.items():
            if name not in FAMILIES:
                raise ValueError(f"env.horizon_steps names unknown family {name!r}; known: {sorted(FAMILIES)}")
            if not (isinstance(steps, int) and steps >= 1):
                raise ValueError(f"env.horizon_steps[{name!r}] must be an int >= 1, got {steps!r}")
        for task_id, kind in self.faults.items():
            if kind not in FAULTS:
                raise ValueError(f"env.faults[{task_id!r}] must be one of {FAULTS}, got {kind!r}")
        if self.executor not in ("local", "ray"):
            raise ValueError(f"env.executor must be local or ray, got {self.executor!r}")
        if self.ray_address is not None and self.executor != "ray":
            raise ValueError("env.ray_address is set but env.executor is not ray: set env.executor=ray")

    def horizon(self, family_name: str) -> int:
        return self.horizon_steps.get(family_name, family(family_name).horizon_steps)


class _SimHost:
    """One worker's simulators and the episodes it holds; answers reset / step / close requests."""

    def __init__(self, cfg: VLAEnvConfig):
        os.environ.setdefault("MUJOCO_GL", "egl")
        from wmrl.domains.vla.sim import Simulator

        self.cfg, self._simulator = cfg, Simulator
        self.pool: dict[str, list] = {}
        self.episodes: dict[int, Any] = {}
        self.faults: dict[int, str] = {}

    def handle(self, kind: str, payload: Any) -> tuple[str, Any]:
        """("ok", reply) or ("error", traceback)."""
        if kind == "close":
            for sim in (s for sims in self.pool.values() for s in sims):
                sim.close()
            return ("ok", None)
        try:
            if kind == "reset":
                return ("ok", self._reset(payload))
            if kind == "step":
                return ("ok", [_run_chunk(slot, chunk, self.episodes, self.pool, self.faults) for slot, chunk in payload])
            return ("error", f"unknown request {kind!r}")
        except Exception:
            return ("error", traceback.format_exc(limit=4))

    def _reset(self, payload) -> list:
        self.episodes.clear()
        self.faults.clear()
        replies = []
        for slot, spec, fault in payload:
            free = [s for s in self.pool.get(spec.family, []) if s not in self.episodes.values()]
            if not free:
                sim = self._simulator(spec.family, self.cfg.image_size, self.cfg.horizon(spec.family),
                                      self.cfg.control_freq)
                self.pool.setdefault(spec.family, []).append(sim)
                free = [sim]
            self.episodes[slot] = free[0]
            if fault:
                self.faults[slot] = fault
            replies.append(free[0].reset(spec))
        return replies


def _worker(conn, cfg: VLAEnvConfig) -> None:
    """A worker process's loop: one reply per request on `conn`, until "close"."""
    # Ctrl-C reaches the terminal's whole process group: the trainer decides when to stop, not its workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host = _SimHost(cfg)
    while True:
        kind, payload = conn.recv()
        conn.send(host.handle(kind, payload))
        if kind == "close":
            return


class SimActor:
    """A worker as a Ray actor (`executor: ray`): the same host, called instead of messaged."""

    def __init__(self, cfg: VLAEnvConfig):
        self.host = _SimHost(cfg)

    def handle(self, kind: str, payload: Any) -> tuple[str, Any]:
        return self.host.handle(kind, payload)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.host.handle("close", None)


def _run_chunk(slot: int, chunk: np.ndarray, episodes: dict, pool: dict, faults: dict) -> tuple:
    """Execute one chunk on one episode: ("ok", obs, success, steps) or ("error", reason)."""
    sim = episodes[slot]
    try:
        fault = faults.pop(slot, None)
        if fault == "raise":
            raise RuntimeError("injected fault (VLAEnvConfig.faults test hook)")
        if fault == "hang":
            time.sleep(10**6)
        if fault == "exit":
            os._exit(3)
        for action in chunk:
            if sim.done:
                break
            sim.step(action)
        return ("ok", sim.observation(), sim.success, sim.steps)
    except Exception as exc:
        # its state is suspect: this simulator serves no later episode
        pool[sim.family].remove(sim)
        del episodes[slot]
        return ("error", f"{type(exc).__name__}: {exc}")


@dataclass
class _Episode:
    worker: int
    slot: int
    task: Task
    obs: Any
    steps: int = 0
    done: bool = False
    #: why the episode is lost (its worker died while it was live)
    lost: str | None = None


class _ProcessWorkers:
    """Workers as local processes, a pipe each."""

    def __init__(self, cfg: VLAEnvConfig):
        self.cfg = cfg
        self._ctx = mp.get_context("spawn")
        self._workers: list[tuple[Any, Any] | None] = [self._start() for _ in range(cfg.workers)]

    def _start(self) -> tuple[Any, Any]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child, self.cfg), daemon=True, name="wmrl-vla-worker")
        proc.start()
        child.close()
        return proc, parent

    def _replace(self, w: int, reason: str) -> None:
        log.warning("VLA worker %d replaced: %s", w, reason)
        proc, conn = self._workers[w]
        proc.kill()
        proc.join(5)
        conn.close()
        self._workers[w] = self._start()

    def exchange(self, requests: dict[int, tuple[str, Any]], timeout_s: float) -> dict[int, tuple[str, Any]]:
        """Send each worker its request, gather the replies; a dead or silent worker's reply is ("lost", why)."""
        replies: dict[int, tuple[str, Any]] = {}
        for w, request in requests.items():
            try:
                self._workers[w][1].send(request)
            except (OSError, EOFError) as exc:
                replies[w] = ("lost", f"worker {w} could not be reached: {exc!r}")
        deadline = time.monotonic() + timeout_s
        for w in requests:
            if w in replies:
                continue
            conn = self._workers[w][1]
            try:
                if conn.poll(max(0.0, deadline - time.monotonic())):
                    replies[w] = conn.recv()
                else:
                    replies[w] = ("lost", f"worker {w} did not answer within {timeout_s:g} s")
            except (OSError, EOFError):
                code = self._workers[w][0].exitcode
                replies[w] = ("lost", f"worker {w} died (exit code {code})")
        for w, (kind, why) in replies.items():
            if kind != "ok":
                self._replace(w, why)
        return replies

    def pids(self) -> list[int]:
        return [proc.pid for proc, _ in self._workers]

    def close(self) -> None:
        for w, worker in enumerate(self._workers):
            if worker is None:
                continue
            proc, conn = worker
            try:
                conn.send(("close", None))
                if conn.poll(5):
                    conn.recv()
            except (OSError, EOFError):
                pass
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            conn.close()
            self._workers[w] = None


class _RayWorkers:
    """Workers as Ray actors (`core/ray_slots.py`): the same replies, the same replacement rules."""

    def __init__(self, cfg: VLAEnvConfig):
        from wmrl.core.ray_slots import RaySlots

        self._slots: Any = RaySlots(SimActor, cfg.workers, args=(cfg,), address=cfg.ray_address, name="VLA worker")

    def exchange(self, requests: dict[int, tuple[str, Any]], timeout_s: float) -> dict[int, tuple[str, Any]]:
        replies = self._slots.call_each({w: ("handle", r) for w, r in requests.items()}, timeout_s)
        out = {w: reply if kind == "ok" else (kind, reply) for w, (kind, reply) in replies.items()}
        for w, (kind, why) in out.items():
            if kind == "error":  # the worker raised: its simulators are suspect, as with a process
                log.warning("VLA worker %d replaced: %s", w, str(why).strip().splitlines()[-1][:300])
                self._slots.replace(w)
        return out

    def pids(self) -> list[int]:
        return self._slots.call_all("pid")

    def close(self) -> None:
        if self._slots is not None:
            slots, self._slots = self._slots, None
            slots.close("close")


class VLAEnv(RealEnv):
    def __init__(self, cfg: VLAEnvConfig | None = None):
        self.cfg = cfg or VLAEnvConfig()
        self.cfg.validate()
        self.capacity = self.cfg.workers
        self._workers: _ProcessWorkers | _RayWorkers | None = None  # set first: __del__ may run if the next fails
        self._workers = _RayWorkers(self.cfg) if self.cfg.executor == "ray" else _ProcessWorkers(self.cfg)
        self._episodes: list[_Episode] = []

    def _exchange(self, requests: dict[int, tuple[str, Any]], timeout_s: float) -> dict[int, tuple[str, Any]]:
        return self._workers.exchange(requests, timeout_s)

    def worker_pids(self) -> list[int]:
        """The workers' process ids, in worker order (a replaced worker has a new one)."""
        return self._workers.pids()

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        for t in tasks:
            if not isinstance(t.payload, VLATaskSpec):
                raise ValueError(f"task {t.id!r}: payload must be a VLATaskSpec, got {type(t.payload).__name__}")
            family(t.payload.family)
        n = self.capacity
        self._episodes = [_Episode(i % n, i, t, None) for i, t in enumerate(tasks)]
        requests = {
            w: ("reset", [(e.slot, e.task.payload, self.cfg.faults.get(e.task.id)) for e in self._episodes if e.worker == w])
            for w in range(n)
        }
        requests = {w: r for w, r in requests.items() if r[1]}
        replies = self._exchange(requests, self.cfg.reset_timeout_s)
        failed = {w: requests[w] for w, (kind, _) in replies.items() if kind != "ok"}
        if failed:
            # once more on fresh workers: a reset has no grade to make unknown, so it must succeed
            retry = self._exchange(failed, self.cfg.reset_timeout_s)
            for w, (kind, why) in retry.items():
                if kind != "ok":
                    raise RuntimeError(f"VLAEnv.reset failed twice on worker {w}: {why}")
            replies.update(retry)
        for w, (_, observations) in replies.items():
            for e, obs in zip([e for e in self._episodes if e.worker == w], observations):
                e.obs = obs
        return [e.obs for e in self._episodes]

    def _check_action(self, i: int, action: Any) -> np.ndarray:
        k = self.cfg.chunk
        a = np.asarray(action, dtype=np.float32)
        if a.ndim != 2 or a.shape[1] != 7 or not 1 <= a.shape[0] <= k:
            raise ValueError(
                f"action {i}: expected an action chunk of shape [k, 7] with 1 <= k <= {k} "
                f"(float32 OSC_POSE deltas + gripper), got shape {tuple(a.shape)}"
            )
        if not np.isfinite(a).all():
            raise ValueError(f"action {i}: the chunk holds non-finite values")
        if self._episodes[i].done:
            raise ValueError(f"action {i}: episode {self._episodes[i].task.id!r} is done; pass None for it")
        return np.clip(a, -1.0, 1.0)

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        if len(actions) != len(self._episodes):
            raise ValueError(f"step got {len(actions)} actions for a batch of {len(self._episodes)} episodes")
        chunks = {i: self._check_action(i, a) for i, a in enumerate(actions) if a is not None}
        out: list[Transition | None] = [None] * len(actions)
        for i in [i for i in chunks if self._episodes[i].lost]:
            out[i] = self._lost(self._episodes[i])
            del chunks[i]
        requests: dict[int, tuple[str, Any]] = {}
        for i, chunk in chunks.items():
            e = self._episodes[i]
            requests.setdefault(e.worker, ("step", []))[1].append((e.slot, chunk))
        replies = self._exchange(requests, self.cfg.step_timeout_s)
        for w, (kind, payload) in replies.items():
            on_worker = [i for i in chunks if self._episodes[i].worker == w]
            if kind != "ok":
                # every live episode the worker held is gone with it
                for e in self._episodes:
                    if e.worker == w and not e.done:
                        e.lost = payload if kind == "lost" else f"worker {w} raised: {payload}"
                for i in on_worker:
                    out[i] = self._lost(self._episodes[i])
                continue
            for i, result in zip(on_worker, payload):
                out[i] = self._transition(self._episodes[i], result)
        return out

    def _lost(self, e: _Episode) -> Transition:
        e.done = True
        return Transition(e.obs, None, True, info={"status": "infra", "reason": e.lost, "steps": e.steps})

    def _transition(self, e: _Episode, result: tuple) -> Transition:
        if result[0] == "error":
            e.lost = f"simulation raised: {result[1]}"
            return self._lost(e)
        _, obs, success, steps = result
        e.obs, e.steps = obs, steps
        e.done = success or steps >= self.cfg.horizon(e.task.payload.family)
        status = "truncated" if e.done and not success else "ok"
        info = {"status": status, "success": bool(success), "steps": steps}
        return Transition(obs, 1.0 if success else 0.0, e.done, info=info)

    def close(self) -> None:
        if self._workers is not None:
            workers, self._workers = self._workers, None
            workers.close()

    def __enter__(self) -> "VLAEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # a safety net for callers that forget close(); never raise from a finaliser
        try:
            self.close()
        except Exception:
            pass
