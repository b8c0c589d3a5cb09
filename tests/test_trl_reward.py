"""bench/trl_grpo.py: TRL's reward function gives the project's own real grade; an unknown grade is None, not a crash.

Real sandboxed executions on the smallest training task of the bundled suite
(wine-cultivar: 133 rows), through the domain's own environment. Every
expected value comes from calling `AutoResearchEnv` directly on the same
replies, never from a number written here.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

if not sys.platform.startswith("linux") or os.geteuid() != 0:
    pytest.skip("the sandbox needs Linux and root", allow_module_level=True)

from datasets import Dataset

from wmrl.bench.trl_grpo import TASK_COLUMN, AutoResearchReward, prompt_dataset
from wmrl.core.types import Task
from wmrl.domains.autoresearch.domain import AutoResearchConfig, AutoResearchDomain
from wmrl.domains.autoresearch.env import AutoResearchEnv
from wmrl.domains.autoresearch.protocol import format_reply
from wmrl.domains.autoresearch.sandbox import ExecResult, ExecutionPool, Job

TASK = "wine-cultivar"
# a correct, deterministic solution for TASK (macro_f1 over predicted class labels)
SOLUTION = """\
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

train = pd.read_csv("train.csv")
test = pd.read_csv("test_features.csv")
model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
model.fit(train.drop(columns=["Id", "cultivar"]), train["cultivar"])
pd.DataFrame({"Id": test["Id"], "cultivar": model.predict(test.drop(columns=["Id"]))}).to_csv("submission.csv", index=False)
"""
INFRA_MARK = "# the sandbox slot running this dies"


@pytest.fixture(scope="module")
def domain() -> AutoResearchDomain:
    return AutoResearchDomain(AutoResearchConfig(sandbox_slots=2))


@pytest.fixture(scope="module")
def reward(domain):
    r = AutoResearchReward.from_domain(domain)
    yield r
    r.close()


@pytest.fixture(scope="module")
def task(domain) -> Task:
    return next(t for t in domain.tasks("train") if t.id == TASK)


def _direct(env: AutoResearchEnv, task: Task, replies: list[str]) -> tuple[list[float | None], list[str]]:
    """The project's own grades: the environment stepped directly, one single-turn episode per reply."""
    env.reset([task] * len(replies))
    transitions = env.step(replies)
    return [tr.reward for tr in transitions], [tr.info["status"] for tr in transitions]


def _first_observation(reward: AutoResearchReward, task: Task) -> str:
    return reward.env.reset([task])[0]


def _call(reward: AutoResearchReward, task: Task, replies: list[str]) -> list[float | None]:
    """The reward as TRL calls it: keywords only, the dataset's columns beside TRL's own."""
    prompt = _first_observation(reward, task)
    logged: dict = {}
    out = reward(prompts=[prompt] * len(replies), completions=replies, completion_ids=[[0]] * len(replies),
                 task_id=[task.id] * len(replies), trainer_state=None,
                 log_extra=lambda column, values: logged.setdefault(column, values),
                 log_metric=lambda name, value: logged.setdefault(name, value))
    assert len(logged["status"]) == len(replies)
    assert logged["autoresearch/unknown"] == sum(r is None for r in out) / len(out)
    return out


def _env_beside(reward: AutoResearchReward, tmp_path: Path, **kwargs) -> AutoResearchEnv:
    """Another environment on the reward's sandbox pool (limits are per job), so no second zygote is started."""
    return AutoResearchEnv(reward.env.pool, turns=1, workroot=tmp_path, **kwargs)


def test_the_dataset_holds_each_training_task_with_the_first_observation_the_policy_sees(domain, reward):
    ds = prompt_dataset(domain)
    train = domain.tasks("train")
    assert ds.column_names == ["prompt", TASK_COLUMN]
    assert ds[TASK_COLUMN] == [t.id for t in train]
    assert ds["prompt"] == reward.env.reset(train)  # what AutoResearchEnv hands CodeAgentPolicy on turn 1


def test_a_correct_program_gets_the_grade_the_environment_gives_it(reward, task, tmp_path):
    reply = "A standardised logistic regression should do well here.\n\n" + format_reply(SOLUTION)
    expected, statuses = _direct(_env_beside(reward, tmp_path), task, [reply])
    assert statuses == ["ok"] and expected[0] > 0.5  # a real, good score, not a failure reward
    assert _call(reward, task, [reply, reply]) == expected * 2


def test_failed_programs_get_what_the_project_gives_them_and_the_call_does_not_raise(reward, task, tmp_path):
    replies = ["I would try a random forest on this one.",  # no code block
               format_reply("raise ValueError('bad model')"),
               format_reply("open('submission.csv', 'w').write('prediction\\n1\\n')")]  # wrong row count
    expected, statuses = _direct(_env_beside(reward, tmp_path), task, replies)
    assert statuses == ["invalid", "error", "invalid"]
    assert _call(reward, task, replies) == expected == [task.payload.failure_reward] * 3


def test_a_program_past_its_time_budget_gets_what_the_project_gives_it(reward, task, tmp_path):
    # a 3 s budget (60 s x 0.05): a sleeping program passes it whatever the machine's load
    short = AutoResearchReward(_env_beside(reward, tmp_path / "reward", timeout_scale=0.05), [task])
    replies = [format_reply("import time\ntime.sleep(60)")]
    expected, statuses = _direct(_env_beside(reward, tmp_path / "direct", timeout_scale=0.05), task, replies)
    assert statuses == ["timeout"] and expected == [task.payload.failure_reward]
    assert _call(short, task, replies) == expected


def test_a_mismatched_dataset_is_a_clear_error_not_a_misgrade(reward, task, tmp_path):
    reply = [format_reply(SOLUTION)]
    with pytest.raises(ValueError, match="prompt_dataset"):
        reward(prompts=["another prompt"], completions=reply, task_id=[task.id])
    with pytest.raises(ValueError, match="unknown task ids"):
        reward(prompts=[_first_observation(reward, task)], completions=reply, task_id=["no-such-task"])
    with pytest.raises(ValueError, match="turns=1"):
        AutoResearchReward(AutoResearchEnv(reward.env.pool, turns=2, workroot=tmp_path), [task])


class _SlotDies(ExecutionPool):
    """The real pool, except that a job whose code holds INFRA_MARK comes back as an infrastructure failure
    (what a dead zygote or Ray actor gives, as in tests/test_ar_env.py and tests/test_ray_pool.py)."""

    def __init__(self, pool: ExecutionPool):
        self.pool, self.slots = pool, pool.slots

    def run_each(self, jobs: list[Job], *, outputs=()):
        for i, result in self.pool.run_each(jobs, outputs=outputs):
            yield i, ExecResult("infra", None, "", "", 0.0, "zygote died") if INFRA_MARK in jobs[i].code else result

    def exposes(self, path) -> bool:
        return self.pool.exposes(path)

    def close(self) -> None:  # the module's reward owns the real pool
        pass


def test_a_sandbox_infrastructure_failure_is_none_for_that_sample_and_the_others_are_graded(reward, task, tmp_path):
    flaky = AutoResearchReward(AutoResearchEnv(_SlotDies(reward.env.pool), turns=1, workroot=tmp_path / "r"), [task])
    replies = [format_reply(SOLUTION), format_reply(f"{INFRA_MARK}\n{SOLUTION}"), format_reply("raise ValueError")]
    expected, _ = _direct(_env_beside(reward, tmp_path / "direct"), task, [replies[0], replies[2]])
    assert _call(flaky, task, replies) == [expected[0], None, expected[1]]


def test_a_failure_of_the_environment_itself_is_none_for_the_whole_batch_not_an_exception(reward, task, tmp_path):
    class Broken(AutoResearchEnv):
        def step(self, actions):
            raise RuntimeError("sandbox pool is gone")

    broken = AutoResearchReward(Broken(reward.env.pool, turns=1, workroot=tmp_path), [task])
    assert _call(broken, task, [format_reply(SOLUTION), "no code"]) == [None, None]


def test_completions_are_graded_from_their_token_ids_decoded_as_the_project_policy_decodes_them(
        reward, task, suite_agent, tmp_path):
    """TRL's completion text drops special tokens; the same tokens sampled by our policy keep them."""
    from wmrl.domains.autoresearch.policy import CodeAgentPolicy
    from wmrl.lm.tokens import decode

    policy = CodeAgentPolicy(str(suite_agent), max_new_tokens=320)
    tok, stops = policy.tokenizer, policy.tokens.stop_ids
    clean = policy.reply_ids(format_reply(SOLUTION))  # ends with the stop token, as TRL's completion ids do
    assert clean[-1] in stops
    marked = clean[:3] + [tok.convert_tokens_to_ids("<|user|>")] + clean[3:]  # a special token inside the code
    ours = [decode(tok, ids[:-1]) for ids in (clean, marked)]
    trls = [tok.decode(ids, skip_special_tokens=True) for ids in (clean, marked)]
    assert "<|user|>" in ours[1] and "<|user|>" not in trls[1]
    decoding = AutoResearchReward(_env_beside(reward, tmp_path / "r"), [task], tok, stops)
    prompt = _first_observation(reward, task)
    got = decoding(prompts=[prompt] * 2, completions=trls, completion_ids=[clean, marked], task_id=[task.id] * 2)
    expected, statuses = _direct(_env_beside(reward, tmp_path / "direct"), task, ours)
    assert got == expected and statuses == ["ok", "error"]  # the marked program is the one our policy would run


def test_trl_reads_the_unknown_grade_as_nan_and_keeps_the_real_ones(reward, task, tmp_path, tiny_lm):
    """TRL's own `_calculate_rewards` (the call inside its training loop) on our reward, beside an infra failure."""
    import trl  # pinned in the dev extra: missing, this fails rather than skips

    tokenizer, _, path = tiny_lm
    flaky = AutoResearchReward(AutoResearchEnv(_SlotDies(reward.env.pool), turns=1, workroot=tmp_path / "r"), [task])
    prompt = _first_observation(reward, task)
    args = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, report_to="none",
                          per_device_train_batch_size=2, num_generations=2, max_completion_length=8)
    trainer = trl.GRPOTrainer(model=str(path), reward_funcs=flaky, args=args, processing_class=tokenizer,
                              train_dataset=Dataset.from_dict({"prompt": [prompt], TASK_COLUMN: [task.id]}))
    replies = [format_reply(SOLUTION), format_reply(f"{INFRA_MARK}\n{SOLUTION}")]
    rows = [{"prompt": prompt, TASK_COLUMN: task.id}] * 2
    got = trainer._calculate_rewards(rows, [prompt] * 2, replies, [[0], [0]])[:, 0].tolist()
    expected, _ = _direct(_env_beside(reward, tmp_path / "direct"), task, replies[:1])
    assert got[0] == pytest.approx(expected[0]) and math.isnan(got[1])  # NaN: excluded from the group's statistics
