"""Multi-rank DeepSpeed: `wmrl train ... engine.world_size=2` (2 ranks on gloo) takes the update one rank takes.

Rank 0 collects and writes; both ranks update on their block of the step's
turns. The tolerance, and why: the two runs sum the same gradient in a
different order (two halves all-reduced instead of one backward), so they agree
to float32 rounding, and Adam's first steps turn a rounding-level gradient of
either sign into a full step of +-lr on that weight. At lr 1e-5 over three
steps that keeps every weight within 1e-5 and every sampled action within
rounding of the single-rank run's; at the default lr the runs drift apart
exactly as two single-rank runs with reordered sums would. The gradient norm
(pre-clip, global) is the sharp check: a rank's block left out, or shares not
scaled by the world size, changes it. Under ZeRO-3 the leader rolls out a full
replica that every update re-syncs from the shards: a replica left behind would
sample other actions from step 2 on.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_durability import _env, assert_same_run, fingerprint

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

WMRL = [sys.executable, "-m", "wmrl.cli"]


def _args(run_dir: Path, *extra: str, steps: int = 3, every: int = 3) -> list[str]:
    return ["train", "synthetic-program", f"run_dir={run_dir}", f"trainer.steps={steps}", "trainer.checkpoint_every=1",
            f"trainer.eval_every={every}", "trainer.eval_samples=2", "trainer.groups_per_step=4", "trainer.group_size=4",
            "anchors.fraction=0.5", "engine.lr=1e-5", "tensorboard=false", *extra, "--no-progress", "--no-report"]


def _train(args: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(WMRL + args, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _close(a: float | None, b: float | None, tol: float) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_two_ranks_update_as_one_rank_does_and_only_rank_0_writes(tmp_path, zero):
    one, two = tmp_path / "one", tmp_path / "two"
    _train(_args(one, f"engine.zero_stage={zero}"))
    out = _train(_args(two, f"engine.zero_stage={zero}", "engine.world_size=2")).stdout
    assert sum(line.startswith('{"run_dir"') for line in out.splitlines()) == 1  # the leader alone reports
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    if zero > 0:  # DeepSpeed wrote both ranks' optimizer shards
        assert len(list((two / "checkpoints" / "step000003").rglob("*zero_pp_rank_1_*optim_states.pt"))) == 1
    a, b = fingerprint(one), fingerprint(two)  # the 2-rank checkpoint read in one process (ZeRO-3: shards merged)
    assert all(w.numel() for w in b["weights"])
    assert a["pairs"] == b["pairs"]
    assert b["executions"].keys() == a["executions"].keys()
    step1 = [k for k in a["executions"] if k.startswith(("s1g", "eval/0/"))]
    assert step1 and all(a["executions"][k] == b["executions"][k] for k in step1)  # before any update: identical
    assert all(_close(a["executions"][k][4], b["executions"][k][4], 1e-5) for k in a["executions"])
    for ma, mb in zip(a["metrics"], b["metrics"], strict=True):
        assert _close(ma["grad_norm"], mb["grad_norm"], 1e-5), (ma["step"], ma["grad_norm"], mb["grad_norm"])
        assert _close(ma["loss"], mb["loss"], 1e-6)
        assert ma["trained_trajectories"] == mb["trained_trajectories"]
    assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a["weights"], b["weights"], strict=True))
    assert [r["step"] for r in b["history"]] == [0, 3]
    assert all(_close(ra[k], rb[k], 1e-5) for ra, rb in zip(a["history"], b["history"]) for k in ra
               if k.startswith("eval_"))


@pytest.mark.parametrize("zero", [2, 3])
def test_a_two_rank_run_resumes_across_ranks_exactly(tmp_path, zero):
    """Stopped after step 2 (its last then), resumed to step 4: ZeRO shards of both ranks reloaded."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    two = ("engine.world_size=2", f"engine.zero_stage={zero}")
    _train(_args(straight, *two, steps=4, every=2))
    _train(_args(resumed, *two, steps=2, every=2))
    _train(_args(resumed, *two, steps=4, every=2))  # trainer.steps raised: trains on from checkpoint 2
    assert_same_run(fingerprint(straight), fingerprint(resumed))


def test_a_mismatched_launcher_is_a_one_line_error(tmp_path):
    env = {**_env(), "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(29_000 + os.getpid() % 1000)}
    done = subprocess.run(WMRL + _args(tmp_path / "mismatch", "engine.world_size=2"), env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "engine.world_size is 2 but this process is one of 1 ranks" in done.stderr.strip().splitlines()[-1]
    assert not json.dumps(done.stdout).count('"run_dir"')
