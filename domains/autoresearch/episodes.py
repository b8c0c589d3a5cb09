"""The open episodes of one batch, kept the same way by the real environment and the world models.

An AutoResearch episode is a conversation: the task's prompt, then per turn the
agent's reply and the feedback on it (`protocol.next_observation`). It ends
after `turns` replies, or early when a turn's grade is unknown; its reward,
paid on the last turn, is the best turn's or the last turn's grade (`final`),
and 0 on the turns before. The sandboxed environment and every world model
that stands in for it keep exactly this state, so it is written once, here.
"""

from __future__ import annotations

from typing import Sequence

from wmrl.core.types import Task
from wmrl.domains.autoresearch.protocol import format_prompt, next_observation

#: how an episode's turns become its reward
FINALS = ("best", "last")


class Episodes:
    def __init__(self, turns: int, final: str):
        if turns < 1:
            raise ValueError(f"domain.turns must be >= 1, got {turns!r}")
        if final not in FINALS:
            raise ValueError(f"domain.final must be one of {FINALS}, got {final!r}")
        self.turns, self.final = turns, final
        self.tasks: list[Task] = []
        self.observations: list[str] = []
        self._turn: list[int] = []
        self._best: list[tuple[float, float] | None] = []  # (grade, variance) of the best turn so far

    def reset(self, tasks: Sequence[Task]) -> list[str]:
        """Open one episode per task; the first observations are the tasks' prompts."""
        self.tasks = list(tasks)
        self.observations = [format_prompt(t.payload.description) for t in self.tasks]
        self._turn = [0] * len(self.tasks)
        self._best = [None] * len(self.tasks)
        return list(self.observations)

    def begin_turn(self, i: int) -> None:
        self._turn[i] += 1

    def end_turn(self, i: int, reply: str, feedback: str, grade: float, var: float = 0.0) -> tuple[str, float, float, bool]:
        """Record a graded turn; returns (next observation, reward paid now, its variance, done)."""
        if self._best[i] is None or grade > self._best[i][0]:
            self._best[i] = (grade, var)
        done = self._turn[i] >= self.turns
        reward, reward_var = ((self._best[i] if self.final == "best" else (grade, var)) if done else (0.0, 0.0))
        self.observations[i] = next_observation(self.observations[i], reply, feedback)
        return self.observations[i], reward, reward_var, done

    def end_unknown(self, i: int, reply: str, feedback: str) -> str:
        """A turn whose grade is unknown ends the episode (reward None); returns the last observation."""
        self.observations[i] = next_observation(self.observations[i], reply, feedback)
        return self.observations[i]
