"""Engine: DeepSpeed-backed updates must equal plain-torch AdamW, clip, and resume exactly."""

from __future__ import annotations

import copy
import pathlib

import deepspeed
import pytest
import torch

from wmrl.core.engine import Engine, EngineConfig, ensure_distributed

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning"),
]

STAGES = [0, 1, 2, 3]
LR = 1e-2
WD = 0.1


def make_mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def make_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)


def loss_fn(module: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], scale: float = 1.0) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.mse_loss(module(x), y) * scale


def weights(engine_or_module: Engine | torch.nn.Module) -> list[torch.Tensor]:
    """Full (gathered under ZeRO-3) copies of all parameters."""
    module = engine_or_module.module if isinstance(engine_or_module, Engine) else engine_or_module
    params = list(module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        return [p.detach().clone() for p in params]


def adam_state(engine: Engine) -> list[dict[str, torch.Tensor]]:
    """The torch AdamW state, whatever ZeRO wrapper (flattened partitions) sits on top."""
    opt = engine._ds.optimizer
    inner = getattr(opt, "optimizer", opt)  # ZeRO wraps the torch optimizer
    assert isinstance(inner, torch.optim.AdamW)
    return [{k: torch.as_tensor(v).clone() for k, v in s.items()} for s in inner.state.values()]


def flat(states: list[dict[str, torch.Tensor]], key: str) -> torch.Tensor:
    return torch.cat([s[key].reshape(-1) for s in states])


def manual_step(ref: torch.nn.Module, opt: torch.optim.Optimizer, batch, clip: float, scale: float = 1.0) -> float:
    opt.zero_grad(set_to_none=True)
    loss_fn(ref, batch, scale).backward()
    norm = float(torch.nn.utils.get_total_norm([p.grad for p in ref.parameters()]))
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
    opt.step()
    return norm


def manual_opt(ref: torch.nn.Module, cfg: EngineConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        ref.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), weight_decay=cfg.weight_decay
    )


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 1e-6) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, atol=atol, rtol=0)


@pytest.mark.parametrize("stage", STAGES)
def test_step_matches_manual_adamw(stage: int) -> None:
    cfg = EngineConfig(zero_stage=stage, lr=LR, weight_decay=WD, grad_clip=0.0)
    module = make_mlp(0)
    ref = copy.deepcopy(module)
    ref_opt = manual_opt(ref, cfg)
    engine = Engine(module, cfg)
    initial = weights(ref)
    for i in range(2):
        batch = make_batch(10 + i)
        with torch.no_grad():  # a sampling pass through the raw module, as policies do
            engine.module(batch[0])
        out = engine.step(loss_fn(engine.module, batch))
        norm = manual_step(ref, ref_opt, batch, clip=0.0)
        assert out["lr"] == pytest.approx(LR)
        assert out["grad_norm"] == pytest.approx(norm, rel=1e-5)
    got = weights(engine)
    assert all((g - w).abs().max() > 1e-4 for g, w in zip(got, initial)), "weights did not move"
    assert_same(got, weights(ref))


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_grad_clip(stage: int, clip: float) -> None:
    cfg = EngineConfig(zero_stage=stage, lr=LR, grad_clip=clip)
    module = make_mlp(1)
    ref = copy.deepcopy(module)
    ref_opt = manual_opt(ref, cfg)
    engine = Engine(module, cfg)
    batch = make_batch(3)
    out = engine.step(loss_fn(engine.module, batch, scale=1e4))
    raw_norm = manual_step(ref, ref_opt, batch, clip=clip, scale=1e4)
    assert raw_norm > 100.0
    assert out["grad_norm"] == pytest.approx(raw_norm, rel=1e-5)  # reported pre-clip
    # Adam's first update is ~lr*sign(g) whatever the scale, so check the first
    # moment: exp_avg = (1 - beta1) * g_used, and ZeRO's zero padding adds no norm.
    used = min(raw_norm, clip) if clip > 0 else raw_norm
    exp_avg_norm = float(flat(adam_state(engine), "exp_avg").norm())
    assert exp_avg_norm == pytest.approx((1 - cfg.adam_beta1) * used, rel=1e-4)
    assert_same(weights(engine), weights(ref))


@pytest.mark.parametrize("stage", STAGES)
def test_checkpoint_round_trip(stage: int, tmp_path: pathlib.Path) -> None:
    cfg = EngineConfig(zero_stage=stage, lr=LR, weight_decay=WD)
    engine = Engine(make_mlp(2), cfg)
    for i in range(3):
        engine.step(loss_fn(engine.module, make_batch(20 + i)))
    rng = torch.get_rng_state()
    client = {"step": 3, "rng": rng, "nested": {"a": [1, 2], "b": {"c": 1.5, "d": "x"}}}
    path = engine.save(tmp_path, "step_3", client)
    assert path == tmp_path / "step_3" and path.is_dir()
    assert Engine.latest_tag(tmp_path) == "step_3"

    fresh = Engine(make_mlp(99), cfg)
    assert not torch.equal(weights(fresh)[0], weights(engine)[0])
    loaded = fresh.load(tmp_path)
    assert loaded is not None
    assert set(loaded) == set(client)
    assert torch.equal(loaded["rng"], rng)
    assert loaded["step"] == 3 and loaded["nested"] == client["nested"]

    assert_same(weights(fresh), weights(engine), atol=0)
    want, got = adam_state(engine), adam_state(fresh)
    assert len(want) == len(got) > 0
    for w, g in zip(want, got):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(w[key], g[key]), key

    batch = make_batch(30)
    engine.step(loss_fn(engine.module, batch))
    fresh.step(loss_fn(fresh.module, batch))
    assert_same(weights(fresh), weights(engine), atol=0)


def test_load_empty_dir_and_latest_tag(tmp_path: pathlib.Path) -> None:
    engine = Engine(make_mlp(3), EngineConfig())
    assert engine.load(tmp_path) is None
    assert engine.load(tmp_path / "missing") is None
    assert Engine.latest_tag(tmp_path) is None
    with pytest.raises(FileNotFoundError):
        engine.load(tmp_path, tag="nope")

    w_a = weights(engine)
    engine.save(tmp_path, "a", {"k": "a"})
    engine.step(loss_fn(engine.module, make_batch(4)))
    w_b = weights(engine)
    engine.save(tmp_path, "b", {"k": "b"})
    assert Engine.latest_tag(tmp_path) == "b"
    engine.save(tmp_path, "a", {"k": "a2"})  # overwrite an existing tag
    assert Engine.latest_tag(tmp_path) == "a"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")], "staging left behind"

    assert engine.load(tmp_path, tag="a") == {"k": "a2"}
    assert_same(weights(engine), w_b, atol=0)
    assert engine.load(tmp_path, tag="b") == {"k": "b"}
    del w_a


def test_crash_mid_save_keeps_previous_latest(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(make_mlp(4), EngineConfig())
    engine.save(tmp_path, "good", {"k": 1})
    w_good = weights(engine)
    engine.step(loss_fn(engine.module, make_batch(5)))

    # 1) crash after DeepSpeed wrote its files, before the swap
    real_save = engine._ds.save_checkpoint

    def save_then_die(*args, **kwargs):
        real_save(*args, **kwargs)
        raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(engine._ds, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        engine.save(tmp_path, "new", {"k": 2})
    monkeypatch.undo()
    assert Engine.latest_tag(tmp_path) == "good"
    assert not (tmp_path / "new").exists()

    # 2) crash while overwriting the tag `latest` points to, mid directory swap
    real_rename = pathlib.Path.rename

    def rename_dies_on_staging(self, target):
        if self.name.endswith(".tmp"):
            raise KeyboardInterrupt("simulated crash")
        return real_rename(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", rename_dies_on_staging)
    with pytest.raises(KeyboardInterrupt):
        engine.save(tmp_path, "good", {"k": 3})
    monkeypatch.undo()
    assert not (tmp_path / "good").exists()  # the crash really hit the window
    assert Engine.latest_tag(tmp_path) == "good"

    fresh = Engine(make_mlp(5), EngineConfig())
    assert fresh.load(tmp_path) == {"k": 1}
    assert_same(weights(fresh), w_good, atol=0)

    # a later successful save cleans up and is what gets loaded
    engine.save(tmp_path, "good", {"k": 4})
    assert fresh.load(tmp_path) == {"k": 4}
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("bad", [4, -1, "1", True, 1.0])
def test_bad_zero_stage(bad) -> None:
    with pytest.raises(ValueError, match=r"engine\.zero_stage"):
        EngineConfig(zero_stage=bad).validate()


@pytest.mark.parametrize("key,value", [("lr", 0.0), ("lr", -1.0), ("grad_clip", -1.0), ("adam_beta1", 1.0)])
def test_bad_config_names_key(key: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"engine\.{key}"):
        EngineConfig(**{key: value}).validate()


@pytest.mark.parametrize("stage", [0, 3])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_loss_raises_and_keeps_weights(stage: int, bad: float) -> None:
    cfg = EngineConfig(zero_stage=stage, lr=LR)
    module = make_mlp(6)
    ref = copy.deepcopy(module)
    ref_opt = manual_opt(ref, cfg)
    engine = Engine(module, cfg)
    before = weights(engine)
    batch = make_batch(7)
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        engine.step(loss_fn(engine.module, batch) * bad)
    assert_same(weights(engine), before, atol=0)
    # nothing leaked into the next update (no half-accumulated grads, no optimizer step)
    engine.step(loss_fn(engine.module, batch))
    manual_step(ref, ref_opt, batch, clip=cfg.grad_clip)
    assert_same(weights(engine), weights(ref))


def test_only_trainable_params_are_optimised() -> None:
    module = make_mlp(8)
    module[0].weight.requires_grad_(False)
    frozen = module[0].weight.detach().clone()
    engine = Engine(module, EngineConfig(lr=LR))
    engine.step(loss_fn(engine.module, make_batch(9)))
    assert torch.equal(weights(engine)[0], frozen)
    assert sum(s["exp_avg"].numel() for s in adam_state(engine)) == sum(
        p.numel() for p in module.parameters() if p.requires_grad
    )


def test_ensure_distributed_idempotent() -> None:
    ensure_distributed()
    ensure_distributed()
    assert torch.distributed.is_initialized()
    assert torch.distributed.get_world_size() >= 1


def shares(module: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], size: int, bad_at: int | None = None):
    """The batch's mean-squared error as micro-batch shares that add up to `loss_fn`."""
    x, y = batch
    n = len(x)

    def share(i: int) -> torch.Tensor:
        part = torch.nn.functional.mse_loss(module(x[i : i + size]), y[i : i + size], reduction="sum") / y.numel()
        return part * float("nan") if bad_at == i else part

    return [lambda i=i: share(i) for i in range(0, n, size)]


@pytest.mark.parametrize("stage", STAGES)
def test_micro_batched_step_equals_whole_batch(stage: int) -> None:
    cfg = EngineConfig(zero_stage=stage, lr=LR, weight_decay=WD, grad_clip=1.0)
    module = make_mlp(11)
    ref = copy.deepcopy(module)
    ref_opt = manual_opt(ref, cfg)
    engine = Engine(module, cfg)
    for i in range(3):
        batch = make_batch(20 + i)
        expected = float(loss_fn(ref, batch).detach())
        out = engine.step(shares(engine.module, batch, size=4))  # shares of 4 and 2 rows
        norm = manual_step(ref, ref_opt, batch, clip=cfg.grad_clip)
        assert out["loss"] == pytest.approx(expected, rel=1e-5)
        assert out["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert_same(weights(engine), weights(ref))


@pytest.mark.parametrize("stage", STAGES)
def test_nonfinite_share_drops_accumulated_gradients(stage: int) -> None:
    cfg = EngineConfig(zero_stage=stage, lr=LR)
    module = make_mlp(12)
    ref = copy.deepcopy(module)
    ref_opt = manual_opt(ref, cfg)
    engine = Engine(module, cfg)
    before = weights(engine)
    batch = make_batch(30)
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        engine.step(shares(engine.module, batch, size=2, bad_at=4))  # the third share, after two backwards
    assert_same(weights(engine), before, atol=0)
    engine.step(shares(engine.module, batch, size=3))
    manual_step(ref, ref_opt, batch, clip=cfg.grad_clip)
    assert_same(weights(engine), weights(ref))


def test_param_groups_train_at_their_own_rate() -> None:
    from wmrl.core.engine import ParamGroup

    cfg = EngineConfig(lr=LR, grad_clip=0.0)
    module = make_mlp(13)
    ref = copy.deepcopy(module)
    slow, fast = list(module[0].parameters()), list(module[2].parameters())
    engine = Engine(module, cfg, [ParamGroup(slow, lr_scale=0.1)])
    ref_opt = torch.optim.AdamW(
        [{"params": list(ref[0].parameters()), "lr": LR * 0.1}, {"params": list(ref[2].parameters())}],
        lr=LR, betas=(cfg.adam_beta1, cfg.adam_beta2), weight_decay=cfg.weight_decay,
    )
    batch = make_batch(40)
    out = engine.step(loss_fn(engine.module, batch))
    manual_step(ref, ref_opt, batch, clip=0.0)
    assert out["lr"] == pytest.approx(LR * 0.1)
    assert_same(weights(engine), weights(ref))
    assert len(fast) == 2
    with pytest.raises(ValueError, match="lr_scale"):
        Engine(make_mlp(14), cfg, [ParamGroup(list(make_mlp(14).parameters()), lr_scale=0.0)])
    dup = make_mlp(15)
    with pytest.raises(ValueError, match="repeats a parameter"):
        Engine(dup, cfg, [ParamGroup(list(dup[0].parameters())), ParamGroup(list(dup[0].parameters()))])
