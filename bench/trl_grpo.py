"""TRL's `GRPOTrainer` as a peer baseline on AutoResearch: the reward it trains on and the prompts it samples from.

Why
---
A speed-up over our own real-execution GRPO is only as credible as that
baseline, so the same comparison is also run against TRL (pinned), trained on
the same embedded agent (`wmrl export` / `CodeAgentPolicy.save_pretrained`
write it as a plain Hugging Face model folder). What must be identical is what
is being optimised: the prompts and the reward. So nothing here re-implements
either.

* **Prompts** (`prompt_dataset`): one row per task, `prompt` being the first
  observation the project's own `AutoResearchEnv` hands `CodeAgentPolicy` for
  that task (`Episodes.reset`, i.e. `protocol.format_prompt`), in TRL's
  *standard* (plain text, not conversational) format, beside a `task_id`
  column that TRL passes to the reward function. TRL tokenizes the text with
  the tokenizer's special tokens, as `CodeAgentPolicy.prompt_ids` does; unlike
  it, TRL 1.16 never cuts a prompt longer than the policy's prompt budget.
* **Reward** (`AutoResearchReward`): every completion runs through the
  project's `AutoResearchEnv` (sandbox pool, grader, one turn) and its
  verdict is `RealEnv.outcome`, read exactly as the trainer's `real` mode reads
  it: a program that fails (no code block, exception, timeout, out of memory,
  invalid submission) gets the task's failure reward from the project's
  grader; an *unknown* grade (status `infra`: the sandbox machinery failed, a
  host-side error, an out-of-range reward) is `None`, never 0.

How TRL 1.16.0 treats `None` (`trl/trainer/grpo_trainer.py`, `utils.py`)
--------------------------------------------------------------------
* `_calculate_rewards` turns `None` into NaN (grpo_trainer.py:1629-1630) and,
  when every reward function gave NaN for a row, logs a warning with that
  row's prompt and completion (1664-1679).
* Such a row is *unscorable* (2756-2759): its reward is set to NaN after the
  weighted `nansum` (2763-2764), so the group's mean and std are taken over the
  known rewards only (`nanmean`, `nanstd`, 2765-2771), and its advantage is
  forced to 0 (`nan_to_num`, 2808-2810).
* `nanstd` is NaN when fewer than two rewards are known (utils.py:1040-1043),
  so in a group with at most one known grade every advantage is 0 -- the
  project skips such groups too. A group whose rewards are all `None` gets
  advantages 0 throughout.
* An unscorable completion still sits in the loss mask: with the default
  `loss_type="dapo"` its tokens count in the normaliser (`num_items_in_batch`,
  2497-2498 and 3168-3173) and, with `beta > 0`, its KL term still applies
  (3149-3150), whereas the project's surrogate leaves excluded trajectories
  out entirely. Unknown grades therefore shrink a TRL step slightly; report
  their share (logged as `autoresearch/unknown`).
* Logged reward statistics skip NaN (2820-2829).

The reward function keeps its environment, and so its sandbox pool with its
warm zygotes, across calls; `close()` releases them.

The run (`run_trl`), one seed of `wmrl bench speedup modes=...,trl`
--------------------------------------------------------------------
The run config is the `real` mode's, and everything TRL has a counterpart for
is read from it (`grpo_args`): group size (`num_generations`), prompts per step
(one generation batch feeds one optimizer step), updates (`max_steps`), the
engine's learning rate held constant, Adam's betas, weight decay and gradient
clip, the sampling temperature and reply length, the clip range, the passes
over a batch, the KL weight and whether advantages are standardized. TRL's own
conventions stay where the project's differ (`docs/method.md`, "TRL's GRPO"):
token ratios with the DAPO aggregation and the sample standard deviation.
TRL saves the model every `trainer.eval_every` updates; each of those
checkpoints (and the agent it started from, as step 0) is then evaluated by
the project's own held-out evaluator (`Trainer.evaluate`, the same draws as
the other modes' evaluations), so its curve is read exactly as theirs.
Training wall-clock is the time between optimizer steps, checkpoint saving
excluded, as the other modes' (their steps' time: evaluation, checkpoints
and logging are outside it). As the real mode's step-0 evaluation starts its
sandbox pool before its clock does, one trivial program warms TRL's pool
before training; TRL runs as one process (no DDP wrapper left over from our
engine's one-rank group) without gradient checkpointing, on the device and in
the precision our engine uses.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from wmrl.bench.harness import RunRecord, fresh_run_dir, reusable, task_digest
from wmrl.config import RunConfig, load_config, to_yaml
from wmrl.core.types import SPLITS, Outcome, Task, Transition, Trajectory
from wmrl.domains.autoresearch.domain import AutoResearchDomain
from wmrl.domains.autoresearch.env import AutoResearchEnv
from wmrl.domains.autoresearch.episodes import Episodes
from wmrl.lm.tokens import decode

if TYPE_CHECKING:
    from datasets import Dataset
    from trl import GRPOConfig

__all__ = ["TASK_COLUMN", "AutoResearchReward", "grpo_args", "prompt_dataset", "run_trl", "trl_settings"]

log = logging.getLogger(__name__)

#: the dataset column that names each row's task; TRL passes it to the reward function as a keyword
TASK_COLUMN = "task_id"


def prompt_dataset(domain: AutoResearchDomain, split_name: str = "train") -> Dataset:
    """TRL's prompt dataset for one split of the domain's tasks: columns `prompt` and `task_id`, one row per task."""
    from datasets import Dataset

    tasks = domain.tasks(split_name)
    if not tasks:
        raise ValueError(f"the autoresearch domain has no {split_name!r} tasks to build a TRL dataset from")
    # the very first observations AutoResearchEnv gives the policy (turns and final do not change them)
    prompts = Episodes(turns=1, final="best").reset(tasks)
    return Dataset.from_dict({"prompt": prompts, TASK_COLUMN: [t.id for t in tasks]})


class AutoResearchReward:
    """A TRL `GRPOTrainer` reward function: each completion really runs, graded as the project's `real` mode grades it.

    Called by TRL as `reward(prompts=..., completions=..., completion_ids=..., task_id=..., **other_columns)`
    with plain-text prompts and completions; returns one reward in [0, 1] per completion, or None where the
    grade is unknown (see the module docstring for what TRL then does).
    """

    def __init__(self, env: AutoResearchEnv, tasks: Sequence[Task], tokenizer: Any = None,
                 stop_ids: Sequence[int] = ()):
        """With `tokenizer`, a completion is the text of its token ids decoded as the project's policy decodes
        them (special tokens kept, the final stop token dropped) rather than TRL's text, which drops special
        tokens: the same sampled tokens are then graded as the same program in both trainers."""
        # TRL samples one completion per prompt and grades it once: a multi-turn episode has no TRL counterpart
        if env.episodes.turns != 1:
            raise ValueError(f"TRL's GRPOTrainer grades single-turn episodes; the environment has "
                             f"{env.episodes.turns} turns per episode: build it with turns=1 (domain.turns=1)")
        self.env = env
        self.tasks = {t.id: t for t in tasks}
        self.tokenizer, self.stop_ids = tokenizer, set(stop_ids)
        #: completions graded and the seconds spent grading them (real execution, host side included)
        self.graded, self.seconds = 0, 0.0

    @classmethod
    def from_domain(cls, domain: AutoResearchDomain, tokenizer: Any = None,
                    stop_ids: Sequence[int] = ()) -> AutoResearchReward:
        """The domain's own real environment (its sandbox pool and limits) over all of its tasks."""
        return cls(domain.make_real_env(), [t for s in SPLITS for t in domain.tasks(s)], tokenizer, stop_ids)

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        task_id: Sequence[str],
        log_metric: Callable[[str, float], None] | None = None,
        log_extra: Callable[[str, list], None] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
        **_: Any,  # TRL also passes trainer_state and the dataset's other columns
    ) -> list[float | None]:
        t0 = time.perf_counter()
        if self.tokenizer is not None and completion_ids is not None:
            completions = [decode(self.tokenizer, list(ids[:-1] if ids and ids[-1] in self.stop_ids else ids))
                           for ids in completion_ids]
        tasks = self._tasks_of(prompts, completions, task_id)
        observations = self.env.reset(tasks)
        if list(prompts) != observations:
            raise ValueError("a TRL prompt is not its task's first observation: build the dataset with "
                             "prompt_dataset(), or the completions would be graded for another prompt")
        try:
            transitions: Sequence[Transition | None] = self.env.step(list(completions))
        except Exception as e:  # noqa: BLE001 - a failure of the machinery is an unknown grade, never a crashed run
            log.error("TRL reward: the autoresearch environment failed on a batch of %d: %s: %s",
                      len(completions), type(e).__name__, e)
            transitions = [None] * len(completions)
        outcomes = [self._outcome(t, o, c, tr) for t, o, c, tr in zip(tasks, observations, completions, transitions)]
        if log_metric is not None:
            log_metric("autoresearch/unknown", sum(not o.known for o in outcomes) / len(outcomes))
        if log_extra is not None:
            log_extra("status", [o.status for o in outcomes])
        unknown = Counter(o.info.get("detail", "?") for o in outcomes if not o.known)
        if unknown:
            log.warning("TRL reward: %d of %d grades unknown (None): %s", sum(unknown.values()), len(outcomes),
                        "; ".join(f"{n} x {d[:200]}" for d, n in unknown.most_common(3)))
        self.graded += len(outcomes)
        self.seconds += time.perf_counter() - t0
        return [o.reward for o in outcomes]

    def _tasks_of(self, prompts: Sequence[str], completions: Sequence[str], task_id: Sequence[str]) -> list[Task]:
        if not len(prompts) == len(completions) == len(task_id):
            raise ValueError(f"TRL reward: {len(prompts)} prompts, {len(completions)} completions and "
                             f"{len(task_id)} task ids; they must be aligned")
        if not all(isinstance(c, str) for c in completions):
            raise TypeError("TRL reward: completions must be plain text; use the standard (not conversational) "
                            "prompt format that prompt_dataset() builds")
        missing = sorted(set(task_id) - self.tasks.keys())
        if missing:
            raise ValueError(f"TRL reward: unknown task ids {missing[:5]}; the dataset's tasks must be among the "
                             "reward function's (build both from the same domain)")
        return [self.tasks[i] for i in task_id]

    def _outcome(self, task: Task, observation: str, completion: str, transition: Transition | None) -> Outcome:
        if transition is None:
            return Outcome(None, "infra", {"detail": "the environment returned no transition"})
        # the one-turn episode the trainer's `real` mode would have stored, judged by the same RealEnv.outcome
        trajectory = Trajectory(task=task, observations=[observation], actions=[completion],
                                step_rewards=[transition.reward], infos=[transition.info], source="real")
        try:
            outcome = self.env.outcome(trajectory)
        except ValueError as e:  # an invalid grade (e.g. outside [0, 1]) is dropped, as the trainer drops it
            log.error("TRL reward: invalid outcome for task %s: %s", task.id, e)
            return Outcome(None, "infra", {"detail": str(e)})
        if not outcome.known:
            outcome.info.setdefault("detail", transition.info.get("detail", "unknown grade"))
        return outcome

    def close(self) -> None:
        """Release the sandbox pool and the tasks' input files."""
        self.env.close()


# ---------------------------------------------------------------------------------------------- the run


def grpo_args(cfg: RunConfig, output_dir: Path, stop_ids: Sequence[int]) -> GRPOConfig:
    """TRL's settings for the run `cfg` describes (the `real` mode's config): see the module docstring."""
    from trl import GRPOConfig

    import torch

    t, e, d = cfg.trainer, cfg.engine, cfg.domain
    return GRPOConfig(
        output_dir=str(output_dir), seed=t.seed, data_seed=t.seed, report_to="none", logging_steps=1,
        disable_tqdm=True, dataloader_num_workers=0,
        # where and how our engine trains: DeepSpeed takes the GPU when there is one; no activation recomputation
        use_cpu=not torch.cuda.is_available(), bf16=e.bf16, fp16=False, gradient_checkpointing=False,
        # one generation batch of groups_per_step prompts x group_size completions feeds one optimizer step
        per_device_train_batch_size=t.groups_per_step * t.group_size, gradient_accumulation_steps=1,
        num_generations=t.group_size, max_steps=t.steps, num_iterations=t.ppo_epochs, shuffle_dataset=True,
        learning_rate=e.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=e.weight_decay,
        adam_beta1=e.adam_beta1, adam_beta2=e.adam_beta2, max_grad_norm=e.grad_clip,
        temperature=d.temperature, top_p=1.0, top_k=0, max_completion_length=d.max_new_tokens,
        # the policy's stop tokens (EOS and the generation config's), exactly the project's sampler's
        generation_kwargs={"eos_token_id": list(stop_ids)}, disable_dropout=True,
        epsilon=t.clip_eps, beta=t.objective.beta, loss_type="dapo",
        scale_rewards="group" if cfg.estimator.advantage.standardize else "none",
        save_strategy="steps", save_steps=t.eval_every or t.steps, save_only_model=True, save_total_limit=None,
    )


#: the GRPOConfig fields a reader of the comparison needs to see (the rest are TRL's defaults)
SHOWN = ("num_generations", "per_device_train_batch_size", "max_steps", "num_iterations", "learning_rate",
         "lr_scheduler_type", "optim", "adam_epsilon", "weight_decay", "max_grad_norm", "loss_type", "scale_rewards",
         "beta", "epsilon", "temperature", "max_completion_length", "gradient_checkpointing", "use_cpu", "bf16")


def trl_settings(cfg: RunConfig) -> dict:
    """TRL's version and the settings `run_trl` gives it for `cfg`: the JSON, the table and the reuse key."""
    import trl

    args = grpo_args(cfg, Path("unused"), ())
    return {"version": trl.__version__,
            "settings": {k: str(getattr(v, "value", v)) for k in SHOWN for v in [getattr(args, k)]}}


def _check(cfg: RunConfig) -> None:
    """What TRL's GRPOTrainer has no counterpart for: refused with what to change, not silently altered."""
    if cfg.domain.name != "autoresearch":
        raise ValueError(f"the trl baseline trains the autoresearch agent; config's domain is {cfg.domain.name!r}")
    if cfg.domain.lora.enabled:
        raise ValueError("the trl baseline trains every weight, as the real mode it is compared with: disable "
                         "domain.lora (TRL's peft_config path is not wired here)")
    if cfg.engine.world_size != 1:
        raise ValueError("the trl baseline runs in one process: engine.world_size=1")
    if cfg.domain.turns != 1:
        raise ValueError("TRL's GRPOTrainer grades single-turn episodes: domain.turns=1")
    if cfg.trainer.ppo_epochs != 1:
        # TRL counts each pass over a batch as an optimizer step (num_iterations): the update counts would differ
        raise ValueError("the trl baseline takes one pass per batch, as the real mode it is compared with: "
                         "trainer.ppo_epochs=1")
    if cfg.trainer.objective.beta != 0:
        raise ValueError("the trl baseline has no KL term: TRL's (per token, bias-corrected) and ours (per turn) "
                         "differ, so set trainer.objective.beta=0")
    if cfg.trainer.objective.ptx != 0:
        raise ValueError("the trl baseline has no prior-data term (GRPOTrainer trains on its completions only): "
                         "set trainer.objective.ptx=0 for every mode it is compared with")


class _StepClock:
    """A TRL callback: training wall-clock, grading time and completions graded at each optimizer step (checkpoint
    saving excluded), and TRL's logs as JSON lines."""

    def __init__(self, log_path: Path, reward: AutoResearchReward):
        from transformers import TrainerCallback

        clock = self

        class Callback(TrainerCallback):  # transformers calls these hooks by name on its callback objects
            def on_train_begin(self, args, state, control, **kw):
                clock.last = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                now = time.perf_counter()
                clock.wall += now - clock.last
                clock.last = now
                clock.at[state.global_step] = (clock.wall, reward.seconds, reward.graded)

            def on_save(self, args, state, control, **kw):
                clock.last = time.perf_counter()  # the save is not training

            def on_log(self, args, state, control, logs=None, **kw):
                with clock.log_path.open("a") as f:
                    f.write(json.dumps({"step": state.global_step, **(logs or {})}) + "\n")

        self.callback = Callback()
        self.log_path, self.wall, self.last = log_path, 0.0, 0.0
        #: step -> (training wall, grading seconds, completions graded) when it ended
        self.at: dict[int, tuple[float, float, int]] = {0: (0.0, 0.0, 0)}


@contextlib.contextmanager
def _one_process():
    """No launcher variables while TRL runs: our engine leaves RANK / WORLD_SIZE / LOCAL_RANK set for its
    one-rank group, and accelerate would read LOCAL_RANK as a multi-process CPU run (DDP around the model)."""
    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _warm(reward: AutoResearchReward, dataset: Dataset) -> None:
    """One trivial program through the reward's sandbox pool before the clock starts, as the real mode's
    step-0 evaluation starts its pool's zygote before its first step."""
    first = dataset[:1]
    reward(prompts=first["prompt"], completions=["```python\nprint('warm-up')\n```"], task_id=first[TASK_COLUMN])
    reward.graded, reward.seconds = 0, 0.0


def run_trl(config: str, overrides: Sequence[str], run_dir: Path, mode: str, seed: int, reuse: bool = False) -> RunRecord:
    """One seed of the TRL baseline: GRPOTrainer on the agent and tasks `config` + `overrides` describe, then
    the project's held-out evaluation of the start and of every checkpoint TRL wrote. With `reuse`, a finished
    run of the same config and the same TRL settings in `run_dir` is read back instead (`record.json`)."""
    from accelerate.utils import DistributedType
    from trl import GRPOTrainer

    from wmrl.api import build_trainer
    from wmrl.core.registry import DOMAINS

    run_dir = Path(run_dir)
    cfg = load_config(config, [*overrides, "estimator.mode=real", f"trainer.seed={seed}", f"run_dir={run_dir}",
                               "tensorboard=false"])
    _check(cfg)
    text, settings = to_yaml(cfg), json.dumps(trl_settings(cfg))
    record, trl_json = run_dir / "record.json", run_dir / "trl.json"
    if (reuse and record.exists() and trl_json.exists() and trl_json.read_text() == settings
            and reusable(run_dir, text, config, cfg)):
        return RunRecord(**json.loads(record.read_text()))
    fresh_run_dir(run_dir, text, cfg)
    trl_json.write_text(settings)
    domain = DOMAINS.get(cfg.domain.name)(cfg.domain)
    if cfg.trainer.groups_per_step > len(domain.tasks("train")):
        # TRL draws a step's prompts without replacement and drops a short batch: it would never take a step
        raise ValueError(f"the trl baseline draws trainer.groups_per_step={cfg.trainer.groups_per_step} distinct "
                         f"training tasks a step, but there are {len(domain.tasks('train'))}: lower it")
    start = domain.agent_path()
    policy = domain.make_policy(seed)  # its tokenizer and stop tokens, which TRL's sampling and grading must match
    tokenizer, stop_ids = policy.tokenizer, policy.tokens.stop_ids
    policy.close()
    reward = AutoResearchReward.from_domain(domain, tokenizer, stop_ids)
    clock = _StepClock(run_dir / "trl_log.jsonl", reward)
    dataset = prompt_dataset(domain, "train")
    try:
        with _one_process():
            trainer = GRPOTrainer(model=start, reward_funcs=reward, args=grpo_args(cfg, run_dir / "trl", stop_ids),
                                  train_dataset=dataset, callbacks=[clock.callback])
            if trainer.accelerator.distributed_type != DistributedType.NO:
                raise RuntimeError(f"TRL runs as {trainer.accelerator.distributed_type}, not one process: the "
                                   "baseline would pay for collectives the real mode does not")
            _warm(reward, dataset)
            trainer.train()
            steps = trainer.state.global_step
            final = run_dir / "trl" / f"checkpoint-{steps}"
            if not final.exists():
                trainer.save_model(str(final))
            del trainer
    finally:
        reward.close()
    history = []
    evaluated = sorted({0, *(int(p.name.split("-")[1]) for p in (run_dir / "trl").glob("checkpoint-*"))})
    for step in evaluated:
        agent = start if step == 0 else run_dir / "trl" / f"checkpoint-{step}"
        ev = load_config(config, [*overrides, "estimator.mode=real", f"trainer.seed={seed}", "tensorboard=false",
                                  f"run_dir={run_dir / 'eval' / f'step{step}'}", f"domain.agent={agent}"])
        wall, real_wall, graded = clock.at[step]
        row = {"step": step, "wall": wall, "real_wall": real_wall, "real_executions": graded}
        judge = build_trainer(ev)
        try:
            for split_name in cfg.trainer.eval_splits:
                if judge.domain.tasks(split_name):
                    row.update(judge.evaluation_columns(split_name))
        finally:
            judge.close()
        history.append(row)
    out = RunRecord(mode, seed, steps, task_digest(domain.tasks("train")), history, reward.graded, clock.wall,
                    reward.seconds)
    record.write_text(json.dumps(out.__dict__))
    return out
