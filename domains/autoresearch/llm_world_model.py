"""The AutoResearch LLM world model: a causal LM reads the task and the agent's script and writes the outcome.

It has CodeOutcomeModel's shape (`turns`, `final` = best/last turn, the episode
reward on the last turn, 0 with variance 0 before it) with the paper's kind of
predictor behind it (`wmrl.world_models.llm_outcome`). By default the backbone
is the agent's own LM (the caller passes the agent's path): it already reads
this task and code format; its weights are loaded separately, so fitting the
world model never changes the policy.

The prompt holds the task description and the script of the current turn only:
each turn's script runs on its own in a fresh submission, so its outcome is a
function of (task, script), and a short prompt keeps the K samples cheap.
Decided without the LM, as the sandbox would: a reply without a fenced code
block is `invalid`, and code that certainly fails (`static_failure`: a syntax
error, a name never defined or imported, a classifier on a continuous target)
is an `error`, both with the task's
failure reward and a small variance. For an intermediate turn the
simulated sandbox report (the next observation) is the predicted log, in the
real report's shape (`status: ...` and then the log, which learns the real
report's body); an unknown prediction
ends the episode with reward None, as a sandbox failure would.

Online learning turns each real anchor turn (its info carries the real status
and turn reward; the next observation carries the real sandbox report, or, on
the last turn, the info's error line) into a (prompt, target text) pair and
fine-tunes the predictor on them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import torch

from wmrl.core.interfaces import WorldModel
from wmrl.core.types import GRADED_STATUSES, Task, Trajectory, Transition
from wmrl.domains.autoresearch.episodes import Episodes
from wmrl.domains.autoresearch.feedback import report
from wmrl.domains.autoresearch.protocol import (
    ASSISTANT_MARK,
    END_MARK,
    FEEDBACK_INSTRUCTION,
    SYSTEM_MARK,
    USER_MARK,
    extract_code,
    format_reply,
)
from wmrl.domains.autoresearch.world_model import static_failure
from wmrl.world_models.llm_outcome import LLMOutcomePredictor, format_outcome

WM_SYSTEM_PROMPT = (
    "Predict what happens when this script runs in the sandbox. Answer with `status:` (ok, error, timeout, oom "
    "or invalid), `score:` (the normalised reward in [0, 1]) and optionally `log:` (the sandbox report)."
)
#: variance of the outcomes decided without the LM (no code block, a syntax error): near certain
DECIDED_VAR = 1e-4
_NO_CODE = "no ```python code block found in the reply"


def outcome_prompt(description: str, code: str) -> str:
    """The world model's prompt for one script: the task, the script, the answer cue."""
    return (f"{SYSTEM_MARK}\n{WM_SYSTEM_PROMPT}\n{USER_MARK}\n{description.strip()}\nScript:\n"
            f"{format_reply(code)}\n{ASSISTANT_MARK}\n")


def _real_log(before: str, reply: str, after: str) -> str | None:
    """The real sandbox report after `reply`, minus its status line (None if `after` is not that turn's)."""
    head = f"{before}{reply}{END_MARK}\n{USER_MARK}\nSandbox feedback:\n"
    tail = f"\n{FEEDBACK_INSTRUCTION}\n{ASSISTANT_MARK}\n"
    if not (after.startswith(head) and after.endswith(tail)):
        return None
    lines = after[len(head):len(after) - len(tail)].split("\n", 1)
    if len(lines) < 2 or not lines[1].strip():
        return None
    return lines[1].strip()


def anchor_examples(anchors: Sequence[Trajectory], *, log_chars: int = 400, digits: int = 2) -> list[tuple[str, str]]:
    """(prompt, target outcome text) for every really executed turn of the anchors.

    Turns decided without the LM (no code, a syntax error), unknown grades
    (`infra`) and anything the world model simulated itself are skipped.
    """
    out = []
    for traj in anchors:
        if traj.source != "real":
            continue
        for t, (reply, info) in enumerate(zip(traj.actions, traj.infos)):
            status, reward = info.get("status"), info.get("turn_reward")
            if info.get("simulated") or status not in GRADED_STATUSES or reward is None:
                continue
            code = extract_code(reply)
            if static_failure(code, traj.task.payload) is not None:
                continue
            log = None
            if t + 1 < len(traj.observations):
                log = _real_log(str(traj.observations[t]), str(reply), str(traj.observations[t + 1]))
            if log is None and info.get("error"):  # the last turn has no next observation: its error line
                log = str(info["error"])
            target = format_outcome(status, min(1.0, max(0.0, float(reward))), log, digits=digits,
                                    max_log_chars=log_chars)
            out.append((outcome_prompt(traj.task.payload.description, code), target))
    return out


class LLMOutcomeModel(WorldModel):
    """AutoResearch world model backed by an `LLMOutcomePredictor` (see the module docstring).

    `backbone` is a model directory / Hub id (normally the agent's own path) or
    an already-loaded causal LM with its `tokenizer` (copied, never modified).
    """

    def __init__(
        self,
        backbone: str | Path | torch.nn.Module,
        tokenizer: Any = None,
        *,
        turns: int = 1,
        final: str = "best",
        samples: int = 8,
        min_parsed: int | None = None,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        fit_steps: int = 8,
        fit_seconds: float = 10.0,
        lr: float = 1e-3,
        batch_size: int = 8,
        window: int = 256,
        log_chars: int = 400,
        seed: int = 0,
        rollout: str = "hf",
    ):
        self.episodes = Episodes(turns, final)
        self.log_chars = log_chars
        self.predictor = LLMOutcomePredictor(
            backbone, tokenizer, samples=samples, min_parsed=min_parsed, max_new_tokens=max_new_tokens,
            temperature=temperature, fit_steps=fit_steps, fit_seconds=fit_seconds, lr=lr, batch_size=batch_size,
            window=window, seed=seed, rollout=rollout,
        )
        #: the last fit's statistics (steps, loss, seconds, window size)
        self.last_fit: dict = {}

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        return self.episodes.reset(tasks)

    def _failure(self, i: int) -> float:
        return float(getattr(self.episodes.tasks[i].payload, "failure_reward", 0.0))

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        out: list[Transition | None] = [None] * len(actions)
        # verdicts: i -> (status, mean, var, feedback); None where the LM's grade is unknown
        verdicts: dict[int, tuple[str, float, float, str] | None] = {}
        ask: list[tuple[int, str]] = []
        for i, reply in enumerate(actions):
            if reply is None:
                continue
            self.episodes.begin_turn(i)
            task = self.episodes.tasks[i].payload
            code = extract_code(reply)
            problem = _NO_CODE if code is None else static_failure(code, task)
            if problem is not None:
                status = "invalid" if code is None else "error"
                verdicts[i] = (status, self._failure(i), DECIDED_VAR, report(status, message=problem))
            else:
                ask.append((i, outcome_prompt(task.description, code)))
        errors: dict[int, str] = {}
        if ask:
            samples = self.predictor.predict([p for _, p in ask], [self._failure(i) for i, _ in ask])
            for (i, _), s in zip(ask, samples):
                rep = s.representative()
                if rep is None:
                    verdicts[i], errors[i] = None, s.prediction.error or "world model gave no grade"
                    continue
                # the episode's status is the samples' majority; the log is the typical sample's
                status = Counter(p.status for p in s.parsed if p is not None).most_common(1)[0][0]
                feedback = f"status: {status}" + (f"\n{rep.log}" if rep.log else "")  # log: the report's body
                verdicts[i] = (status, float(s.prediction.mean), float(s.prediction.var), feedback)
        for i, verdict in verdicts.items():
            reply = actions[i]
            if verdict is None:
                obs = self.episodes.end_unknown(i, reply, "status: unknown (the world model gave no grade)")
                out[i] = Transition(obs, None, True, info={"status": "unknown", "error": errors[i], "simulated": True})
                continue
            status, mean, var, feedback = verdict
            obs, final, final_var, done = self.episodes.end_turn(i, reply, feedback, mean, var)
            out[i] = Transition(obs, final, done, reward_var=final_var,
                                info={"status": status, "turn_reward": mean, "turn_var": var, "simulated": True})
        return out

    def fit(self, anchors: Sequence[Trajectory]) -> None:
        examples = anchor_examples(anchors, log_chars=self.log_chars)
        if examples:
            self.last_fit = self.predictor.fit(examples)

    def state_dict(self) -> dict:
        return self.predictor.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.predictor.load_state_dict(state)

    def close(self) -> None:
        self.predictor.close()
