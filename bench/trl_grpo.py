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
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Sequence

from wmrl.core.types import SPLITS, Outcome, Task, Transition, Trajectory
from wmrl.domains.autoresearch.domain import AutoResearchDomain
from wmrl.domains.autoresearch.env import AutoResearchEnv
from wmrl.domains.autoresearch.episodes import Episodes

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["TASK_COLUMN", "AutoResearchReward", "prompt_dataset"]

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

    def __init__(self, env: AutoResearchEnv, tasks: Sequence[Task]):
        # TRL samples one completion per prompt and grades it once: a multi-turn episode has no TRL counterpart
        if env.episodes.turns != 1:
            raise ValueError(f"TRL's GRPOTrainer grades single-turn episodes; the environment has "
                             f"{env.episodes.turns} turns per episode: build it with turns=1 (domain.turns=1)")
        self.env = env
        self.tasks = {t.id: t for t in tasks}

    @classmethod
    def from_domain(cls, domain: AutoResearchDomain) -> AutoResearchReward:
        """The domain's own real environment (its sandbox pool and limits) over all of its tasks."""
        return cls(domain.make_real_env(), [t for s in SPLITS for t in domain.tasks(s)])

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        task_id: Sequence[str],
        log_metric: Callable[[str, float], None] | None = None,
        log_extra: Callable[[str, list], None] | None = None,
        **_: Any,  # TRL also passes completion_ids, trainer_state and the dataset's other columns
    ) -> list[float | None]:
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
