"""docs/new_domain.md must stay true: run its python blocks in order and check what they claim.

The blocks run once per module, in one namespace that behaves like a user's own
module (so the classes they define pickle), with the cwd in a temporary folder,
`tempfile.mkdtemp` redirected under it and one CPU thread. The domain they
register is removed from the registry again afterwards, and the distributed
env vars the engine sets are put back.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest
import torch

import wmrl
from wmrl.core.anchors import AnchorConfig, AnchorScheduler
from wmrl.core.registry import DOMAINS, WORLD_MODELS
from wmrl.core.types import Outcome, Task, Trajectory
from wmrl.registry import load_builtin_domains

DOC = Path(__file__).resolve().parents[1] / "docs" / "new_domain.md"
#: what `ensure_distributed` writes into os.environ; restored so that subprocesses
#: started by later tests do not inherit a MASTER_PORT this process is listening on
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def python_blocks(text: str) -> list[str]:
    return [m.group(1) for m in BLOCK.finditer(text)]


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    """Execute the doc's blocks once; yield (namespace, tmp dir, seconds taken)."""
    text = DOC.read_text()
    blocks = python_blocks(text)
    assert len(blocks) >= 5, f"expected the worked example's python blocks in {DOC}, found {len(blocks)}"
    tmp = tmp_path_factory.mktemp("new_domain_doc")
    load_builtin_domains()  # before the registry is copied: built-ins must survive the restore
    module = types.ModuleType("wmrl_doc_new_domain")
    threads = torch.get_num_threads()
    dist_env = {k: os.environ.get(k) for k in DIST_VARS}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.chdir(tmp)
        mp.setattr(tempfile, "tempdir", str(tmp))
        mp.setattr(DOMAINS, "_entries", dict(DOMAINS._entries))
        mp.setattr(WORLD_MODELS, "_entries", dict(WORLD_MODELS._entries))
        mp.setitem(sys.modules, module.__name__, module)
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        try:
            for i, src in enumerate(blocks):
                try:
                    exec(compile(src, f"{DOC.name}[block {i + 1}]", "exec"), module.__dict__)
                except Exception as exc:
                    raise AssertionError(f"python block {i + 1} of {DOC.name} failed: {exc!r}\n{src}") from exc
            elapsed = time.perf_counter() - t0
            yield module.__dict__, tmp, elapsed, text, blocks
        finally:
            torch.set_num_threads(threads)
            for k, v in dist_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _metrics(res) -> list[dict]:
    path = Path(res.run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _summary(res) -> dict:
    return json.loads((Path(res.run_dir) / "summary.json").read_text())


def test_domain_is_registered_with_its_config(doc):
    ns, *_ = doc
    assert "knob" in DOMAINS
    cls = DOMAINS.get("knob")
    assert cls is ns["KnobDomain"] and issubclass(cls, wmrl.Domain)
    assert cls.config_class is ns["KnobConfig"]
    assert ns["KnobConfig"]().name == "knob", "the config's name must default to the registered name"
    for name, base in (("KnobRig", wmrl.RealEnv), ("KnobSimulator", wmrl.WorldModel), ("KnobPolicy", wmrl.Policy)):
        assert issubclass(ns[name], base), f"{name} should subclass {base.__name__}"
    domain = cls(ns["KnobConfig"]())
    for split in ("train", "test_id", "test_ood"):
        assert domain.tasks(split), f"split {split} is empty"
        assert [t.id for t in domain.tasks(split)] == [t.id for t in domain.tasks(split)]


def test_example_components_keep_the_contract(doc):
    ns, *_ = doc
    cfg = ns["KnobConfig"](real_delay_s=0.0)
    tasks = ns["KnobDomain"](cfg).tasks("test_id")[:3]

    rig = ns["KnobRig"](cfg)
    assert rig.capacity == cfg.real_capacity
    assert len(rig.reset(tasks)) == 3
    out = rig.step([0, None, 5])
    assert len(out) == 3 and out[1] is None, "step must return None where the action was None"
    for tr in (out[0], out[2]):
        assert tr.done and (tr.reward is None or 0.0 <= tr.reward <= 1.0)

    broken = ns["KnobRig"](ns["KnobConfig"](real_delay_s=0.0, real_fail_rate=1.0))
    broken.reset(tasks[:1])
    (tr,) = broken.step([3])
    assert tr.reward is None and tr.info["status"] == "infra"
    traj = Trajectory(task=tasks[0], actions=[3], step_rewards=[tr.reward], infos=[tr.info], source="real")
    verdict = broken.outcome(traj)
    assert isinstance(verdict, Outcome) and verdict.reward is None and verdict.status == "infra"

    # the simulator is deliberately wrong: noisy with a reported variance, and biased upwards
    sim = ns["KnobSimulator"](cfg, ns["SimulatorConfig"]())
    sim.reset(tasks)
    out = sim.step([cfg.n_settings - 1, None, 0])
    assert out[1] is None
    assert all(t.reward_var is not None and t.reward_var > 0 for t in (out[0], out[2]))
    task = Task("probe", "test_id", tasks[0].payload)
    settings = list(range(cfg.n_settings))
    noiseless = ns["KnobSimulator"](cfg, ns["SimulatorConfig"](noise=0.0, noise_edge=0.0))
    noiseless.reset([task] * len(settings))
    wm_best = max(settings, key=lambda a: noiseless.step([a if i == a else None for i in settings])[a].reward)
    true_best = max(settings, key=lambda a: ns["closeness"](a, ns["best_setting"](cfg, task.payload)))
    assert wm_best > true_best, "the example's world model should overrate higher settings"

    # policy: batched, log-probs consistent with act, differentiable
    policy = ns["KnobPolicy"](cfg, 0)
    obs = [t.payload for t in tasks]
    with torch.no_grad():
        actions, lps = policy.act(obs, generator=torch.Generator().manual_seed(0))
    assert len(actions) == 3 and all(0 <= a < cfg.n_settings for a in actions)
    lp = policy.log_prob(obs, actions)
    assert lp.shape == (3,) and lp.requires_grad
    assert torch.allclose(lp.detach(), torch.tensor(lps), atol=1e-5)


def test_training_ran_the_configured_steps(doc):
    ns, tmp, *_ = doc
    res = ns["result"]
    assert isinstance(res, wmrl.TrainResult)
    steps = res.config.trainer.steps
    assert res.config.domain.name == "knob" and res.config.estimator.mode == "wmrl"
    assert res.config.tensorboard is False
    assert Path(res.run_dir).resolve().is_relative_to(tmp.resolve()), "run_dir should be a temp dir"
    rows = _metrics(res)
    assert len(rows) == steps and [r["step"] for r in rows] == list(range(1, steps + 1))
    assert (Path(res.run_dir) / "config.yaml").exists()
    assert not (Path(res.run_dir) / "tb").exists()


def test_wmrl_machinery_was_active(doc):
    ns, *_ = doc
    res = ns["result"]
    rows = _metrics(res)
    assert all(r["anchor_fraction"] == pytest.approx(0.25) for r in rows)
    assert all(r["real_executions"] > 0 for r in rows), "every step should execute its anchor groups"
    assert rows[-1]["calibrated"] == 1.0, "the debiasing map should be fitted by the end of the run"
    assert rows[-1]["anchor_weight"] > 1.0, "the denoiser should weight anchors by the end of the run"
    assert all(r["reward_oracle"] is not None and 0.0 <= r["reward_oracle"] <= 1.0 for r in rows)
    summary = _summary(res)
    assert summary["domain"] == "knob" and summary["steps"] == res.config.trainer.steps
    assert summary["anchor_pairs"] > 0
    assert ns["summary"]["real_executions"] == summary["real_executions"]


def test_held_out_evaluations_exist_and_are_real(doc):
    ns, *_ = doc
    res = ns["result"]
    cfg = res.config.trainer
    expected = [0] + [s for s in range(1, cfg.steps + 1) if s % cfg.eval_every == 0 or s == cfg.steps]
    assert [row["step"] for row in res.history] == expected
    for row in res.history:
        for split in ("test_id", "test_ood"):
            v = row[f"eval_{split}"]
            assert not math.isnan(v) and 0.0 <= v <= 1.0, f"eval_{split} at step {row['step']} is {v}"
    assert res.final["step"] == cfg.steps
    rows = _metrics(res)
    assert rows[-1]["eval_test_id"] == pytest.approx(res.final["eval_test_id"])


def test_what_the_doc_says_about_the_baselines(doc):
    ns, *_ = doc
    runs = ns["runs"]
    assert set(runs) == {"real", "wm", "wmrl"}
    execs = {mode: _summary(res)["real_executions"] for mode, res in runs.items()}
    final = {mode: res.final["eval_test_id"] for mode, res in runs.items()}
    first = {mode: res.history[0]["eval_test_id"] for mode, res in runs.items()}
    assert len(set(first.values())) == 1, "all three runs start from the same policy"
    assert execs["wm"] < execs["wmrl"] < execs["real"]
    assert execs["wmrl"] <= execs["real"] / 2
    for mode, res in runs.items():
        assert len(_metrics(res)) == res.config.trainer.steps
        assert not math.isnan(final[mode])
    # the doc's story: WMRL learns, the WM-only run is held back by the simulator's bias
    assert final["wmrl"] > first["wmrl"] + 0.1, final
    assert final["wmrl"] > final["wm"] + 0.1, final


def test_yaml_config_and_typo(doc):
    ns, tmp, *_ = doc
    assert (tmp / "knob.yaml").exists()
    cfg = ns["cfg"]
    assert isinstance(cfg, wmrl.RunConfig)
    assert isinstance(cfg.domain, ns["KnobConfig"])
    assert isinstance(cfg.world_model, ns["SimulatorConfig"]) and cfg.world_model.offset == 2.0
    assert cfg.trainer.steps == 10 and cfg.tensorboard is False
    assert "n_setting" in ns["typo_error"]


def test_doc_covers_the_contract_and_runs_fast(doc):
    _, _, elapsed, text, _ = doc
    for term in ("reset(tasks)", "None", "[0, 1]", "reward_var", "capacity", "max_turns", "oracle_reward",
                 "Prediction", "Transition", "register_domain", "estimator.mode", "metrics.jsonl", "result.history"):
        assert term in text, f"{DOC.name} should mention {term}"
    # generous bound: the example is sized to take a few seconds (plus a one-off DeepSpeed build)
    assert elapsed < 120, f"the doc's examples took {elapsed:.0f}s; keep them tiny"


def test_what_the_doc_says_about_capacity_and_registration(doc):
    ns, _, _, _, blocks = doc
    # capacity sets how long a real batch takes, not how many anchors: one slot, the same anchor fraction
    assert AnchorScheduler(AnchorConfig(fraction=0.25), 0.25).count(8) == 2
    res = wmrl.train({"domain": {"name": "knob", "real_capacity": 1}, "anchors": {"fraction": 0.25},
                      "trainer": {"steps": 2, "eval_every": 0, "eval_samples": 1, "groups_per_step": 8},
                      "tensorboard": False, "run_dir": tempfile.mkdtemp(prefix="wmrl-knob-capacity-")})
    assert all(r["anchor_fraction"] == pytest.approx(0.25) for r in _metrics(res))
    # running the registration cell again replaces the same definition ...
    cell = next(b for b in blocks if '@wmrl.register_domain("knob")' in b)
    exec(compile(cell, "rerun", "exec"), ns)
    assert DOMAINS.get("knob") is ns["KnobDomain"]
    # ... a different class under a taken name is refused, with the name of the one registered
    with pytest.raises(ValueError, match="domain 'knob' is already registered to"):
        wmrl.register_domain("knob")(type("OtherKnob", (ns["KnobDomain"],), {}))
    # and the world model it registers serves the knob domain only
    with pytest.raises(wmrl.ConfigError, match="'knob-simulator' serves knob, not 'synthetic-program'"):
        wmrl.load_config(None, ["world_model.type=knob-simulator"])
