"""The LM toolkit on a real (tiny) Llama built from a config and a tokenizer trained here.

Sampling is checked against an independent implementation (transformers'
`generate`), and against its own scorer: the log-probability `sample` reports
for a reply is what `score` recomputes in one forward pass.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from wmrl.lm.batch import left_pad, sft_batch  # noqa: E402
from wmrl.lm.sampling import SamplingParams, sample, score  # noqa: E402
from wmrl.lm.tokens import encode_prompt, encode_reply, prompt_budget, special_tokens  # noqa: E402

from conftest import TEXTS  # noqa: E402

CUE = "<|assistant|>"


@pytest.fixture(scope="module")
def lm(tiny_lm):
    tokenizer, model, _ = tiny_lm
    return tokenizer, model, special_tokens(tokenizer, model)


def _prompts(tokenizer, n=4):
    return [encode_prompt(tokenizer, t.split(CUE)[0] + CUE + "\n", 64) for t in TEXTS[:n]]


def test_greedy_sampling_matches_transformers_generate(lm):
    tokenizer, model, tokens = lm
    prompts = _prompts(tokenizer)
    ours = sample(model, prompts, SamplingParams(12, 0.0, tokens.stop_ids), pad_id=tokens.pad_id)
    for p, got in zip(prompts, ours):  # one at a time: generate's own padding conventions play no part
        ref = model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             do_sample=False, max_new_tokens=12, eos_token_id=tokens.eos_id,
                             pad_token_id=tokens.pad_id)[0, len(p):].tolist()
        want = got.tokens + ([got.stop] if got.stop is not None else [])
        assert ref[: len(want)] == want


def test_sampled_log_probs_are_what_score_recomputes_and_padding_changes_nothing(lm):
    tokenizer, model, tokens = lm
    prompts = _prompts(tokenizer, 6)
    params = SamplingParams(10, 1.0, tokens.stop_ids)
    drawn = sample(model, prompts, params, pad_id=tokens.pad_id, generator=torch.Generator().manual_seed(3))
    replies = [d.tokens + ([d.stop] if d.stop is not None else []) for d in drawn]
    assert all(len(d.token_log_probs) == len(r) for d, r in zip(drawn, replies))
    with torch.no_grad():
        batched = score(model, prompts, replies, pad_id=tokens.pad_id)
        alone = torch.stack([score(model, [p], [r], pad_id=tokens.pad_id)[0] for p, r in zip(prompts, replies)])
    assert torch.allclose(batched, torch.tensor([d.log_prob for d in drawn]), atol=1e-4)
    assert torch.allclose(batched, alone, atol=1e-4)  # left padding and positions: a row is scored as if alone
    assert score(model, prompts[:2], replies[:2], pad_id=tokens.pad_id).requires_grad


def test_the_generator_alone_decides_the_draw(lm):
    tokenizer, model, tokens = lm
    prompts = _prompts(tokenizer) * 2
    params = SamplingParams(10, 1.5, tokens.stop_ids)

    def draw(seed):
        return [d.tokens for d in sample(model, prompts, params, pad_id=tokens.pad_id,
                                         generator=torch.Generator().manual_seed(seed))]

    torch.manual_seed(123)
    first = draw(7)
    torch.manual_seed(456)  # the global RNG plays no part
    assert draw(7) == first and draw(8) != first


def test_encoding_rules(lm):
    tokenizer, model, tokens = lm
    assert tokens.eos_id == tokenizer.eos_token_id and tokens.pad_id == tokenizer.pad_token_id
    assert tokens.stop_ids == (tokens.eos_id,) and tokens.context == 128
    long = TEXTS[0].split(CUE)[0] + CUE + "\n" + "feedback line\n" * 40 + CUE + "\n"
    full = tokenizer(long)["input_ids"]
    cut = encode_prompt(tokenizer, long, 30, head_until=CUE)
    head = tokenizer(TEXTS[0].split(CUE)[0] + CUE)["input_ids"]
    assert len(cut) == 30 and cut[-10:] == full[-10:]
    assert cut[: min(len(head), 15)] == full[: min(len(head), 15)]  # the task survives, up to half the budget
    reply = encode_reply(tokenizer, "print(1)", tokens.eos_id)
    assert reply[-1] == tokens.eos_id
    capped = encode_reply(tokenizer, "print(1)", tokens.eos_id, max_tokens=len(reply) - 1)
    assert capped == reply[:-1]  # a reply as long as the cap was cut there: no EOS
    assert prompt_budget(128, 1024, 100) == 28
    with pytest.raises(ValueError, match="leaves no room for a prompt in a 128-token context"):
        prompt_budget(128, 1024, 125)


def test_a_tokenizer_without_eos_is_a_clear_error(lm):
    tokenizer, model, _ = lm

    class NoEos:
        eos_token_id = None
        pad_token_id = None

    bare = type("M", (), {"config": type("C", (), {"eos_token_id": None})()})()
    with pytest.raises(ValueError, match="no EOS token"):
        special_tokens(NoEos(), bare)
    with_cfg = type("M", (), {"config": type("C", (), {"eos_token_id": [5, 6]})()})()
    got = special_tokens(NoEos(), with_cfg)
    assert (got.eos_id, got.pad_id, got.stop_ids) == (5, 5, (5,))


def test_padding_layouts():
    ids, mask, pos = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]
    ids, mask, labels = sft_batch([[1, 2], [3]], [[7, 8], [9]], pad_id=0)
    assert ids.tolist() == [[1, 2, 7, 8], [3, 9, 0, 0]] and mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert labels.tolist() == [[-100, -100, 7, 8], [-100, 9, -100, -100]]
    with pytest.raises(ValueError, match="2 prompts but 1 targets"):
        sft_batch([[1], [2]], [[3]], pad_id=0)
