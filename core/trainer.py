"""The domain-agnostic WMRL training loop.

One step, in the order the method prescribes (DESIGN section 3):

    sample tasks -> choose anchor groups -> roll anchor groups out in the real
    environment and grade them with both scorers -> roll the other groups out
    inside the world model -> store real executions and anchor pairs -> estimate
    (debias, denoise, advantages) -> policy update through the engine ->
    metrics, checkpoint.

Real executions are the expensive, irreplaceable data: each batch is committed to
the run store as soon as the environment returns it, keyed by its position in the
run (step, group, member), and a resumed run looks every key up before executing
anything. A domain with bulky observations archives them first in its own format
(`Domain.make_archive`, `core/archive.py`), and the store keeps references. Resume restores the last checkpoint (weights, optimizer, the trainer's
generator, estimator and world-model state), so the re-played steps draw the
same anchors and reuse what was stored. Randomness comes only from seeded
generators (the one passed to `Policy.act`, and each component's own): the
trainer neither seeds nor checkpoints torch's process-wide RNG, so a policy or
world model that draws from it is not reproducible and must own a generator.

With `engine.world_size` > 1 this class runs on every rank: rank 0 (the leader)
collects, estimates and writes the run folder; every rank updates on its block
of the step's turns (`core/ranks.py`).
"""

from __future__ import annotations

import logging
import math
import signal
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from wmrl.core.anchors import AnchorConfig, AnchorScheduler
from wmrl.core.async_anchors import AnchorBatch, AnchorPipeline, Landed, RecordedReplies
from wmrl.core.archive import load_trajectories, referenced
from wmrl.core.domain import Domain
from wmrl.core.engine import Engine, EngineConfig, ensure_distributed
from wmrl.core.errors import Interrupted, StorageError
from wmrl.core.estimators import EstimatorConfig, build_estimator
from wmrl.core.interfaces import Policy, RealEnv
from wmrl.core.loss import ObjectiveConfig, SurrogateBatch, has_token_log_probs, prior_term
from wmrl.core.metrics import MetricsLogger
from wmrl.core.observers import OracleObserver, StepObserver
from wmrl.core.registry import ESTIMATORS
from wmrl.core.ranks import current_ranks
from wmrl.core.replay import StoredReplay, batch_name, eval_key, group_id, train_key
from wmrl.core.rollout import RolloutTimes, rollout, wm_prediction
from wmrl.core.run_lock import RunLock
from wmrl.core.signals import StopRequests
from wmrl.core.store import AnchorPair, ExecutionRecord, RunStore
from wmrl.core.types import SPLITS, Estimate, Group, Outcome, Task, Trajectory
from wmrl.core.validation import validate_config
from wmrl.core.wm_runtime import WorldModelRuntime, open_world_model
from wmrl.core.wm_spec import WorldModelConfig, default_config

log = logging.getLogger(__name__)


@dataclass
class TrainerConfig:
    steps: int = 30
    groups_per_step: int = 8
    group_size: int = 8
    ppo_epochs: int = 1
    clip_eps: float = 0.2
    micro_batch: int = 0  # turns per log_prob call in an update (bounds its memory); 0: all at once
    #: ratios (sequence | token), token aggregation (grpo | dapo | dr_grpo), KL beta (`core/loss.py`)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    eval_every: int = 10  # 0: evaluate only before and after training
    eval_samples: int = 4  # real episodes per held-out task per evaluation
    eval_splits: list[str] = field(default_factory=lambda: ["test_id", "test_ood"])
    checkpoint_every: int = 5
    checkpoint_keep: int = 3  # newest checkpoints kept (a damaged one falls back to the one before); 0: all
    seed: int = 0

    def validate(self) -> None:
        for name in ("steps", "groups_per_step", "group_size", "ppo_epochs", "eval_samples", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be >= 1")
        if self.checkpoint_keep < 0:
            raise ValueError("trainer.checkpoint_keep must be >= 0 (0: keep every checkpoint)")
        if isinstance(self.micro_batch, bool) or not isinstance(self.micro_batch, int) or self.micro_batch < 0:
            raise ValueError(f"trainer.micro_batch must be an integer >= 0 (0: the whole step at once), got {self.micro_batch!r}")
        if self.group_size < 2:
            raise ValueError("trainer.group_size must be >= 2: GRPO needs a group baseline")
        unknown = [s for s in self.eval_splits if s not in SPLITS]
        if unknown:
            raise ValueError(f"trainer.eval_splits: unknown split {unknown[0]!r}; splits are {', '.join(SPLITS)}")


def default_world_model(domain: Domain) -> WorldModelConfig | None:
    """The config of the domain's default world model, every key at its default (None: it has none)."""
    name = domain.default_world_model
    return None if name is None else default_config(name)


def _check_async(anchors: AnchorConfig, estimator: EstimatorConfig, trainer: TrainerConfig, domain: Domain) -> None:
    """What asynchronous anchors cannot do, refused before anything is built."""
    k = anchors.max_staleness
    if k is None:
        return
    if domain.max_turns != 1:
        raise ValueError(f"anchors.max_staleness needs a single-turn domain and {type(domain).__name__} runs "
                         f"{domain.max_turns} turns (a multi-turn episode calls the policy between executions): "
                         "set anchors.max_staleness=null")
    fixed = ESTIMATORS.get(estimator.mode).fixed_anchor_fraction
    if fixed == 0.0:
        raise ValueError(f"estimator.mode={estimator.mode} runs no anchors: set anchors.max_staleness=null")
    if anchors.stale_use == "calibrate" and (fixed == 1.0 or estimator.rectified):
        why = (f"estimator.mode={estimator.mode} trains on real grades only" if fixed == 1.0 else
               "estimator.rectified corrects the world model's gradient with the anchors' real one")
        raise ValueError(f"{why}, and anchors.stale_use=calibrate keeps anchors out of the gradient: use stale_use=train")
    if estimator.rectified and k > 0:
        raise ValueError("estimator.rectified weights each anchor group by its step's anchor fraction, and with "
                         "anchors.max_staleness > 0 a step mixes groups of several steps: use max_staleness=0 or "
                         "estimator.rectified=false")
    if anchors.stale_use == "train" and k > 0 and trainer.objective.ratio == "token":
        raise ValueError("trainer.objective.ratio=token takes its old log-probs from the policy just before the "
                         "update, so a late anchor group would get no importance correction: use ratio=sequence "
                         "(against the log-probs recorded at sampling) or anchors.stale_use=calibrate")


class Trainer:
    def __init__(
        self,
        domain: Domain,
        *,
        trainer: TrainerConfig,
        estimator: EstimatorConfig,
        anchors: AnchorConfig,
        engine: EngineConfig,
        world_model: WorldModelConfig | None = None,
        run_dir: str | Path,
        run_id: str = "run",
        tensorboard: bool = True,
        checkpoint: str | None = None,
    ):
        """`world_model`: the `world_model:` section (None: the domain's default world model);
        `checkpoint`: the tag to restore (None: the latest, if any)."""
        for section in (trainer, anchors, world_model):
            validate_config(section)  # the engine and the estimator check their own sections
        self.cfg = trainer
        self.domain = domain
        self.run_id = run_id
        self.dir = Path(run_dir)
        if engine.world_size > 1:
            ensure_distributed()  # the launcher's process group, before anything is written
        self.ranks = current_ranks()
        self.lock: RunLock | None = None
        if self.ranks.leader:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.lock = RunLock(self.dir)  # one writer per run directory: the leader
        try:
            self._open(domain, trainer, estimator, anchors, engine, world_model, tensorboard, checkpoint)
        except BaseException:
            if self.lock is not None:
                self.lock.release()
            raise

    def _open(self, domain: Domain, trainer: TrainerConfig, estimator: EstimatorConfig, anchors: AnchorConfig,
              engine: EngineConfig, world_model: WorldModelConfig | None, tensorboard: bool,
              checkpoint: str | None) -> None:
        _check_async(anchors, estimator, trainer, domain)
        self.anchor_cfg = anchors
        self.pipeline: AnchorPipeline | None = None  # asynchronous anchors in flight (the leader's)
        self.anchor_env: RealEnv | None = None  # the environment they execute in
        self.policy = domain.make_policy(trainer.seed)
        if trainer.objective.ratio == "token" and not has_token_log_probs(self.policy):
            raise ValueError(f"trainer.objective.ratio=token needs per-token log-probabilities and "
                             f"{type(self.policy).__name__} has no token_log_probs: use ratio: sequence")
        if trainer.objective.ptx > 0 and not (has_token_log_probs(self.policy)
                                              and domain.prior_examples(1, [trainer.seed]) is not None):
            raise ValueError("trainer.objective.ptx > 0 needs a domain with prior examples (Domain.prior_examples: "
                             "AutoResearch's are its agent's SFT corpus) and a policy with token_log_probs")
        #: the KL's reference: the policy as it starts, built again (its initial weights depend on the seed alone)
        self.reference: Policy | None = None
        if trainer.objective.beta > 0:
            self.reference = domain.make_policy(trainer.seed)
            self.reference.module.requires_grad_(False).eval()
        self.engine = Engine(self.policy.module, engine, self.policy.param_groups())
        #: the policy the leader rolls out: the trained one, or, where ZeRO-3 shards it over ranks, a full
        #: replica the leader keeps in step with it (`_sync_actor`); None on a learner rank then
        self.actor: Policy | None = self.policy
        if engine.zero_stage == 3 and self.ranks.world > 1:
            self.actor = domain.make_policy(trainer.seed) if self.ranks.leader else None
            if self.actor is not None:  # where and as what the trained module computes (a GPU, bf16)
                like = next(self.policy.module.parameters())
                self.actor.module.to(device=like.device, dtype=like.dtype)
        self.estimator = build_estimator(estimator, anchors.fraction)
        # a mode that fixes rho (real, wm, fused) keeps it fixed; every rank has one (its sums are checkpointed)
        self.scheduler = AnchorScheduler(anchors, self.estimator.anchor_fraction,
                                         adaptive=type(self.estimator).fixed_anchor_fraction is None)
        self.generator = torch.Generator().manual_seed(trainer.seed)
        self.step = 0
        self.history: list[dict] = []  # evaluation rows
        self.real_wall = 0.0  # cumulative wall-clock of real execution, survives resume
        self.wall = 0.0
        #: real training episodes bought (eval episodes not counted); asynchronous anchors count when sent
        self.real_executions = 0
        self.world_model: WorldModelRuntime | None = None
        if not self.ranks.leader:  # a learner rank: no environment, world model, store or metrics of its own
            self.env = self.store = self.archive = self.metrics = None  # type: ignore[assignment]
            self.observers: list[StepObserver] = []
            self._resume(checkpoint)
            return
        self.env = domain.make_real_env()
        if self.estimator.uses_world_model:
            wm_cfg = world_model if world_model is not None else default_world_model(domain)
            if wm_cfg is None:
                raise ValueError(f"mode {estimator.mode} needs a world model and domain {type(domain).__name__} has none")
            self.world_model = open_world_model(domain, wm_cfg)
        self.store = RunStore(self.dir / "store.sqlite")
        self.archive = domain.make_archive(self.dir)
        if self.archive.writes_files:  # what a crash left between archive and store goes first
            for location in self.archive.recover(referenced(r.payload for r in self.store.executions(self.run_id))):
                log.warning("removed %s: archived by a run that crashed before storing it", location)
        self.train_tasks = domain.tasks("train")
        if not self.train_tasks:
            raise ValueError(f"domain {type(domain).__name__} has no train tasks")
        if anchors.max_staleness is not None:  # its environment opens when training starts (`train`)
            self.pipeline = AnchorPipeline(self._execute_anchors, anchors.max_staleness)
        #: diagnostics that look at every step, outside the wall (`core/observers.py`)
        self.observers = [OracleObserver(domain, estimator.advantage)]
        self._resume(checkpoint)
        if self.step == 0 and self.world_model is not None:
            self.world_model.warm_start()
        self.metrics = MetricsLogger(self.dir, resume_step=self.step, tensorboard=tensorboard)

    # ------------------------------------------------------------------ state
    def _client_state(self) -> dict:
        return {
            "step": self.step,
            "generator": self.generator.get_state(),
            "estimator": self.estimator.state_dict(),
            "anchors": self.scheduler.state_dict(),
            "world_model": self.world_model.state_dict() if self.world_model is not None else {},
            "history": self.history,
            "real_wall": self.real_wall,
            "wall": self.wall,
            "real_executions": self.real_executions,
            "run_id": self.run_id,
            "anchors_in_flight": self.pipeline.state_dict() if self.pipeline is not None else [],
            "anchors_lag": [self.anchor_cfg.max_staleness, self.anchor_cfg.stale_use],
        }

    def _resume(self, tag: str | None = None) -> None:
        state = self.engine.load(self.dir / "checkpoints", tag)
        self._sync_actor()
        if state is None:
            return
        if state["run_id"] != self.run_id:
            raise ValueError(f"{self.dir} holds run {state['run_id']!r}, not {self.run_id!r}: use another run_dir")
        self.step = int(state["step"])
        self.generator.set_state(state["generator"])
        self.estimator.load_state_dict(state["estimator"])
        if "anchors" in state:  # checkpoints from before the adaptive budget have no sums (a fixed rho needs none)
            self.scheduler.load_state_dict(state["anchors"])
        if self.world_model is not None:
            self.world_model.load_state_dict(state["world_model"])
        self.history = list(state["history"])
        self.real_wall, self.wall = float(state["real_wall"]), float(state["wall"])
        self.real_executions = int(state["real_executions"])
        in_flight = state.get("anchors_in_flight", [])
        lag = state.get("anchors_lag", [None, "train"])  # checkpoints from before asynchronous anchors: synchronous
        if list(lag) != [self.anchor_cfg.max_staleness, self.anchor_cfg.stale_use] and (in_flight or lag[0]):
            raise ValueError(f"the checkpoint of {self.dir} ran with anchors.max_staleness={lag[0]}, "
                             f"anchors.stale_use={lag[1]}: resume with the anchors.max_staleness it ran with (and "
                             "that stale_use); another lag would use its anchors twice or never")
        if in_flight and self.ranks.leader:
            tasks = {t.id: t for t in self.train_tasks}
            for batch in in_flight:  # sent again with the next step's; the store plays back what had finished
                self.pipeline.restore(AnchorBatch.from_state(batch, tasks))
        log.info("resumed %s at step %d", self.dir, self.step)

    def save(self) -> Path:
        # the runtime's state_dict waits for queued fits: a checkpoint holds a finished fit, not one half-way
        return self.engine.save(self.dir / "checkpoints", f"step{self.step:06d}", self._client_state(),
                                keep=self.cfg.checkpoint_keep)

    # ------------------------------------------------------------------ real execution
    def _real(self, tasks: Sequence[Task], keys: Sequence[str], step: int, generator, greedy=False, *,
              policy: Policy | None = None, env: RealEnv | None = None):
        """Roll episodes out in the real environment, reusing any already stored under `keys`.

        The whole batch goes through the rollout either way (`StoredReplay` plays the
        stored ones back), so the generator advances as it did the first time; each
        fresh episode is archived and committed the moment it ends. `policy` and `env`
        default to the actor and the loop's environment (asynchronous anchors pass their own).
        """
        policy = self.actor if policy is None else policy
        env = self.env if env is None else env
        found = self.store.get_executions(keys)
        have = [i for i, k in enumerate(keys) if k in found]
        out: list[Trajectory | None] = [None] * len(keys)
        for i, traj in zip(have, load_trajectories([found[keys[i]].payload for i in have], self.dir,
                                                   names=[keys[i] for i in have])):
            out[i] = traj
        stored = {i: out[i] for i in have}
        fresh = 0

        def commit(ended: list[tuple[int, Trajectory]]) -> None:
            nonlocal fresh
            ended = [(i, t) for i, t in ended if i not in stored]
            if not ended:
                return
            for i, traj in ended:
                traj.real = self._outcome(env, traj)
                out[i] = traj
            # archive first, store second: a crash between them leaves only unreferenced archive data
            try:
                payloads = self.archive.write(batch_name(keys[ended[0][0]]), [t for _, t in ended])
            except OSError as exc:
                raise StorageError.of(exc, self.dir, "could not archive real episodes") from exc
            self.store.put_executions([
                ExecutionRecord(
                    key=keys[i], run_id=self.run_id, step=step, task_id=traj.task.id, status=traj.real.status,
                    reward=traj.real.reward, payload=payload, info={"turns": traj.turns},
                )
                for (i, traj), payload in zip(ended, payloads)
            ])
            fresh += len(ended)

        times = RolloutTimes()
        rollout(
            policy, StoredReplay(env, stored), tasks, source="real", max_turns=self.domain.max_turns,
            generator=generator, greedy=greedy, times=times, on_done=commit,
        )
        missing = [keys[i] for i, t in enumerate(out) if t is None]
        if missing:  # the rollout ends every episode it starts
            raise RuntimeError(f"real rollout left {len(missing)} episodes unfinished, e.g. {missing[0]}")
        return out, times, fresh

    def _outcome(self, env: RealEnv, traj: Trajectory) -> Outcome:
        try:
            return env.outcome(traj)
        except ValueError as exc:  # a domain bug (e.g. unnormalised reward): keep the run, drop the grade
            log.error("real environment gave an invalid outcome for task %s: %s", traj.task.id, exc)
            return Outcome(None, "infra", {"error": str(exc)})

    # ------------------------------------------------------------------ one step
    def _sample_tasks(self, step: int) -> list[Task]:
        rng = np.random.default_rng([self.cfg.seed, step, 7])
        n = self.cfg.groups_per_step
        idx = rng.choice(len(self.train_tasks), size=n, replace=n > len(self.train_tasks))
        return [self.train_tasks[i] for i in idx]

    def collect(self, step: int) -> tuple[list[Group], dict]:
        """Roll out and grade one step's groups (anchors by both scorers, the rest by the WM)."""
        G = self.cfg.group_size
        tasks = self._sample_tasks(step)
        anchor_idx = set(self.scheduler.choose(step, len(tasks)).tolist())
        groups = [Group(id=group_id(step, g), task=t, trajectories=[], anchor=g in anchor_idx) for g, t in enumerate(tasks)]
        if self.pipeline is not None:
            return self._collect_async(step, groups)

        anchor_groups = [g for g in groups if g.anchor]
        keys = [train_key(g.id, m) for g in anchor_groups for m in range(G)]
        real_trajs, real_times, executed = self._real(
            [g.task for g in anchor_groups for _ in range(G)], keys, step, self.generator
        )
        wm_time = self._wm_grade(real_trajs)
        for j, g in enumerate(anchor_groups):
            g.trajectories = real_trajs[j * G : (j + 1) * G]
        wm_times = self._imagine([g for g in groups if not g.anchor])
        self._store_pairs(step, anchor_groups)
        times = {
            "real_executions": float(len(keys)),  # what the step consumed, fresh or (on resume) stored
            "real_executed_fresh": float(executed),
            "time_generation": real_times.generation + wm_times.generation,
            "time_wm": wm_time + wm_times.scorer,
            "time_real": real_times.scorer,
        }
        return groups, times

    def _wm_grade(self, trajectories: list[Trajectory]) -> float:
        """The world model's grade of episodes it did not simulate (anchors); its wall-clock."""
        if self.world_model is None or not trajectories:
            return 0.0
        t0 = time.perf_counter()
        self.world_model.grade(trajectories)
        return time.perf_counter() - t0

    def _imagine(self, groups: list[Group]) -> RolloutTimes:
        """Roll `groups` out inside the world model, each episode graded by it."""
        times = RolloutTimes()
        if not groups:
            return times
        G = self.cfg.group_size
        sim = rollout(self.actor, self.world_model, [g.task for g in groups for _ in range(G)], source="wm",
                      max_turns=self.domain.max_turns, generator=self.generator, times=times)
        for traj in sim:
            traj.wm = wm_prediction(traj)
        for j, g in enumerate(groups):
            g.trajectories = sim[j * G : (j + 1) * G]
        return times

    # ------------------------------------------------------------------ asynchronous anchors
    def _collect_async(self, step: int, groups: list[Group]) -> tuple[list[Group], dict]:
        """`collect` with the anchors of this step sent off and those of step - k consumed (`core/async_anchors.py`)."""
        G, calibrate = self.cfg.group_size, self.anchor_cfg.stale_use == "calibrate"
        anchors = [g for g in groups if g.anchor]
        t0 = time.perf_counter()
        bought = self._sample_anchors(step, anchors)
        generation = time.perf_counter() - t0
        wm_time = 0.0
        if calibrate:  # this step's anchors train now, on the world model's grade of replies not yet run
            wm_time += self._wm_grade([t for g in anchors for t in g.trajectories])
            for g in anchors:
                g.anchor = False
        else:
            for g in anchors:
                g.trajectories = []
        landed = self.pipeline.due(step, last=step == self.cfg.steps)
        late: dict[str, Group] = {}
        for arrived in landed:
            b = arrived.batch
            wm_time += self._wm_grade(arrived.trajectories)
            for j, gid in enumerate(b.group_ids):
                late[gid] = Group(gid, b.tasks[j * G], arrived.trajectories[j * G : (j + 1) * G], anchor=True,
                                  train=not calibrate)
        wm_times = self._imagine([g for g in groups if not g.anchor and not g.trajectories])
        for arrived in landed:
            self._store_pairs(arrived.batch.step, [late[gid] for gid in arrived.batch.group_ids])
        if calibrate:  # every group of this step trains; the landed ones only calibrate
            out = groups + list(late.values())
        else:  # older steps' groups first, then this step's in order (with k = 0 each lands in its own place)
            mine = {g.id for g in groups}
            out = [g for gid, g in late.items() if gid not in mine]
            out += [late.get(g.id, g) for g in groups if g.trajectories or g.id in late]
        times = {
            # bought this step (counted when sent: an evaluation after `settle` has them all executed)
            "real_executions": float(bought),
            "real_executed_fresh": float(sum(a.fresh for a in landed)),
            "time_generation": generation + wm_times.generation,
            "time_wm": wm_time + wm_times.scorer,
            "time_real": sum(a.waited for a in landed),  # the loop's wait: what real execution cost it
            "time_real_background": sum(a.execution_time for a in landed),
            "anchor_staleness": float(max(step - a.batch.step for a in landed)) if landed else float("nan"),
            "anchor_batches_in_flight": float(len(self.pipeline.pending)),
        }
        return out, times

    def _sample_anchors(self, step: int, anchors: list[Group]) -> int:
        """Sample the anchor groups' replies on this thread (the step's policy and generator) and send them to
        the worker; each group keeps its episodes as sampled (not yet run). Returns the executions sent: none
        when the environment cannot open the episodes (the groups are then left without episodes, as a
        synchronous step's reset failure leaves them without grades)."""
        if not anchors:
            return 0
        G = self.cfg.group_size
        tasks = [g.task for g in anchors for _ in range(G)]
        try:
            obs = list(self.env.reset(tasks))
        except Exception as exc:  # the scorer failed: not the run's failure
            log.warning("step %d: real reset failed: %r; its %d anchor groups are not run", step, exc, len(anchors))
            return 0
        self.actor.reset(tasks)
        with torch.no_grad():
            actions, log_probs = self.actor.act(obs, generator=self.generator)
        for j, g in enumerate(anchors):
            g.trajectories = [Trajectory(task=g.task, source="real", observations=[obs[i]], actions=[actions[i]],
                                         log_probs=[float(log_probs[i])]) for i in range(j * G, (j + 1) * G)]
        self.pipeline.submit(AnchorBatch(step, [g.id for g in anchors], tasks,
                                         [train_key(g.id, m) for g in anchors for m in range(G)], list(actions),
                                         [float(x) for x in log_probs]))
        return len(tasks)

    def _execute_anchors(self, batch: AnchorBatch) -> tuple[list[Trajectory], float, int]:
        """The worker's job: run a batch's recorded replies in the anchor environment, each committed as it ends."""
        assert self.anchor_env is not None, "the anchor environment opens in train(), before any batch is sent"
        trajs, times, fresh = self._real(batch.tasks, batch.keys, batch.step, None,
                                         policy=RecordedReplies(batch.actions, batch.log_probs), env=self.anchor_env)
        return trajs, times.scorer, fresh

    def train_step(self, step: int) -> dict:
        """One step; its metrics on the leader (a learner rank only updates and returns {})."""
        t_step = time.perf_counter()
        if self.ranks.leader:
            groups, times = self.collect(step)
            est = self.estimator.estimate(groups)
            d = est.diagnostics
            if "anchor_oos_pairs" in d:
                self.scheduler.observe(d["anchor_oos_sq_residual"], d["anchor_sq_deviation"], int(d["anchor_oos_pairs"]))
            d.update(anchor_budget_next=self.scheduler.fraction, unexplained_oos=self.scheduler.unexplained)
        groups, est = self.ranks.broadcast((groups, est) if self.ranks.leader else None)
        t0 = time.perf_counter()
        update = self._update(groups, est)
        update_time = time.perf_counter() - t0
        if not self.ranks.leader:
            return {}
        if self.pipeline is not None and self._evaluates(step):  # evaluation never overlaps anchors in flight
            times["time_real"] += self.pipeline.settle()
        step_time = time.perf_counter() - t_step
        self.real_wall += times["time_real"]
        self.wall += step_time
        self.real_executions += int(times["real_executions"])
        observed = self._observe(step, groups, est)
        return {
            **est.diagnostics,
            **update,
            **times,
            **observed,
            "time_update": update_time,
            "time_step": step_time,
            "wall": self.wall,
        }

    def _store_pairs(self, step: int, anchor_groups: list[Group]) -> None:
        """Persist the step's anchor pairs, then let a learning world model see the graded anchors."""
        pairs = [
            AnchorPair(self.run_id, step, g.id, m, g.task.id, t.wm.mean, t.wm.var, t.real.reward)
            for g in anchor_groups
            for m, t in enumerate(g.trajectories)
            if t.wm is not None and t.wm.known and t.real is not None and t.real.known
        ]
        self.store.add_anchor_pairs(pairs)
        if self.world_model is not None:
            self.world_model.learn([t for g in anchor_groups for t in g.trajectories if t.real is not None and t.real.known])

    def _observe(self, step: int, groups: list[Group], est: Estimate) -> dict:
        out: dict = {"observer_errors": 0.0} if self.observers else {}
        for observe in self.observers:
            try:
                out.update(observe(step, groups, est))
            except Exception as exc:  # a diagnostic must not stop training
                log.warning("step observer %r failed: %r", observe, exc)
                out["observer_errors"] += 1.0
        return out

    # ------------------------------------------------------------------ update
    def _update(self, groups: list[Group], est: Estimate) -> dict:
        batch = SurrogateBatch(groups, est, self.cfg.objective)
        if not len(batch):
            return {"loss": float("nan"), "grad_norm": float("nan"), "trained_trajectories": 0.0}
        batch.prepare(self.policy, self.reference, self.cfg.micro_batch)  # before the first optimizer step
        stats: dict = {}
        rank, world = self.ranks.rank, self.ranks.world
        obj = self.cfg.objective
        prior = (self.domain.prior_examples(obj.ptx_examples, [self.cfg.seed, self.step + 1, rank])
                 if obj.ptx > 0 else None)
        nll: list[float] = []
        for _ in range(self.cfg.ppo_epochs):
            shares = batch.micro_batches(self.policy, self.cfg.clip_eps, self.cfg.micro_batch, rank=rank, world=world)
            if prior:  # each rank its own examples; the engine averages gradients over ranks
                shares.append(partial(self._prior_share, prior, obj.ptx * world, nll))
            try:
                stats = self.engine.step(shares)
            except FloatingPointError as exc:  # every rank skips it together (Engine.step); the run goes on
                log.warning("step %d: %s", self.step + 1, exc)
                stats = {"loss": float("nan"), "grad_norm": float("nan"), "update_skipped": 1.0}
                break
        stats["loss"] = self.ranks.mean(stats["loss"])  # each rank's shares are scaled by the world size
        self._sync_actor()
        stats["trained_trajectories"] = float(batch.trajectories)
        if self.reference is not None:
            stats["kl_ref"] = batch.kl
        if prior:  # every rank joins the mean, also one whose update stopped before its prior share
            stats["prior_nll"] = self.ranks.mean(nll[0] if nll else float("nan"))  # before the first optimizer step
        return stats

    def _prior_share(self, examples: list, weight: float, record: list[float]) -> torch.Tensor:
        """The ptx term's share of the loss: `weight` x the prior examples' NLL aggregated like the policy
        term (their mean token NLL is recorded)."""
        term, per_token = prior_term(self.policy, examples, self.cfg.objective)
        record.append(per_token)
        return weight * term

    def _sync_actor(self) -> None:
        """The trained weights changed (an update, a checkpoint loaded): bring the rollout policy up to them.

        With a replica, every rank takes part: ZeRO-3 gathers the trainable parameters from all ranks
        one layer at a time (read-only) and the leader copies them into its replica; frozen weights (a
        LoRA base) never change, and buffers are not sharded."""
        if self.actor is self.policy:
            with self.engine.gathered():  # one rank's ZeRO-3: a vLLM sync reads whole weights
                self.policy.weights_changed()
            return
        target = None if self.actor is None else dict(self.actor.module.named_parameters())
        with torch.no_grad():
            for name, tensor in self.engine.trained_weights():
                if target is not None:
                    target[name].copy_(tensor)
            if self.actor is not None:
                mine = dict(self.actor.module.named_buffers())
                for name, buffer in self.policy.module.named_buffers():
                    mine[name].copy_(buffer)
        if self.actor is not None:
            self.actor.weights_changed()

    # ------------------------------------------------------------------ evaluation
    def held_out(self, split: str, *, tag: str = "", seed: int | None = None) -> tuple[list[Trajectory], float]:
        """`eval_samples` real episodes per task of `split` (stored; a stored key is read back, not re-run),
        drawn with `seed` (default: the run's evaluation seed); returns them and their wall-clock."""
        tasks = self.domain.tasks(split)
        n = self.cfg.eval_samples
        batch = [t for t in tasks for _ in range(n)]
        keys = [eval_key(self.step, split, t.id, i, tag) for t in tasks for i in range(n)]
        gen = torch.Generator().manual_seed(self.cfg.seed + 100_003 if seed is None else seed)
        trajs, times, _ = self._real(batch, keys, self.step, gen)
        return trajs, times.scorer + times.generation

    def evaluate(self, split: str) -> dict:
        """Mean real reward on a held-out split (real execution, stored like any other), the share of episodes
        that ran ok, and the means of the domain's per-episode numbers (`Domain.episode_stats`)."""
        trajs, wall = self.held_out(split)
        rewards = [t.real.reward for t in trajs if t.real is not None and t.real.known]
        stats = [self.domain.episode_stats(t) for t in trajs]
        return {
            "split": split,
            "reward": float(np.mean(rewards)) if rewards else float("nan"),
            "ok": float(np.mean([t.real is not None and t.real.status == "ok" for t in trajs])) if trajs else float("nan"),
            "stats": {k: float(np.mean([s[k] for s in stats if k in s])) for k in sorted({k for s in stats for k in s})},
            "unknown": len(trajs) - len(rewards),
            "n": len(trajs),
            "eval_time": wall,
        }

    def evaluation_columns(self, split: str) -> dict[str, float]:
        """The history's columns for `split`: `eval_<split>` (mean reward), `eval_<split>_ok` and one per
        per-episode number of the domain (AutoResearch: `eval_<split>_parsed`)."""
        ev = self.evaluate(split)
        return {f"eval_{split}": ev["reward"], f"eval_{split}_ok": ev["ok"],
                **{f"eval_{split}_{k}": v for k, v in ev["stats"].items()}}

    def _evaluate_all(self) -> dict:
        row = {"step": self.step, "wall": self.wall, "real_wall": self.real_wall, "real_executions": self.real_executions}
        for split in self.cfg.eval_splits:
            if self.domain.tasks(split):
                row.update(self.evaluation_columns(split))
        self.history.append(row)
        return row

    # ------------------------------------------------------------------ loop
    def _evaluates(self, step: int) -> bool:
        """Whether held-out evaluation follows `step`."""
        ev = self.cfg.eval_every
        return bool(ev and step % ev == 0) or step == self.cfg.steps

    def train(self, progress: bool = False) -> list[dict]:
        """Train to `trainer.steps`, evaluating before, every `eval_every`, and after.

        SIGINT or SIGTERM stops it after the step in progress, at a checkpoint: `Interrupted`
        (`core/signals.py`); the same call again resumes exactly.
        """
        from tqdm.auto import tqdm

        if self.pipeline is not None and self.anchor_env is None:  # not at build: `wmrl eval` needs one pool only
            self.anchor_env = self.domain.make_real_env()
        bar = tqdm(total=self.cfg.steps, initial=self.step, disable=not (progress and self.ranks.leader),
                   desc="wmrl train", unit="step")
        try:
            with StopRequests() as stop:
                leader = self.ranks.leader
                if self.step == 0 and not self.history and leader:
                    self._evaluate_all()
                signum = self.ranks.broadcast(stop.signum)  # the leader decides, every rank stops with it
                while self.step < self.cfg.steps and signum is None:
                    step = self.step + 1
                    m = self.train_step(step)
                    self.step = step
                    if leader:
                        if self._evaluates(step):
                            m.update({k: v for k, v in self._evaluate_all().items() if k.startswith("eval_")})
                        self.metrics.log(step, m)
                    signum = self.ranks.broadcast(stop.signum)
                    if step % self.cfg.checkpoint_every == 0 or step == self.cfg.steps or signum is not None:
                        self.save()
                    bar.update(1)
                    bar.set_postfix({k: f"{m[k]:.3f}" for k in ("reward_estimated", "anchor_weight")
                                     if isinstance(m.get(k), float) and math.isfinite(m[k])})
                if signum is not None and self.step < self.cfg.steps:
                    if self.step == 0:
                        self.save()  # the evaluation before training is kept too
                    name = signal.Signals(signum).name
                    raise Interrupted(signum, self.step, f"stopped by {name} after step {self.step} of "
                                      f"{self.cfg.steps} (checkpoint {self.dir / 'checkpoints'}); run the same "
                                      "command again to resume")
        finally:
            bar.close()
        return self.history

    def close(self) -> None:
        if self.pipeline is not None:  # the batch executing finishes and is stored, before the store closes
            self.pipeline.close()
        if self.world_model is not None:
            self.world_model.close()  # no background fit left running into interpreter shutdown
        self.policy.close()
        if self.actor is not None and self.actor is not self.policy:
            self.actor.close()
        for part in (self.metrics, self.store, self.env, self.anchor_env):
            if part is not None:  # a learner rank has none of them
                part.close()
        if self.lock is not None:
            self.lock.release()
