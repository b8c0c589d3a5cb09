"""AutoResearchEnv: the agent's code really runs, and the sandbox's output is its next observation.

An episode is up to `turns` rounds of: the agent replies with a fenced Python
block -> the block runs in the sandbox against the task's public files -> the
grader (outside the sandbox, holding the hidden labels) scores
`submission.csv` -> the run's output and the grade become the next
observation. The episode's reward, on its last turn, is the best (or last)
turn's normalised score.

What is an outcome and what is unknown: a reply without a code block, code
that raises, times out, runs out of memory or writes an invalid submission is a
real, bad outcome and gets the task's failure reward (0). A failure of the
sandbox machinery itself (status `infra`) is *unknown* -- the episode ends with
reward None and the estimator excludes it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

from wmrl.core.interfaces import RealEnv
from wmrl.core.types import Task, Transition
from wmrl.domains.autoresearch.grader import grade
from wmrl.domains.autoresearch.corpus import extract_code, format_prompt, next_observation
from wmrl.domains.autoresearch.sandbox import ExecResult, SandboxLimits, SandboxPool
from wmrl.domains.autoresearch.tasks import ARTask, materialize

#: sandbox statuses that are the program's own fault, mapped to outcome statuses
_PROGRAM_FAILURES = {"error": "error", "timeout": "timeout", "oom": "oom", "killed": "error"}
_TAIL = 1200  # characters of output fed back to the agent


def feedback(result: ExecResult | None, status: str, score: float | None, message: str) -> str:
    """The sandbox report the agent reads on its next turn."""
    lines = [f"status: {status}"]
    if score is not None:
        lines.append(f"score: {score:.4f}")
    if message:
        lines.append(message)
    if result is not None:
        if result.stdout.strip():
            lines.append("stdout (tail):\n" + result.stdout[-_TAIL:])
        if status != "ok" and result.stderr.strip():
            lines.append("stderr (tail):\n" + result.stderr[-_TAIL:])
    return "\n".join(lines)


class AutoResearchEnv(RealEnv):
    def __init__(self, pool: SandboxPool, *, turns: int = 1, final: str = "best", timeout_scale: float = 1.0,
                 memory_mb: int = 2048, workroot: str | Path | None = None):
        if turns < 1:
            raise ValueError("domain.turns must be >= 1")
        if final not in ("best", "last"):
            raise ValueError("domain.final must be 'best' or 'last'")
        self.pool = pool
        self.capacity = pool.slots
        self.turns, self.final = turns, final
        self.timeout_scale, self.memory_mb = timeout_scale, memory_mb
        self.root = Path(workroot) if workroot else Path(tempfile.mkdtemp(prefix="wmrl-ar-"))
        self._tasks: list[ARTask] = []
        self._dirs: list[Path] = []
        self._obs: list[str] = []
        self._turn: list[int] = []
        self._best: list[float] = []
        self._episode = 0

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        self._cleanup()
        self._tasks = [t.payload for t in tasks]
        self._dirs = []
        for task in self._tasks:
            self._episode += 1
            d = self.root / f"ep{self._episode:07d}"
            d.mkdir(parents=True)
            materialize(task, d)
            self._dirs.append(d)
        self._obs = [format_prompt(t.description) for t in self._tasks]
        self._turn = [0] * len(tasks)
        self._best = [0.0] * len(tasks)
        return list(self._obs)

    def _limits(self, task: ARTask) -> SandboxLimits:
        timeout = task.budget_s * self.timeout_scale
        return SandboxLimits(timeout_s=timeout, cpu_s=int(timeout * 2) + 1, memory_mb=self.memory_mb)

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        out: list[Transition | None] = [None] * len(actions)
        jobs, job_idx = [], []
        codes: dict[int, str | None] = {}
        for i, reply in enumerate(actions):
            if reply is None:
                continue
            self._turn[i] += 1
            codes[i] = extract_code(reply)
            if codes[i] is not None:
                (self._dirs[i] / "submission.csv").unlink(missing_ok=True)
                jobs.append((codes[i], self._dirs[i], self._limits(self._tasks[i])))
                job_idx.append(i)
        results = dict(zip(job_idx, self.pool.run_many(jobs))) if jobs else {}
        for i, reply in enumerate(actions):
            if reply is None:
                continue
            result = results.get(i)
            if codes[i] is None:
                status, score, reward, msg = "invalid", None, 0.0, "no ```python code block found in the reply"
            elif result.status == "infra":
                obs = next_observation(self._obs[i], reply, "status: sandbox failure (not your fault)")
                out[i] = Transition(obs, None, True, info={"status": "infra", "detail": result.detail})
                continue
            elif result.status in _PROGRAM_FAILURES:
                status, score, reward = _PROGRAM_FAILURES[result.status], None, 0.0
                msg = result.detail or f"the program failed ({result.status})"
            else:
                g = grade(self._tasks[i], self._dirs[i])
                status, score, reward, msg = g.status, g.score, g.reward, g.message
            self._best[i] = max(self._best[i], reward)
            done = self._turn[i] >= self.turns
            final = (self._best[i] if self.final == "best" else reward) if done else 0.0
            self._obs[i] = next_observation(self._obs[i], reply, feedback(result, status, score, msg))
            info = {"status": status, "score": score, "turn_reward": reward}
            if status != "ok":  # the line that says why, kept for diagnosis and for WMs that learn it
                tail = (result.stderr.strip().splitlines() or [""])[-1] if result is not None and result.stderr else ""
                info["error"] = (tail or msg)[-300:]
            out[i] = Transition(self._obs[i], final, done, info=info)
        return out

    def _cleanup(self) -> None:
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)

    def close(self) -> None:
        self._cleanup()
        self.pool.close()
