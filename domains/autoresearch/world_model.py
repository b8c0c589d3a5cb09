"""A learned outcome predictor for (task, code): the AutoResearch world model that learns from anchors.

It predicts the normalised score of a script from hashed n-grams of its code,
the same crossed with the task's type and metric, the task's family and a few
task-code checks, with an ensemble regressor for the variance (bootstrap
ridge by default, or the heteroscedastic NLL ensemble), and learns online from
every step's anchors (the trajectories the sandbox really graded). Each batch
of anchors is first predicted, before the model sees it, to recalibrate the
variance on out-of-sample residuals (`world_models/calibration.py`). A reply
that certainly fails -- no code block, a syntax error, a name never defined or
imported (`static_failure`) -- is predicted to fail (score 0, small variance)
without asking the regressor, which only learns from scripts that could run.
For multi-turn episodes inside the model, the simulated sandbox report is the
predicted score, marked as simulated.
"""

from __future__ import annotations

import ast
import builtins
import re
from typing import Any, Sequence

import numpy as np

from wmrl.core.interfaces import WorldModel
from wmrl.core.types import Task, Trajectory, Transition
from wmrl.domains.autoresearch.episodes import Episodes
from wmrl.domains.autoresearch.protocol import extract_code
from wmrl.world_models.calibration import VarianceCalibrator
from wmrl.world_models.ensemble import RidgeEnsemble
from wmrl.world_models.features import hashed_ngrams


_BUILTINS = frozenset(dir(builtins))


_CLASSIFIER_CALL = re.compile(r"\b(?:\w*Classifier|LogisticRegression\w*|SVC|LinearSVC)\(")


def static_failure(code: str | None, task: Any = None) -> str | None:
    """Why a script certainly fails before it computes anything, or None.

    No code block, a syntax error, or a name the script loads but never defines
    or imports (the commonest failure of a small agent: `LogisticRegression`
    used, never imported); given the task (an `ARTask`), also a classifier
    fitted to a continuous target, which scikit-learn refuses. The sandbox
    would report the same, so the world model need not guess.
    """
    if code is None:
        return "no code block"
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    except ValueError as exc:  # e.g. a NUL byte in the source
        return f"ValueError: {exc}"
    defined, loaded = set(_BUILTINS), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
    missing = sorted(loaded - defined)
    if missing:
        return f"NameError: name {missing[0]!r} is not defined"
    continuous = task is not None and (task.task_type == "regression" or (
        task.task_type == "multi-output" and task.metric in ("r2", "rmse")))
    if continuous and _CLASSIFIER_CALL.search(code):
        return "ValueError: Unknown label type: continuous (a classifier on a regression target)"
    return None


class CodeOutcomeModel(WorldModel):
    def __init__(self, families: Sequence[str], *, turns: int = 1, final: str = "best", dim: int = 512,
                 members: int = 8, seed: int = 0, regressor: Any = None):
        self.families = sorted(set(families))
        self.dim = dim
        self.episodes = Episodes(turns, final)
        # anything with n / add / fit / predict -> (mean, var) / state_dict, e.g. GaussianEnsemble
        self.model = regressor if regressor is not None else RidgeEnsemble(members=members, seed=seed)
        self.calibrator = VarianceCalibrator()

    def features(self, task: Task, code: str) -> np.ndarray:
        t = task.payload
        fam = np.zeros(len(self.families))
        if t.family in self.families:
            fam[self.families.index(t.family)] = 1.0
        # code x task-kind crossings: a classifier on a regression target, predict_proba for a label metric
        kind = f"{t.task_type}|{t.metric}|"
        quoted = [f'"{c}"' in code or f"'{c}'" in code for c in t.target_columns]
        # a script written for another task names that task's submission columns: the shape check fails
        sub = [f'"{c}"' in code or f"'{c}'" in code for c in t.submission_columns]
        flags = np.array([float(all(quoted)), float(any(quoted)), float(all(sub)), float(any(sub)),
                          min(len(code) / 2000.0, 1.0)])
        return np.concatenate([hashed_ngrams(code, self.dim), hashed_ngrams(code, self.dim // 2, n=1, salt=kind),
                               fam, flags])

    def score(self, tasks: Sequence[Task], replies: Sequence[str]) -> list[tuple[float, float]]:
        codes = [extract_code(r) for r in replies]
        ok = [static_failure(c, t.payload) is None for c, t in zip(codes, tasks)]
        rows = [self.features(t, c) for t, c, good in zip(tasks, codes, ok) if good]
        mean, var = self.model.predict(np.asarray(rows)) if rows else (np.zeros(0), np.zeros(0))
        it = iter(zip(np.clip(mean, 0.0, 1.0), self.calibrator.apply(var)))
        return [tuple(map(float, next(it))) if good else (0.0, 1e-4) for good in ok]

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        return self.episodes.reset(tasks)

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        live = [i for i, a in enumerate(actions) if a is not None]
        scores = self.score([self.episodes.tasks[i] for i in live], [actions[i] for i in live])
        out: list[Transition | None] = [None] * len(actions)
        for i, (m, v) in zip(live, scores):
            self.episodes.begin_turn(i)
            obs, reward, var, done = self.episodes.end_turn(
                i, actions[i], f"status: simulated\npredicted score: {m:.3f}", m, v)
            out[i] = Transition(obs, reward, done, reward_var=var, info={"turn_reward": m})
        return out

    def fit(self, anchors: Sequence[Trajectory]) -> None:
        X, y = [], []
        for traj in anchors:
            for reply, info in zip(traj.actions, traj.infos):
                code = extract_code(reply)
                if static_failure(code, traj.task.payload) is None and info.get("turn_reward") is not None:
                    X.append(self.features(traj.task, code))
                    y.append(info["turn_reward"])
        if X:
            X, y = np.asarray(X), np.asarray(y)
            if self.model.n:  # out-of-sample residuals: the model has not seen these yet
                self.calibrator.observe(*self.model.predict(X), y)
            self.model.add(X, y)
            self.model.fit()

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "calibrator": self.calibrator.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.model.load_state_dict(state["model"])
            self.calibrator.load_state_dict(state["calibrator"])
