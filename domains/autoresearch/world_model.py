"""A learned outcome predictor for (task, code): the AutoResearch world model until issue 4's.

It predicts the normalised score of a script from hashed n-grams of its code
plus the task's family, with a bootstrap ridge ensemble for the variance, and
learns online from every step's anchors (the trajectories the sandbox really
graded). A reply without a code block or whose code does not parse is
predicted to fail (score 0, small variance): the sandbox would say the same.
For multi-turn episodes inside the model, the simulated sandbox report is the
predicted score, marked as simulated.
"""

from __future__ import annotations

import ast
from typing import Any, Sequence

import numpy as np

from wmrl.core.interfaces import WorldModel
from wmrl.core.types import Task, Trajectory, Transition
from wmrl.domains.autoresearch.corpus import extract_code, format_prompt, next_observation
from wmrl.world_models.ensemble import RidgeEnsemble
from wmrl.world_models.features import hashed_ngrams


class CodeOutcomeModel(WorldModel):
    def __init__(self, families: Sequence[str], *, turns: int = 1, final: str = "best", dim: int = 512,
                 members: int = 8, seed: int = 0):
        self.families = sorted(set(families))
        self.turns, self.final, self.dim = turns, final, dim
        self.model = RidgeEnsemble(members=members, seed=seed)
        self._tasks: list[Task] = []
        self._obs: list[str] = []
        self._turn: list[int] = []

    def features(self, task: Task, code: str) -> np.ndarray:
        fam = np.zeros(len(self.families))
        if task.payload.family in self.families:
            fam[self.families.index(task.payload.family)] = 1.0
        return np.concatenate([hashed_ngrams(code, self.dim), fam])

    def score(self, tasks: Sequence[Task], replies: Sequence[str]) -> list[tuple[float, float]]:
        codes = [extract_code(r) for r in replies]
        ok = []
        for c in codes:
            try:
                ok.append(c is not None and ast.parse(c) is not None)
            except (SyntaxError, ValueError):
                ok.append(False)
        rows = [self.features(t, c) for t, c, good in zip(tasks, codes, ok) if good]
        mean, var = self.model.predict(np.asarray(rows)) if rows else (np.zeros(0), np.zeros(0))
        it = iter(zip(np.clip(mean, 0.0, 1.0), var))
        return [tuple(map(float, next(it))) if good else (0.0, 1e-4) for good in ok]

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        self._tasks = list(tasks)
        self._obs = [format_prompt(t.payload.description) for t in self._tasks]
        self._turn = [0] * len(self._tasks)
        self._best = [0.0] * len(self._tasks)
        return list(self._obs)

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        live = [i for i, a in enumerate(actions) if a is not None]
        scores = self.score([self._tasks[i] for i in live], [actions[i] for i in live])
        out: list[Transition | None] = [None] * len(actions)
        for i, (m, v) in zip(live, scores):
            self._turn[i] += 1
            self._best[i] = max(self._best[i], m)
            done = self._turn[i] >= self.turns
            final = (self._best[i] if self.final == "best" else m) if done else 0.0
            self._obs[i] = next_observation(self._obs[i], actions[i], f"status: simulated\npredicted score: {m:.3f}")
            out[i] = Transition(self._obs[i], final, done, reward_var=v if done else 0.0, info={"turn_reward": m})
        return out

    def fit(self, anchors: Sequence[Trajectory]) -> None:
        X, y = [], []
        for traj in anchors:
            for reply, info in zip(traj.actions, traj.infos):
                code = extract_code(reply)
                if code is not None and info.get("turn_reward") is not None:
                    X.append(self.features(traj.task, code))
                    y.append(info["turn_reward"])
        if X:
            self.model.add(np.asarray(X), np.asarray(y))
            self.model.fit()

    def state_dict(self) -> dict:
        return self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.model.load_state_dict(state)
