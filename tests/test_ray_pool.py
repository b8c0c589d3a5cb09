"""`executor: ray`: sandbox slots as Ray actors give the local pool's results; a slot that dies is an unknown grade.

A local Ray instance (`ray.init` on loopback, no network beyond it), real
sandboxes inside the actors. One pool per module: Ray's start-up and the
zygotes' imports are paid once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

if not sys.platform.startswith("linux") or os.geteuid() != 0:
    pytest.skip("the sandbox needs Linux and root", allow_module_level=True)

from wmrl.bench import hostile as H
from wmrl.domains.autoresearch.env import AutoResearchEnv
from wmrl.domains.autoresearch.ray_pool import RaySandboxPool
from wmrl.domains.autoresearch.sandbox import Job, SandboxLimits, SandboxPool
from wmrl.domains.autoresearch.suite import load_suite
from wmrl.domains.autoresearch.tasks import split

QUICK = SandboxLimits(timeout_s=2.0, cpu_s=10)


@pytest.fixture(scope="module")
def ray_pool():
    pool = RaySandboxPool(2, QUICK)
    yield pool
    pool.close()


def _jobs(inputs) -> list[Job]:
    return [
        Job("print(open('data.csv').read().upper())\nopen('submission.csv', 'w').write('id,y\\n1,2\\n')", inputs),
        Job("import numpy as np\nprint(np.random.default_rng(3).integers(0, 100, 5).tolist())"),
        Job("raise ValueError('bad model')"),
        Job("while True: pass"),  # past its budget
        Job("import sys\nsys.stdout.write('x' * 10)\nsys.exit(3)"),
    ]


def _seen(results) -> list[tuple]:
    return [(r.status, r.returncode, r.stdout, r.files, r.stderr.strip().splitlines()[-1:]) for r in results]


def test_the_ray_pool_gives_the_local_pools_results(ray_pool, tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "data.csv").write_text("a,b\n1,2\n")
    with SandboxPool(2, QUICK) as local:
        expected = _seen(local.run_many(_jobs(inputs), outputs=["submission.csv"]))
    got = _seen(ray_pool.run_many(_jobs(inputs), outputs=["submission.csv"]))
    assert got == expected
    assert [s for s, *_ in got] == ["ok", "ok", "error", "timeout", "error"]
    assert got[0][2] == "A,B\n1,2\n\n" and got[0][3] == {"submission.csv": b"id,y\n1,2\n"}
    (inputs / "data.csv").write_text("changed\n")  # new contents reach the actors, not their cached copy
    os.utime(inputs, (time.time() + 5, time.time() + 5))
    assert ray_pool.run_many(_jobs(inputs)[:1])[0].stdout == "CHANGED\n\n"


def test_a_slot_killed_mid_execution_is_one_unknown_grade_and_a_fresh_actor_takes_its_place(ray_pool):
    assert [r.status for r in ray_pool.run_many([Job("print(1)")] * 2)] == ["ok"] * 2  # both zygotes up
    pids = ray_pool.actor_pids()  # in slot order: a batch's first call goes to slot 0
    replaced = ray_pool.replaced
    jobs = [Job("import time\ntime.sleep(30)"), Job("print('fine')"), Job("print('fine')")]
    killer = threading.Timer(1.0, os.kill, (pids[0], signal.SIGKILL))
    started = time.time()
    killer.start()
    results = dict(ray_pool.run_each(jobs))
    killer.join()
    assert results[0].status == "infra" and "sandbox slot (a Ray actor) died" in results[0].detail
    assert [results[1].stdout, results[2].stdout] == ["fine\n", "fine\n"]
    assert time.time() - started < 20  # the dead slot's sleep(30) was not waited for
    assert ray_pool.replaced == replaced + 1
    after = ray_pool.actor_pids()
    assert after[1] == pids[1] and after[0] not in pids  # slot 0 has a fresh actor, slot 1 kept its own
    assert [r.status for r in ray_pool.run_many([Job("print(1)")] * 4)] == ["ok"] * 4
    deadline = time.time() + 10
    while H.sandbox_pids() and time.time() < deadline:  # the dead actor's program does not outlive it
        time.sleep(0.2)
    assert H.sandbox_pids() == []


def test_a_call_past_its_deadline_fails_and_its_slot_gets_a_fresh_actor(ray_pool):
    """A node that never answers looks like a call that never returns: the deadline ends it."""
    pids, replaced = ray_pool.actor_pids(), ray_pool.replaced
    calls = [("import time\ntime.sleep(30)", None, (), SandboxLimits(timeout_s=60.0, cpu_s=120)),
             ("print('quick')", None, (), None)]
    started = time.time()
    out = dict(ray_pool._slots.run_each("run", calls, lambda i, why, died: ("failed", str(why), died), [2.0, 30.0]))
    assert out[0] == ("failed", "sandbox slot 0 did not return call 0 by its deadline", True)
    assert out[1].stdout == "quick\n"
    assert time.time() - started < 15
    assert ray_pool.replaced == replaced + 1 and ray_pool.actor_pids()[0] not in pids


def test_autoresearch_env_grades_the_same_on_either_executor(ray_pool, tmp_path):
    task = H.smallest_task(split(load_suite(), "train"))
    replies = [H._reply(H._benign(task)), "no code here", H._reply("raise SystemExit(2)"), H._reply("print(1)")]
    graded = []
    for name, pool in (("local", SandboxPool(2)), ("ray", ray_pool)):
        env = AutoResearchEnv(pool, workroot=tmp_path / name)
        env.reset([task.to_task()] * len(replies))
        graded.append([(t.reward, t.info["status"], t.done) for t in env.step(replies)])
        if name == "local":
            env.close()
    assert graded[0] == graded[1]
    assert graded[1][0][1] == "ok" and graded[1][0][0] > 0


def test_a_training_run_on_ray_stores_what_the_same_run_on_the_local_pool_stores(suite_agent, tmp_path):
    """`wmrl train autoresearch domain.executor=ray`, end to end: same executions, pairs, metrics and weights."""
    from test_durability import assert_same_run, fingerprint, train_with_kills

    def args(run_dir, executor):
        return ["train", "autoresearch", f"run_dir={run_dir}", f"domain.agent={suite_agent}", "domain.sandbox_slots=2",
                f"domain.executor={executor}", "trainer.steps=2", "trainer.eval_every=2", "trainer.eval_samples=1",
                "trainer.eval_splits=[test_id]", "trainer.groups_per_step=2", "trainer.group_size=2",
                "anchors.fraction=0.5", "tensorboard=false", "--no-progress", "--no-report"]

    train_with_kills([], args(tmp_path / "local", "local"))
    train_with_kills([], args(tmp_path / "ray", "ray"))
    # read back through the local pool: this process's Ray (the module's pool) has no CPU left for more slots
    local, ray = fingerprint(tmp_path / "local"), fingerprint(tmp_path / "ray", ("domain.executor=local",))
    assert len(local["executions"]) >= 8
    assert_same_run(local, ray)


def test_a_slot_that_cannot_be_built_fails_the_pool_with_its_reason(ray_pool):
    """Not an endless replace-and-fail loop whose every call would be an unknown grade."""
    from wmrl.core.ray_slots import RaySlots
    from wmrl.domains.autoresearch.ray_pool import SandboxSlot

    with pytest.raises(RuntimeError, match=r"a sandbox slot \(Ray actor\) could not start: .*no_such_option"):
        # num_cpus=0: the module's pool holds this Ray's CPUs
        RaySlots(SandboxSlot, 1, args=(QUICK, {"no_such_option": 1}), name="sandbox slot", num_cpus=0)
