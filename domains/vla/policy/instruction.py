"""A word-level instruction tokenizer the policy owns, built from the instructions it was trained on.

Nothing can be downloaded here (no Hub), and the instructions are short templated
phrases, so a vocabulary of the words seen in the demonstrations is enough. Words
never seen (the OOD split's new phrasings) map to `<unk>` instead of failing, so a
trained policy still acts on them. The vocabulary is plain JSON: it travels inside
the policy's `config.json`, which is what makes a reloaded policy tokenize the same.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Iterable, Sequence

import torch

PAD, UNK = "<pad>", "<unk>"
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """Lower-cased alphanumeric words; punctuation and case never make two tokens differ."""
    return _WORD.findall(text.lower())


class InstructionTokenizer:
    """Maps instructions to padded id tensors; id 0 is `<pad>`, id 1 is `<unk>`."""

    def __init__(self, vocabulary: Sequence[str], max_tokens: int = 16):
        vocab = list(vocabulary)
        if vocab[:2] != [PAD, UNK]:
            raise ValueError(f"a vocabulary must start with {[PAD, UNK]}, got {vocab[:2]}; build one with "
                             "InstructionTokenizer.build(instructions)")
        if len(set(vocab)) != len(vocab):
            raise ValueError("the vocabulary has repeated words; build it with InstructionTokenizer.build")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.vocabulary = vocab
        self.max_tokens = max_tokens
        self._ids = {w: i for i, w in enumerate(vocab)}

    @classmethod
    def build(cls, instructions: Iterable[str], max_tokens: int = 16, min_count: int = 1) -> InstructionTokenizer:
        """The words seen at least `min_count` times, sorted so the same instructions give the same ids."""
        counts = Counter(w for text in instructions for w in words(text))
        return cls([PAD, UNK] + sorted(w for w, c in counts.items() if c >= min_count), max_tokens)

    def __len__(self) -> int:
        return len(self.vocabulary)

    def ids(self, text: str) -> list[int]:
        unk = self._ids[UNK]
        return [self._ids.get(w, unk) for w in words(text)][: self.max_tokens]

    def encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Ids [B, L] (L = longest instruction, at least 1) and a bool mask of the real tokens."""
        rows = [self.ids(t) for t in texts]
        length = max([1] + [len(r) for r in rows])
        ids = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return ids, ids != self._ids[PAD]

    def to_json(self) -> str:
        return json.dumps({"vocabulary": self.vocabulary, "max_tokens": self.max_tokens})

    @classmethod
    def from_json(cls, text: str) -> InstructionTokenizer:
        data = json.loads(text)
        return cls(data["vocabulary"], data["max_tokens"])
