"""Hashed n-gram features: a fixed-size vector from any text, no vocabulary to fit.

Code outcome predictors need features before they have seen any data and must
accept code they have never seen; hashing identifier-level uni- and bi-grams
(`RandomForestClassifier`, `max_depth=3`) into a fixed number of buckets does
both, and what distinguishes two scripts (estimator, hyperparameters,
preprocessing) lands in different buckets.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9]*(?:=[-+.\w]+)?|\d+(?:\.\d+)?")  # kwargs stay whole: max_depth=3


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def hashed_ngrams(text: str, dim: int = 1024, n: int = 2, salt: str = "") -> np.ndarray:
    """L2-normalised counts of the text's 1..n-grams hashed into `dim` buckets.

    A `salt` (e.g. the task's type) sends the same grams to other buckets: crossed
    features, so a regressor can learn that a token helps on one kind of task only.
    """
    toks = tokens(text)
    v = np.zeros(dim, dtype=np.float64)
    for k in range(1, n + 1):
        for i in range(len(toks) - k + 1):
            v[zlib.crc32((salt + " ".join(toks[i : i + k])).encode()) % dim] += 1.0
    norm = np.linalg.norm(v)
    return v / norm if norm else v
