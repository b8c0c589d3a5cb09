"""The optimisation engine: every policy update goes through DeepSpeed.

Why DeepSpeed even on a laptop: the same code path then scales from the default
(one CPU process, gloo, ZeRO stage from the config) to multi-node ZeRO-3 on GPUs
without a second implementation to keep in sync.

Division of labour: the trainer computes the loss; the :class:`Engine` owns
backward, gradient clipping, the optimizer step and checkpoints.  Checkpoints
carry the run's own state (step counter, RNG states, estimator state, ...) as a
``client_state`` dict next to weights and optimizer state, so a resume is exact.

Forward passes go through :attr:`Engine.module` directly (policies call their
own module for sampling and log-probs).  This is correct for ZeRO 0-3: ZeRO-3
installs its gather/release hooks on the module itself, not in
``DeepSpeedEngine.forward``.  Two ZeRO-3 consequences for callers:

* outside a forward pass the parameters are partitioned (``p.numel() == 0``);
  to read or export full weights wrap the access in
  ``deepspeed.zero.GatheredParameters(list(engine.module.parameters()))``;
* with ``bf16=True`` the module's parameters are bf16 at every stage, so the
  caller feeds bf16 floating inputs.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from wmrl.core.validation import validate_config

__all__ = ["EngineConfig", "Engine", "ParamGroup", "ensure_distributed"]

log = logging.getLogger(__name__)

# DeepSpeed merges client_state into its own checkpoint dict (and returns its own
# keys, e.g. ``ds_config``, on load), so user keys could collide with or be
# polluted by DeepSpeed's.  Everything of ours lives under this single key.
_CLIENT_KEY = "wmrl_client_state"
_LATEST = "latest"

#: DeepSpeed's ZeRO-3 on torch>=2.13 calls a deprecated collective on every step; silenced around our calls only
_DEPRECATED_COLLECTIVE = r".*reduce_scatter_tensor.*deprecated"


@dataclass
class EngineConfig:
    zero_stage: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    grad_clip: float = 1.0  # max global grad L2 norm; 0 disables clipping
    bf16: bool = False

    def validate(self) -> None:
        if isinstance(self.zero_stage, bool) or not isinstance(self.zero_stage, int) or not 0 <= self.zero_stage <= 3:
            raise ValueError(f"engine.zero_stage must be an integer in 0..3, got {self.zero_stage!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"engine.lr must be a finite number > 0, got {self.lr!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"engine.weight_decay must be >= 0, got {self.weight_decay!r}")
        for key in ("adam_beta1", "adam_beta2"):
            value = getattr(self, key)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"engine.{key} must be in [0, 1), got {value!r}")
        if not (math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            raise ValueError(f"engine.grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip!r}")
        if not isinstance(self.bf16, bool):
            raise ValueError(f"engine.bf16 must be a bool, got {self.bf16!r}")


@dataclass
class ParamGroup:
    """Parameters that train at ``lr_scale`` times the engine's learning rate (e.g. a vision backbone)."""

    params: list[torch.nn.Parameter]
    lr_scale: float = 1.0


def _optimizer_groups(
    params: list[torch.nn.Parameter], groups: Sequence[ParamGroup] | None, lr: float
) -> list[dict[str, Any]]:
    """Torch optimizer groups; trainable parameters no group names train at the base rate."""
    if not groups:
        return [{"params": params}]
    trainable = {id(p) for p in params}
    seen: set[int] = set()
    out = []
    for i, g in enumerate(groups):
        if not (math.isfinite(g.lr_scale) and g.lr_scale > 0):
            raise ValueError(f"param group {i}: lr_scale must be a finite number > 0, got {g.lr_scale!r}")
        mine = [p for p in g.params if id(p) in trainable]
        if any(id(p) in seen for p in mine):
            raise ValueError(f"param group {i} repeats a parameter of an earlier group; each belongs to one")
        seen.update(id(p) for p in mine)
        if mine:
            out.append({"params": mine, "lr": lr * g.lr_scale})
    rest = [p for p in params if id(p) not in seen]
    if rest:
        out.append({"params": rest})
    return out


def _checked_loss(loss: torch.Tensor) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError("Engine.step expects a scalar loss tensor")
    if not loss.requires_grad:
        raise ValueError("Engine.step: loss does not require grad (was it computed under no_grad?)")
    return _check_finite(loss)


def _check_finite(loss: torch.Tensor) -> torch.Tensor:
    if not bool(torch.isfinite(loss.detach()).item()):
        raise FloatingPointError(f"Engine.step: non-finite loss ({loss.item()}); update skipped, weights unchanged")
    return loss


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_distributed() -> None:
    """Initialise torch.distributed through DeepSpeed once per process.

    A launcher (``deepspeed``/``torchrun``) sets RANK/WORLD_SIZE/...; for a plain
    ``python`` run we default to a single-process group.  MASTER_PORT defaults to
    a free port so concurrent single-process runs (e.g. parallel tests) do not
    collide.
    """
    import deepspeed
    from deepspeed.utils import logger as ds_logger

    # DeepSpeed logs its whole config and every comm init at INFO.
    if ds_logger.getEffectiveLevel() < logging.WARNING:
        ds_logger.setLevel(logging.WARNING)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    defaults = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    ours = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())
    # gloo is the CPU default; ZeRO on CUDA tensors needs nccl.
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend)
    log.debug("distributed initialised: backend=%s world_size=%s", backend, os.environ["WORLD_SIZE"])
    # The rendezvous is done: take back the address we invented, so a child process (a
    # benchmark worker, a `wmrl train` subprocess) does not inherit a port this
    # process already listens on.
    for k in ours:
        os.environ.pop(k, None)


def _check_tag(tag: str) -> str:
    tag = str(tag)
    if not tag or tag.startswith(".") or "/" in tag or "\\" in tag or tag == _LATEST:
        raise ValueError(f"invalid checkpoint tag {tag!r}: must be a plain, non-hidden directory name")
    return tag


def _old_name(tag: str) -> str:
    return f".{tag}.old"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sweep(directory: Path) -> None:
    """Drop staging dirs of crashed saves, and `.old` copies whose tag is back in place."""
    for p in directory.glob(".*.tmp"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    for p in directory.glob(".*.old"):
        if (directory / p.name[1:-len(".old")]).is_dir():
            shutil.rmtree(p, ignore_errors=True)


class Engine:
    """DeepSpeed-backed optimiser for one torch module (see module docstring)."""

    def __init__(
        self, module: torch.nn.Module, cfg: EngineConfig, param_groups: Sequence[ParamGroup] | None = None
    ) -> None:
        import deepspeed

        validate_config(cfg)
        ensure_distributed()
        self.cfg = cfg
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("Engine: module has no trainable parameters")
        # A torch optimizer, not DeepSpeed's FusedAdam/CPUAdam: those JIT-compile
        # for ~a minute on first use and buy nothing at this scale.
        optimizer = torch.optim.AdamW(
            _optimizer_groups(params, param_groups, cfg.lr),
            lr=cfg.lr,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            weight_decay=cfg.weight_decay,
        )
        ds_config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,  # every step() is an optimizer step
            "zero_optimization": {"stage": cfg.zero_stage},
            "gradient_clipping": float(cfg.grad_clip),
            "bf16": {"enabled": cfg.bf16},
            "steps_per_print": 2**31 - 1,
        }
        self._ds, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=ds_config)
        # Plain fp32 stage 0 hands the step to the torch optimizer, which does not
        # report a grad norm; every other path exposes DeepSpeed's own.
        self._own_grad_norm = cfg.zero_stage == 0 and not cfg.bf16
        self._trainable = params
        # frozen weights (a LoRA base) come from the module's own source at every start: checkpoints skip them
        self._frozen = any(not p.requires_grad for p in module.parameters())

    @property
    def module(self) -> torch.nn.Module:
        """The wrapped torch module; call it directly for forward passes."""
        return self._ds.module

    def step(self, loss: torch.Tensor | Sequence[Callable[[], torch.Tensor]]) -> dict[str, float]:
        """Backward the loss, clip, take one optimizer step.

        ``loss`` is a scalar tensor, or a sequence of callables each computing one
        micro-batch's share of it (the shares add up to the step's loss): each is
        computed and backpropagated in turn, so only one micro-batch's graph is
        alive at a time, and gradients accumulate to those of the sum.

        Returns the pre-clip global gradient L2 norm, the learning rate of the
        first group and the loss (the sum of the shares). A non-finite share
        raises and drops the gradients accumulated so far, so weights, optimizer
        state and the next step are untouched.
        """
        chunks = [lambda: loss] if isinstance(loss, torch.Tensor) else list(loss)
        if not chunks:
            raise ValueError("Engine.step: no loss to step on")
        if len(chunks) > 1 and self.cfg.zero_stage in (1, 2):
            # ZeRO-1/2 reduce each share into partition buffers that cannot be rolled back:
            # a forward-only pass finds a non-finite share before any backward.
            with torch.no_grad():
                for chunk in chunks:
                    _check_finite(chunk())
        total = 0.0
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_DEPRECATED_COLLECTIVE, category=FutureWarning)
            try:
                for i, chunk in enumerate(chunks):
                    # Only the last micro-batch is a boundary: ZeRO reduces and DeepSpeed steps there.
                    self._ds.set_gradient_accumulation_boundary(i == len(chunks) - 1)
                    # What DeepSpeedEngine.forward does first (we call the module directly):
                    # without it ZeRO-3 overwrites the previous share's gradients instead of adding.
                    if hasattr(self._ds.optimizer, "clear_backward_seen_flag"):
                        self._ds.optimizer.clear_backward_seen_flag()
                    part = _checked_loss(chunk())
                    self._ds.backward(part)
                    total += float(part.detach())
            except Exception:
                self._drop_gradients()
                raise
            pre_norm: float | None = None
            if self._own_grad_norm:
                # Gradients are already all-reduced by backward(); norm before DeepSpeed clips.
                grads = [p.grad for p in self._trainable if p.grad is not None]
                pre_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
            lr = float(self._ds.get_lr()[0])
            self._ds.step()
            self._ds.set_gradient_accumulation_boundary(None)
        if pre_norm is None:
            ds_norm = self._ds.get_global_grad_norm()
            pre_norm = float("nan") if ds_norm is None else float(ds_norm)
        return {"grad_norm": pre_norm, "lr": lr, "loss": total}

    def _drop_gradients(self) -> None:
        self._ds.set_gradient_accumulation_boundary(None)
        self._ds.zero_grad()
        if self.cfg.zero_stage > 0 or self.cfg.bf16:  # ZeRO and bf16 optimizers keep their own gradient buffers
            self._ds.optimizer.zero_grad()

    def save(self, directory: str | Path, tag: str, client_state: dict) -> Path:
        """Write checkpoint ``tag`` under ``directory``; returns ``directory/tag``.

        Crash safety: DeepSpeed writes into a hidden staging tag, which is renamed
        into place only once complete; ``latest`` is then replaced atomically.  A
        crash at any point leaves the previous ``latest`` loadable (when a tag is
        overwritten, the old copy is kept as ``.<tag>.old`` until the swap is done
        and :meth:`load` falls back to it).  Assumes storage shared by all ranks.
        """
        tag = _check_tag(tag)
        directory = Path(directory)
        staging = f".{tag}.tmp"
        is_rank0 = self._ds.global_rank == 0
        if is_rank0:
            directory.mkdir(parents=True, exist_ok=True)
            _sweep(directory)  # leftovers of crashed saves
        torch.distributed.barrier()
        self._ds.save_checkpoint(
            str(directory), tag=staging, client_state={_CLIENT_KEY: client_state}, save_latest=False,
            exclude_frozen_parameters=self._frozen,
        )
        # save_checkpoint ends with a barrier: every rank's shards are on disk now.
        if is_rank0:
            final, old = directory / tag, directory / _old_name(tag)
            shutil.rmtree(old, ignore_errors=True)
            if final.exists():
                final.rename(old)
            (directory / staging).rename(final)
            _fsync_dir(directory)
            tmp = directory / f".{_LATEST}.tmp"
            with open(tmp, "w") as fh:
                fh.write(tag)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, directory / _LATEST)
            _fsync_dir(directory)
            shutil.rmtree(old, ignore_errors=True)
        torch.distributed.barrier()
        log.info("saved checkpoint %s", directory / tag)
        return directory / tag

    def load(self, directory: str | Path, tag: str | None = None) -> dict | None:
        """Restore weights + optimizer state from ``tag`` (default: ``latest``).

        Returns the saved ``client_state``, or None when ``tag`` is None and the
        directory holds no checkpoint.  An explicit ``tag`` that is missing raises
        FileNotFoundError.
        """
        directory = Path(directory)
        if tag is None:
            tag = self.latest_tag(directory)
            if tag is None:
                return None
        tag = _check_tag(tag)
        on_disk = tag
        if not (directory / tag).is_dir():
            if (directory / _old_name(tag)).is_dir():  # crash mid-swap while overwriting this tag
                on_disk = _old_name(tag)
            else:
                raise FileNotFoundError(f"no checkpoint {tag!r} in {directory}")
        path, client = self._ds.load_checkpoint(
            str(directory), tag=on_disk, load_optimizer_states=True, load_lr_scheduler_states=True,
            load_module_strict=not self._frozen,  # a checkpoint without the frozen weights lacks their keys
        )
        if path is None:
            raise RuntimeError(f"DeepSpeed failed to load checkpoint {tag!r} from {directory}")
        log.info("loaded checkpoint %s", directory / on_disk)
        return (client or {}).get(_CLIENT_KEY, {})

    @staticmethod
    def latest_tag(directory: str | Path) -> str | None:
        """Tag named by ``directory/latest`` if that checkpoint exists, else None."""
        directory = Path(directory)
        try:
            tag = (directory / _LATEST).read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not tag or tag.startswith(".") or "/" in tag:
            return None
        if (directory / tag).is_dir() or (directory / _old_name(tag)).is_dir():
            return tag
        return None
