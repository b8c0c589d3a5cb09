"""The chat protocol of the AutoResearch agent: how a task becomes a prompt, and a reply becomes code.

The environment, the agent's policy, the world models that stand in for the
environment and the SFT corpus all speak it, so it is defined once, here.
Plain-text role markers, not a Hub chat template, so the embedded agent's
tokenizer can hold each marker as one special token:

    <|system|>\\n{system}\\n<|user|>\\n{description}\\n<|assistant|>\\n

The agent's reply is a fenced ```python block; the turn ends with the
end-of-turn token `<|end|>` (the default agent's EOS). After a turn the
sandbox's report is appended as the next user message (`next_observation`).
"""

from __future__ import annotations

import re

SYSTEM_MARK, USER_MARK, ASSISTANT_MARK, END_MARK = "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SYSTEM_PROMPT = (
    "You are an ML research agent. Reply with one complete Python script in a ```python block. "
    "It runs in a folder with train.csv and test_features.csv and must write submission.csv."
)
FEEDBACK_INSTRUCTION = "Improve the script. Reply with the full script in a ```python block."


def format_prompt(description: str) -> str:
    """The first observation of an episode: system text, the task description, the assistant cue.

    Idempotent: an already formatted prompt is returned unchanged.
    """
    if description.startswith(SYSTEM_MARK):
        return description
    return f"{SYSTEM_MARK}\n{SYSTEM_PROMPT}\n{USER_MARK}\n{description.strip()}\n{ASSISTANT_MARK}\n"


def format_reply(script: str) -> str:
    """The agent's reply for a script (without the end-of-turn token)."""
    return f"```python\n{script.rstrip()}\n```"


def next_observation(previous_observation: str, reply: str, feedback: str) -> str:
    """The conversation after one more turn: the reply, its end of turn, the sandbox report, the cue."""
    return (
        f"{previous_observation}{reply}{END_MARK}\n{USER_MARK}\nSandbox feedback:\n{feedback.strip()}\n"
        f"{FEEDBACK_INSTRUCTION}\n{ASSISTANT_MARK}\n"
    )


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n")
_PY_LANGS = ("python", "py", "python3")


def extract_code(reply: str) -> str | None:
    """The first fenced python block of a reply; None if the reply has no fenced block.

    A block labelled python/py/python3 wins; failing that, the first unlabelled
    block. A block whose closing fence is missing (a reply truncated at
    max_new_tokens) runs to the end of the reply.
    """
    if not isinstance(reply, str):
        return None
    unlabelled = None
    pos = 0
    while True:
        m = _FENCE.search(reply, pos)
        if m is None:
            break
        end = reply.find("```", m.end())
        body = reply[m.end():] if end < 0 else reply[m.end():end]
        lang = m.group(1).lower()
        if lang in _PY_LANGS:
            return body
        if lang == "" and unlabelled is None:
            unlabelled = body
        if end < 0:
            break
        pos = end + 3
    return unlabelled
