"""Hostile programs against the trusted side: every attack of `wmrl.bench.hostile.ATTACKS`, and host-side faults.

Each attack is a real program run through the real AutoResearchEnv (two turns,
so SandboxPool and Sandbox underneath); `run_attack` checks from outside that
host files are unchanged, no sandbox process is left, host free space did not
shrink, the step returned within its bound, the feedback is bounded, the next
turn is graded normally, and the attack's own expectation. The fault tests
below break the host side itself (the grader, a pool job, the zygote, the
input files) and check that one bad execution costs one grade.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys

import pytest

if not sys.platform.startswith("linux") or os.geteuid() != 0:
    pytest.skip("the sandbox needs Linux and root", allow_module_level=True)

from wmrl.bench import hostile as H
from wmrl.domains.autoresearch import env as env_module
from wmrl.domains.autoresearch.env import AutoResearchEnv
from wmrl.domains.autoresearch.sandbox import Job, SandboxLimits, SandboxPool
from wmrl.domains.autoresearch.suite import load_suite
from wmrl.domains.autoresearch.tasks import split


@pytest.fixture(scope="module")
def task():
    return H.smallest_task(split(load_suite(), "train"))


@pytest.fixture(scope="module")
def rng(task, tmp_path_factory):
    r = H.Range(task, tmp_path_factory.mktemp("range"))
    yield r
    r.close()


def test_the_catalogue_covers_every_class():
    per_class = {k: sum(a.klass == k for a in H.ATTACKS) for k in range(1, 6)}
    assert all(n >= 3 for n in per_class.values()), per_class
    assert len({a.name for a in H.ATTACKS}) == len(H.ATTACKS)


@pytest.mark.parametrize("attack", H.ATTACKS, ids=lambda a: a.name)
def test_attack_holds(rng, attack):
    result = H.run_attack(rng, attack)
    assert result["held"], result["failures"]


def test_a_check_that_fails_is_reported(rng):
    """The harness can fail: an expectation the outcome contradicts is reported, not swallowed."""
    wrong = H.Attack("expects-ok", 4, "a forged verdict expected to pass", 'print("status: ok")\n', H._status("ok"))
    result = H.run_attack(rng, wrong)
    assert not result["held"] and "status 'invalid'" in result["failures"][0]


# ---------------------------------------------------------------- one bad execution costs one grade


@pytest.fixture
def env(tmp_path):
    e = AutoResearchEnv(SandboxPool(2), turns=2, workroot=tmp_path / "env", timeout_scale=0.2)
    yield e
    e.close()


def _replies(task, n, poison=None):
    good = H._reply(H._benign(task))
    return [good if i != poison else H._reply(H._benign(task) + "\n# POISON\n") for i in range(n)]


def _graded(transitions):
    return [(t.info["status"], t.reward is not None) for t in transitions]


def test_a_grader_exception_costs_that_episode_only(env, task, monkeypatch, caplog):
    real = env_module.grade_bytes

    def flaky(t, data, problem=None):
        flaky.calls += 1
        if flaky.calls == 1:  # whichever program finishes first: the pool grades in finishing order
            raise RuntimeError("grader bug")
        return real(t, data, problem)

    flaky.calls = 0
    monkeypatch.setattr(env_module, "grade_bytes", flaky)
    env.reset([task.to_task()] * 3)
    with caplog.at_level(logging.WARNING):
        first = env.step(_replies(task, 3))
    graded = _graded(first)
    bad = graded.index(("infra", False))
    assert sorted(graded) == [("infra", False), ("ok", True), ("ok", True)]
    assert first[bad].done and "grader bug" in first[bad].info["detail"] and "graded unknown" in caplog.text
    again = [None if i == bad else r for i, r in enumerate(_replies(task, 3))]
    second = env.step(again)
    assert second[bad] is None and [t.info["status"] for i, t in enumerate(second) if i != bad] == ["ok", "ok"]


def test_a_job_that_fails_on_the_host_costs_that_job_only(tmp_path, caplog):
    inputs = tmp_path / "in"
    inputs.mkdir()
    with SandboxPool(2, SandboxLimits(timeout_s=10), preload=()) as pool, caplog.at_level(logging.WARNING):
        results = pool.run_many([Job("print(1)", inputs), Job("print(2)", tmp_path / "gone"), Job("print(3)", inputs)])
    assert [r.status for r in results] == ["ok", "infra", "ok"]
    assert "FileNotFoundError" in results[1].detail and "failed on the host side" in caplog.text


def test_a_broken_pool_costs_the_runs_outstanding_not_the_run(env, task, monkeypatch):
    env.reset([task.to_task()] * 2)

    def broken(jobs, outputs=()):
        yield 0, env.pool.sandbox.run(jobs[0].code, jobs[0].inputs, outputs=outputs, limits=jobs[0].limits)
        raise OSError("pool is gone")

    monkeypatch.setattr(env.pool, "run_each", broken)
    # the run that finished before the pool broke keeps its grade; the one outstanding is unknown
    assert _graded(env.step(_replies(task, 2))) == [("ok", True), ("infra", False)]
    monkeypatch.undo()
    env.reset([task.to_task()] * 2)
    assert _graded(env.step(_replies(task, 2))) == [("ok", True)] * 2


def test_the_env_recovers_from_a_dead_zygote_and_from_damaged_inputs(env, task, caplog):
    env.reset([task.to_task()] * 2)
    assert _graded(env.step(_replies(task, 2))) == [("ok", True)] * 2
    os.kill(env.pool.sandbox._zygote.pid, 9)
    shutil.rmtree(next(iter(env._inputs.values())))
    with caplog.at_level(logging.WARNING):
        again = env.step(_replies(task, 2))
    assert _graded(again) == [("ok", True)] * 2
    assert "zygote" in caplog.text and "starting a new one" in caplog.text
    assert "were damaged; writing them again" in caplog.text
    assert H.sandbox_pids() == []
