"""The LLM outcome world model: strict parsing, unknown-not-zero, online fitting, the AutoResearch adapter.

A tiny Llama (~33k parameters) with a BPE tokenizer trained here the way the
embedded agent's is (agent.train_tokenizer) stands in for the backbone.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from typing import Any, Sequence

import pytest
import torch

from wmrl.core.interfaces import Policy
from wmrl.core.rollout import rollout, wm_prediction
from wmrl.core.types import Task, Trajectory
from wmrl.domains.autoresearch.agent import AgentConfig, build_model, train_tokenizer
from wmrl.domains.autoresearch.protocol import END_MARK, format_prompt, format_reply, next_observation
from wmrl.domains.autoresearch.llm_world_model import (
    DECIDED_VAR,
    LLMOutcomeModel,
    anchor_examples,
    outcome_prompt,
)
from wmrl.domains.autoresearch.tasks import ARTask
from wmrl.world_models.llm_outcome import LLMOutcomePredictor, ParsedOutcome, format_outcome, parse_outcome

DESC = ("Task: iris-species. Predict the iris species from four flower measurements.\n"
        "Target column: species. Metric: accuracy.")
GOOD = "import pandas as pd\nfrom sklearn.ensemble import RandomForestClassifier\nclf = RandomForestClassifier(n_estimators=200)\n"
BAD = "import pandas as pd\nfrom sklearn.dummy import DummyClassifier\nclf = DummyClassifier()\n"
CRASH = "import pandas as pd\nclf = pd.read_csv('missing.csv')\n"  # fails only when it runs
EXAMPLES = [
    (outcome_prompt(DESC, GOOD), format_outcome("ok", 0.9)),
    (outcome_prompt(DESC, BAD), format_outcome("ok", 0.1)),
    (outcome_prompt(DESC, CRASH), format_outcome("error", 0.0, "FileNotFoundError: missing.csv")),
]
PROMPTS = [p for p, _ in EXAMPLES]
FIT_STEPS = 240
# temperature 0.7: a 33k-parameter LM at temperature 1 still wanders off the format in ~1 of 8 samples
KW = dict(samples=8, max_new_tokens=32, temperature=0.7, lr=3e-3, batch_size=3, seed=0)


def _task(failure_reward: float = 0.0) -> Task:
    t = ARTask(id="iris", family="tabular-multiclass", split="train", metric="accuracy", budget_s=60,
               description=DESC, baseline=0.3, reference=0.9, task_type="multiclass", feature_columns=("a",),
               target_columns=("species",), classes=(0, 1, 2), n_train=10, n_test=5, data_dir="/nonexistent",
               failure_reward=failure_reward)
    return t.to_task()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model, tokenizer, saved directory) of an untrained tiny LM."""
    texts = [format_prompt(DESC) + format_reply(c) + END_MARK for c in (GOOD, BAD, CRASH)] + [p + t for p, t in EXAMPLES]
    cfg = AgentConfig(vocab_size=400, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, context=512)
    tok = train_tokenizer(texts * 3, cfg)
    model = build_model(cfg, tok, seed=0)
    path = tmp_path_factory.mktemp("tiny-lm")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok, path


@pytest.fixture(scope="module")
def fitted(tiny):
    """A predictor fitted on EXAMPLES, with its state before any prediction."""
    model, tok, _ = tiny
    pred = LLMOutcomePredictor(model, tok, **KW)
    stats = pred.fit(EXAMPLES, steps=FIT_STEPS, max_seconds=120)
    return pred, pred.state_dict(), stats


class FixedPolicy(Policy):
    """Replies from a list, cycling per call position (no model)."""

    def __init__(self, replies: Sequence[str]):
        self.replies = list(replies)
        self.module = torch.nn.Linear(1, 1)

    def act(self, observations, *, generator=None, greedy=False) -> tuple[list[Any], list[float]]:
        return [self.replies[i % len(self.replies)] for i in range(len(observations))], [0.0] * len(observations)

    def log_prob(self, observations, actions) -> torch.Tensor:
        return torch.zeros(len(observations))


# ----------------------------------------------------------------------------- parsing


def test_parse_outcome_accepts_the_format():
    assert parse_outcome("status: ok\nscore: 0.75") == ParsedOutcome("ok", 0.75, None)
    assert parse_outcome("  Status: ERROR \n score: 0 \nlog: Traceback\nValueError: x\n") == \
        ("error", 0.0, "Traceback\nValueError: x")
    assert parse_outcome("status: ok\nscore: 1\n\n") == ("ok", 1.0, None)
    assert parse_outcome("status: ok\nscore: .5")[1] == 0.5 and parse_outcome("status: ok\nscore: 5e-1")[1] == 0.5
    text = format_outcome("timeout", 0.1234, "killed after 60 s", digits=2)
    assert text == "status: timeout\nscore: 0.12\nlog: killed after 60 s"
    assert parse_outcome(text) == ("timeout", 0.12, "killed after 60 s")
    assert format_outcome("ok", 0.5, "x" * 50, max_log_chars=10).endswith("log: " + "x" * 10)


@pytest.mark.parametrize("text", [
    "", "status: ok", "status: ok\nlog: ran fine", "score: 0.5\nstatus: ok",  # missing / misplaced score
    "status: ok\nscore: nan", "status: ok\nscore: inf", "status: ok\nscore: 1e999",  # not finite
    "status: ok\nscore: abc", "status: ok\nscore: 0.5.1", "status: ok\nscore: 0x1",  # not a number
    "status: ok\nscore: -0.1", "status: ok\nscore: 1.5",  # outside [0, 1]: rejected, not clipped
    "status: maybe\nscore: 0.5", "status: infra\nscore: 0.5",  # not an outcome status
    "status: ok\nscore: 0.5\nand then some junk",  # after the score only `log:` may follow
    "the script will probably work, score 0.8",
])
def test_parse_outcome_rejects_junk(text):
    assert parse_outcome(text) is None


def test_format_outcome_refuses_what_it_could_not_parse_back():
    for status, score in [("ok", float("nan")), ("ok", 1.2), ("infra", 0.5), ("great", 0.5)]:
        with pytest.raises(ValueError):
            format_outcome(status, score)


# ----------------------------------------------------------------------------- the predictor


def test_aggregation_unknown_below_min_parsed_and_failure_scores(tiny, monkeypatch):
    model, tok, _ = tiny
    pred = LLMOutcomePredictor(model, tok, samples=4, min_parsed=3)
    canned = {
        "a": ["status: ok\nscore: 0.8", "status: ok\nscore: 0.6", "junk", "status: error\nscore: 0.9"],
        "b": ["status: ok\nscore: 0.8", "junk", "junk", "status: ok\nscore: 0.4"],  # 2 < 3 parse
        "c": ["status: ok\nscore: 0.5"] * 4,  # all agree: the variance floor, not 0
    }
    monkeypatch.setattr(pred, "_generate", lambda prompts: [t for p in prompts for t in canned[p]])
    a, b, c = pred.predict(["a", "b", "c"], failure_scores=[0.1, 0.0, 0.0])
    # the error reply counts as the failure score 0.1, whatever score it wrote; the junk one is left out
    assert a.scores == [0.8, 0.6, None, 0.1] and a.parse_rate == 0.75
    assert a.prediction.mean == pytest.approx(0.5) and a.prediction.var == pytest.approx(0.13)  # ddof=1
    assert a.representative() == ("ok", 0.6, None)
    assert b.prediction.mean is None and "2/4" in b.prediction.error and b.representative() is None
    assert c.prediction.mean == pytest.approx(0.5) and c.prediction.var == pytest.approx(pred.var_floor)


def test_untrained_model_is_unknown_never_zero(tiny):
    model, tok, _ = tiny
    pred = LLMOutcomePredictor(model, tok, **KW)
    out = pred.predict(PROMPTS * 2)
    assert all(s.prediction.mean is None and s.prediction.error for s in out)
    assert pred.stats["parsed"] <= 0.1 * pred.stats["replies"]
    # inside a rollout the untrained WM's grade is unknown, not a confident 0
    wm = LLMOutcomeModel(model, tok, **KW)
    trajs = rollout(FixedPolicy([format_reply(GOOD)]), wm, [_task()] * 2, source="wm", max_turns=1)
    assert all(t.step_rewards == [None] and wm_prediction(t).mean is None for t in trajs)


def test_sampling_is_seeded_resumable_and_leaves_the_global_rng_alone(tiny):
    model, tok, _ = tiny
    first = LLMOutcomePredictor(model, tok, **KW)
    state = first.state_dict()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    texts = [s.texts for s in first.predict(PROMPTS)]
    assert torch.equal(torch.rand(3), expected)  # the caller's random stream did not move
    other = LLMOutcomePredictor(model, tok, **KW)
    assert [s.texts for s in other.predict(PROMPTS)] == texts  # same seed, same call index
    assert [s.texts for s in other.predict(PROMPTS)] != texts  # the next call draws afresh
    other.load_state_dict(state)  # back to call 0
    assert [s.texts for s in other.predict(PROMPTS)] == texts
    assert [s.texts for s in LLMOutcomePredictor(model, tok, **{**KW, "seed": 1}).predict(PROMPTS)] != texts


def test_fit_learns_the_anchor_outcomes(tiny, fitted):
    model, tok, _ = tiny
    pred, state, stats = fitted
    assert stats["steps"] == FIT_STEPS and stats["window"] == 3 and stats["last_loss"] < 0.1
    good, bad, crash = pred.predict(PROMPTS, failure_scores=[0.0, 0.0, 0.05])
    print(f"\nfit {stats['seconds']:.1f}s for {FIT_STEPS} steps; parse rates {good.parse_rate:.2f} "
          f"{bad.parse_rate:.2f} {crash.parse_rate:.2f}; means {good.prediction.mean:.2f} {bad.prediction.mean:.2f}")
    assert min(good.parse_rate, bad.parse_rate, crash.parse_rate) >= 0.85
    assert good.prediction.mean > 0.6 > 0.4 > bad.prediction.mean
    assert sum(p is not None and p.status == "error" for p in crash.parsed) >= 6
    assert crash.prediction.mean < 0.1 and "FileNotFound" in (crash.representative().log or "")

    # the fitted weights and window come back from state_dict (taken before that predict)
    clone = LLMOutcomePredictor(model, tok, **KW)
    clone.load_state_dict(state)
    assert [s.texts for s in clone.predict(PROMPTS)] == [s.texts for s in (good, bad, crash)]
    assert clone.window == EXAMPLES

    # the step budget holds: no time left -> no step, but the examples join the window
    assert clone.fit(EXAMPLES[:2], max_seconds=0.0)["steps"] == 0 and len(clone.window) == 5
    with pytest.raises(ValueError, match="does not parse"):
        clone.fit([(PROMPTS[0], "score: 0.5")])


def test_policy_weights_never_move_when_the_wm_fits(tiny):
    from wmrl.domains.autoresearch.policy import CodeAgentPolicy

    _, _, path = tiny
    policy = CodeAgentPolicy(str(path), max_new_tokens=16)
    before = {k: v.clone() for k, v in policy.module.state_dict().items()}
    wm = LLMOutcomeModel(policy.module, policy.tokenizer, fit_steps=5, lr=1e-2, seed=1)
    wm.predictor.fit(EXAMPLES)
    assert wm.predictor.stats["fit_steps"] == 5
    after = policy.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert any(not torch.equal(before[k], v) for k, v in wm.predictor.module.state_dict().items())
    # from a path (the default: the agent's own directory) the weights are loaded separately too
    from_path = LLMOutcomeModel(str(path))
    assert from_path.predictor.module is not policy.module


# ----------------------------------------------------------------------------- the AutoResearch adapter


def _real_trajectory() -> Trajectory:
    """A real 3-turn episode: a crash (with its sandbox report), no code block, then a good script."""
    obs0 = format_prompt(DESC)
    r0, r1, r2 = format_reply(CRASH), "I would use a random forest.", format_reply(GOOD)
    obs1 = next_observation(obs0, r0, "status: error\nFileNotFoundError: missing.csv")
    obs2 = next_observation(obs1, r1, "status: invalid\nno ```python code block found in the reply")
    infos = [{"status": "error", "score": None, "turn_reward": 0.0},
             {"status": "invalid", "score": None, "turn_reward": 0.0},
             {"status": "ok", "score": 0.97, "turn_reward": 0.9}]
    return Trajectory(task=_task(), observations=[obs0, obs1, obs2], actions=[r0, r1, r2], log_probs=[0.0] * 3,
                      step_rewards=[0.0, 0.0, 0.9], infos=infos, source="real")


def test_anchor_examples_from_real_turns():
    real = _real_trajectory()
    assert anchor_examples([real]) == [EXAMPLES[2], EXAMPLES[0]]  # the report becomes the log; no-code is skipped
    infra = _real_trajectory()
    infra.infos[2] = {"status": "infra", "detail": "sandbox died"}
    simulated = _real_trajectory()
    simulated.source = "wm"
    assert anchor_examples([infra]) == [EXAMPLES[2]] and anchor_examples([simulated]) == []
    # a one-turn crash has no next observation: the info's error line is the log
    one = Trajectory(task=_task(), observations=[format_prompt(DESC)], actions=[format_reply(CRASH)],
                     infos=[{"status": "error", "turn_reward": 0.0,
                             "error": "FileNotFoundError: missing.csv"}], source="real")
    assert anchor_examples([one]) == [EXAMPLES[2]]


def test_adapter_decides_no_code_and_rolls_out_inside_rollout(tiny, fitted):
    _, _, path = tiny
    _, state, _ = fitted
    wm = LLMOutcomeModel(str(path), turns=1, **KW)
    wm.load_state_dict(state)
    wm.reset([_task(failure_reward=0.05)] * 3)
    no_code, syntax, good = wm.step(["I think a forest would work.", format_reply("def f(:\n"), format_reply(GOOD)])
    assert no_code.done and no_code.reward == 0.05 and no_code.reward_var == DECIDED_VAR
    assert no_code.info["status"] == "invalid" and "no ```python code block" in no_code.observation
    assert syntax.reward == 0.05 and syntax.info["status"] == "error" and "SyntaxError" in syntax.observation
    assert good.reward > 0.6 and good.info["status"] == "ok" and 0 < good.reward_var < 0.1

    # two turns inside the core rollout: the first turn's simulated report is the next observation
    wm2 = LLMOutcomeModel(str(path), turns=2, final="best", **KW)
    wm2.load_state_dict(state)
    policy = FixedPolicy([format_reply(CRASH), format_reply(GOOD)])  # episode 0 crashes, episode 1 is good
    trajs = rollout(policy, wm2, [_task()] * 2, source="wm", max_turns=5)
    assert [t.turns for t in trajs] == [2, 2]
    crash, fine = trajs
    assert "Sandbox feedback:\nstatus: error\nFileNotFound" in crash.observations[1]
    assert crash.step_rewards[0] == 0.0 and crash.step_reward_vars[0] == 0.0  # reward only at the end
    assert wm_prediction(crash).mean < 0.1 < 0.6 < wm_prediction(fine).mean
    # grading trajectories rolled out elsewhere (the anchor pairing) replays them through the same model
    preds = wm2.predict([crash, fine])
    assert preds[0].mean < 0.1 and preds[1].mean > 0.6

    # the adapter's fit turns real anchors into examples and takes the configured steps
    wm2.fit([_real_trajectory()])
    assert wm2.last_fit["steps"] == 8 and wm2.last_fit["new"] == 2
