"""Shared fixtures: a tiny causal LM and its tokenizer, built here (no Hub download) and saved as a model folder;
the embedded AutoResearch agent, built once per session (the agent tests and the durability tests use it); a
behaviour-cloned VLA policy beside its demonstrations (the VLA training and world-model tests use it)."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from wmrl.domains.autoresearch.agent import AgentConfig, build_default_agent
from wmrl.domains.autoresearch.corpus import TaskSpec

CUE = "<|assistant|>"
TEXTS = [f"<|user|>\ntask {i}: fit a model to column y{i % 3}\n{CUE}\nimport numpy as np\nprint({i})\n<|end|>"
         for i in range(40)]


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """(tokenizer, model, path): a 2-layer Llama with a BPE tokenizer trained on TEXTS, saved at path."""
    pytest.importorskip("transformers")
    return make_tiny_lm(tmp_path_factory.mktemp("tiny-lm"))


def make_tiny_lm(path, *, hidden_size: int = 32, heads: int = 4, max_positions: int = 128):
    """(tokenizer, model, path): a 2-layer Llama of `hidden_size`, a BPE tokenizer trained on TEXTS, saved at path."""
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
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=max_positions,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return tokenizer, model, path


# ----------------------------------------------------------------------------- the embedded agent

TASKS = [
    (TaskSpec("classification", ("species",), "accuracy", ("prediction",)),
     "Task: iris-species. Predict the iris species (0, 1 or 2) from four flower measurements.\n"
     "Target column: species. Metric: accuracy.\nWrite submission.csv with one column `prediction`."),
    (TaskSpec("classification", ("diagnosis",), "roc_auc", ("prediction",)),
     "Task: tumour-diagnosis. Predict whether a tumour is malignant from 30 cell-nucleus features.\n"
     "Target column: diagnosis. Metric: roc_auc.\nWrite submission.csv with one column `prediction`: "
     "the probability that diagnosis is 1."),
    (TaskSpec("classification", ("cultivar",), "log_loss", ("p_0", "p_1", "p_2")),
     "Task: wine-cultivar. Predict the cultivar of a wine from 13 chemical measurements.\n"
     "Target column: cultivar. Metric: log_loss.\nWrite submission.csv with columns p_0, p_1, p_2: the class probabilities."),
    (TaskSpec("classification", ("digit",), "macro_f1", ("prediction",)),
     "Task: digits. Recognise handwritten digits from 8x8 pixel intensities.\n"
     "Target column: digit. Metric: macro_f1.\nWrite submission.csv with one column `prediction`."),
    (TaskSpec("regression", ("progression",), "rmse", ("prediction",)),
     "Task: diabetes-progression. Predict disease progression a year after baseline from ten measurements.\n"
     "Target column: progression. Metric: rmse.\nWrite submission.csv with one column `prediction`."),
    (TaskSpec("multioutput", ("weight", "waist"), "r2", ("weight", "waist")),
     "Task: linnerud. Predict the physiological measurements weight and waist from three exercise counts.\n"
     "Target columns: weight, waist. Metric: r2.\nWrite submission.csv with one column per target."),
]
# The default 1.2M-parameter agent. Its SFT is bounded by steps (6 epochs ~ 560 steps, ~2 minutes on 2 free cores),
# not by the clock: the CPU here is shared, and a clock-bounded run on a busy machine would train less and
# make the parse-rate test flaky. max_minutes is only the safety cap.
TEST_CONFIG = dataclasses.replace(AgentConfig(), epochs=6)  # the default architecture, step-bounded
BUILD = dict(specs_and_prompts=TASKS, n_examples=3000, seed=0, max_minutes=4.0, config=TEST_CONFIG)


@pytest.fixture(scope="session")
def agent(tmp_path_factory):
    cache = tmp_path_factory.mktemp("agents")
    t0 = time.perf_counter()
    path = build_default_agent(cache, **BUILD)
    return cache, path, time.perf_counter() - t0


@pytest.fixture(scope="session")
def suite_agent(tmp_path_factory):
    """The agent `domain.agent=default` builds (trained on the bundled suite's training tasks), step-bounded as
    `agent` is. `agent` knows only the short TASKS above: on the suite's long descriptions it may write no code
    at all, so a test that needs the suite's programs to run uses this one."""
    from wmrl.domains.autoresearch.domain import task_spec
    from wmrl.domains.autoresearch.suite import load_suite
    from wmrl.domains.autoresearch.tasks import split

    pairs = [(task_spec(t), t.description) for t in split(load_suite(), "train")]
    # 1000 examples (~70 s): code in every reply to the suite's tasks, which is all its users need
    return build_default_agent(tmp_path_factory.mktemp("suite-agent"),
                               **{**BUILD, "specs_and_prompts": pairs, "n_examples": 1000})


@pytest.fixture(scope="session")
def vla_bc(tmp_path_factory):
    """A folder with `demos/` (a LeRobotDataset of 4 scripted lift demos) and `policy/` (a WmrlVLAPolicy
    behaviour-cloned on them for 300 updates): it sometimes lifts the cube on its training scenes, so GRPO
    groups see both grades and a world model has both outcomes to learn (an untrained policy never succeeds)."""
    pytest.importorskip("robosuite")
    pytest.importorskip("lerobot")
    from wmrl.domains.vla.bc import BCConfig, behaviour_clone
    from wmrl.domains.vla.collect import CollectConfig, collect_demos
    from wmrl.domains.vla.dataset import load_dataset
    from wmrl.domains.vla.policy.adapter import VLAPolicy
    from wmrl.domains.vla.policy.configuration_wmrl_vla import WmrlVLAConfig

    root = tmp_path_factory.mktemp("vla-bc")
    counts = collect_demos(root / "demos", CollectConfig(episodes_per_family=4, families=["lift"]), progress=False)
    assert counts["lift"]["kept"] == 4
    meta = load_dataset(root / "demos").meta
    policy = VLAPolicy.build(WmrlVLAConfig.from_dataset(meta, device="cpu"), seed=0)
    behaviour_clone(policy.policy, root / "demos", root / "bc", BCConfig(steps=300, val_episodes=0, eval_every=300,
                                                                        checkpoint_every=300), progress=False)
    policy.save_pretrained(str(root / "policy"))
    return root
