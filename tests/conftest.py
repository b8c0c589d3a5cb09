"""Shared fixtures: a tiny causal LM and its tokenizer, built here (no Hub download) and saved as a model folder."""

from __future__ import annotations

import pytest
import torch

CUE = "<|assistant|>"
TEXTS = [f"<|user|>\ntask {i}: fit a model to column y{i % 3}\n{CUE}\nimport numpy as np\nprint({i})\n<|end|>"
         for i in range(40)]


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """(tokenizer, model, path): a 2-layer Llama with a BPE tokenizer trained on TEXTS, saved at path."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|pad|>", "<|end|>", CUE],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|pad|>",
                                        additional_special_tokens=[CUE])
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("tiny-lm")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return tokenizer, model, path
