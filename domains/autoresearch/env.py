"""AutoResearchEnv: the agent's code really runs, and the sandbox's output is its next observation.

An episode is up to `turns` rounds of: the agent replies with a fenced Python
block -> the block runs in the sandbox, in a fresh workdir holding the task's
public files read-only -> the grader (outside the sandbox, holding the hidden
labels) scores the `submission.csv` the sandbox hands back -> the verdict and
the run's output become the next observation. The episode's reward, on its
last turn, is the best (or last) turn's normalised score.

Every execution starts from the same files: nothing a previous turn wrote
survives, so an outcome depends on the code alone, and nothing a program
leaves behind is ever touched by host code (see the sandbox's threat model).

What is an outcome and what is unknown: a reply without a code block, code
that raises, times out, runs out of memory or writes an invalid submission is a
real, bad outcome and gets the task's failure reward (0). A failure of the
sandbox machinery, or any host-side error while handling one episode, is
*unknown*: that episode ends with reward None (the estimator excludes it) and
the rest of the batch is graded as usual.

The observation separates what we say from what the program printed
(`feedback.report`), so printed text cannot pass for the grader's.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

from wmrl.core.interfaces import RealEnv, gather_steps
from wmrl.core.types import Task, Transition
from wmrl.domains.autoresearch.grader import grade_bytes, submission_cap
from wmrl.domains.autoresearch.episodes import Episodes
from wmrl.domains.autoresearch.protocol import extract_code
from wmrl.domains.autoresearch.feedback import defuse, report
from wmrl.domains.autoresearch.sandbox import ExecResult, ExecutionPool, Job, SandboxLimits
from wmrl.domains.autoresearch.tasks import SUBMISSION_FILE, ARTask, materialize

log = logging.getLogger(__name__)

#: sandbox statuses that are the program's own fault, mapped to outcome statuses
_PROGRAM_FAILURES = {"error": "error", "timeout": "timeout", "oom": "oom", "killed": "error"}


class AutoResearchEnv(RealEnv):
    def __init__(self, pool: ExecutionPool, *, turns: int = 1, final: str = "best", timeout_scale: float = 1.0,
                 memory_mb: int = 2048, workroot: str | Path | None = None):
        self.episodes = Episodes(turns, final)
        self.pool = pool
        self.capacity = pool.slots
        self.timeout_scale, self.memory_mb = timeout_scale, memory_mb
        self.root = Path(workroot) if workroot else Path(tempfile.mkdtemp(prefix="wmrl-ar-"))
        self._inputs: dict[str, Path] = {}  # task id -> its public files (trusted; read-only to every run)
        self._written = 0

    def _task(self, i: int) -> ARTask:
        return self.episodes.tasks[i].payload

    def reset(self, tasks: Sequence[Task]) -> list[Any]:
        for task in (t.payload for t in tasks):
            if task.id not in self._inputs and self.pool.exposes(task.data_dir):
                raise ValueError(f"task {task.id!r}: its data directory {task.data_dir} (hidden labels) lies inside "
                                 "what the sandbox shows its programs read-only (/usr, /etc, the Python installation); "
                                 "move the task cache elsewhere (WMRL_CACHE_DIR)")
        return self.episodes.reset(tasks)

    def _inputs_of(self, task: ARTask) -> Path:
        """The task's public files, written once; written again if anything removed or changed them."""
        d = self._inputs.get(task.id)
        if d is not None and d.is_dir() and sorted(p.name for p in d.iterdir()) == sorted(task.public_files):
            return d
        if d is not None:
            log.warning("autoresearch env: the public files of task %r were damaged; writing them again", task.id)
            shutil.rmtree(d, ignore_errors=True)
        self._written += 1
        d = self.root / "inputs" / f"t{self._written:05d}"
        materialize(task, d)
        self._inputs[task.id] = d
        return d

    def _limits(self, task: ARTask) -> SandboxLimits:
        timeout = task.budget_s * self.timeout_scale
        return SandboxLimits(timeout_s=timeout, cpu_s=int(timeout * 2) + 1, memory_mb=self.memory_mb,
                             disk_mb=max(64, self.memory_mb // 4), max_result_bytes=submission_cap(task))

    def step(self, actions: Sequence[Any | None]) -> list[Transition | None]:
        return gather_steps(self.step_each(actions), len(actions))

    def step_each(self, actions: Sequence[Any | None]) -> Iterator[list[tuple[int, Transition]]]:
        """Replies without code and host-side failures first, then each program's turn as its run finishes."""
        now: list[tuple[int, Transition]] = []
        jobs, job_idx, replies = [], [], {}
        for i, reply in enumerate(actions):
            if reply is None:
                continue
            self.episodes.begin_turn(i)
            try:
                code = extract_code(reply)
                if code is None:
                    now.append((i, self._settled(i, reply, None, None)))
                else:
                    jobs.append(Job(code, self._inputs_of(self._task(i)), self._limits(self._task(i))))
                    job_idx.append(i)
                    replies[i] = (reply, code)
            except Exception as e:  # noqa: BLE001 - one episode's host-side failure costs that episode only
                now.append((i, self._unknown(i, reply, f"host-side error before the run: {type(e).__name__}: {e}")))
        if now:
            yield now
        for j, result in self._run(jobs):
            i = job_idx[j]
            yield [(i, self._settled(i, *replies[i], result))]

    def _run(self, jobs: list[Job]) -> Iterator[tuple[int, ExecResult]]:
        done: set[int] = set()
        try:
            for j, result in self.pool.run_each(jobs, outputs=[SUBMISSION_FILE]):
                done.add(j)
                yield j, result
        except Exception as e:  # noqa: BLE001 - a broken pool costs the grades still outstanding, not the run
            log.error("autoresearch env: the sandbox pool failed with %d of %d runs outstanding: %s: %s",
                      len(jobs) - len(done), len(jobs), type(e).__name__, e)
            failed = ExecResult("infra", None, "", "", 0.0, f"sandbox pool failed: {type(e).__name__}: {e}")
            for j in range(len(jobs)):
                if j not in done:
                    yield j, failed

    def _settled(self, i: int, reply: str, code: str | None, result: ExecResult | None) -> Transition:
        try:
            return self._transition(i, reply, code, result)
        except Exception as e:  # noqa: BLE001
            return self._unknown(i, reply, f"host-side error after the run: {type(e).__name__}: {e}")

    def _transition(self, i: int, reply: str, code: str | None, result: ExecResult | None) -> Transition:
        task = self._task(i)
        if code is None:
            status, score, reward, msg = "invalid", None, 0.0, "no ```python code block found in the reply"
        elif result.status == "infra":
            return self._unknown(i, reply, result.detail)
        elif result.status in _PROGRAM_FAILURES:
            status, score, reward = _PROGRAM_FAILURES[result.status], None, 0.0
            msg = result.detail or f"the program failed ({result.status})"
        else:
            g = grade_bytes(task, result.files.get(SUBMISSION_FILE), result.file_problems.get(SUBMISSION_FILE))
            status, score, reward, msg = g.status, g.score, g.reward, g.message
        shown = ("", "") if result is None else (result.stdout, result.stderr if status != "ok" else "")
        obs, final, _, done = self.episodes.end_turn(i, reply, report(status, score, msg, *shown), reward)
        info = {"status": status, "score": score, "turn_reward": reward}
        if result is not None and result.peak_memory_mb is not None:
            info["peak_memory_mb"] = round(result.peak_memory_mb, 1)
        if status != "ok":  # the line that says why, kept for diagnosis and for WMs that learn it
            # a program that ran but wrote a bad submission is invalid for the grader's reason, whatever its stderr
            crashed = result is not None and status != "invalid"
            info["error"] = defuse(((result.exception_line if crashed else "") or msg)[-300:])
        return Transition(obs, final, done, info=info)

    def _unknown(self, i: int, reply: str, detail: str) -> Transition:
        log.warning("autoresearch env: episode %d graded unknown: %s", i, detail)
        obs = self.episodes.end_unknown(i, reply, "status: sandbox failure (not your fault)")
        return Transition(obs, None, True, info={"status": "infra", "detail": detail[:500]})

    def close(self) -> None:
        shutil.rmtree(self.root / "inputs", ignore_errors=True)
        self.pool.close()
