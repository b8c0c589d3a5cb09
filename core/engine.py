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
  `Engine.gathered()` (a collective: every rank enters it);
* with ``bf16=True`` the module's parameters are bf16 at every stage, so the
  caller feeds bf16 floating inputs.
"""

from __future__ import annotations

import io
import logging
import math
import os
import socket
import warnings
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from wmrl.core import checkpoints as ckpt
from wmrl.core.errors import CheckpointError, StorageError
from wmrl.core.ranks import current_ranks
from wmrl.core.validation import validate_config

__all__ = ["EngineConfig", "Engine", "ParamGroup", "ensure_distributed", "saved_client_state"]

log = logging.getLogger(__name__)

# DeepSpeed merges client_state into its own checkpoint dict (and returns its own
# keys, e.g. ``ds_config``, on load), so user keys could collide with or be
# polluted by DeepSpeed's.  Everything of ours lives under this single key.
_CLIENT_KEY = "wmrl_client_state"

#: DeepSpeed's ZeRO-3 on torch>=2.13 calls deprecated collectives on every step; silenced around our calls only
_DEPRECATED_COLLECTIVE = r".*(reduce_scatter_tensor|all_gather_into_tensor).*deprecated"


@dataclass
class EngineConfig:
    zero_stage: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    grad_clip: float = 1.0  # max global grad L2 norm; 0 disables clipping
    bf16: bool = False
    #: training ranks (processes; one per GPU). `wmrl train` starts them with torch's launcher when > 1;
    #: a run already under a launcher (torchrun, deepspeed) must have this many (`core/ranks.py`)
    world_size: int = 1

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
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"engine.world_size must be an integer >= 1, got {self.world_size!r}")


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
    from wmrl.core.ranks import COLLECTIVE_TIMEOUT

    deepspeed.init_distributed(dist_backend=backend, timeout=COLLECTIVE_TIMEOUT)
    log.debug("distributed initialised: backend=%s world_size=%s", backend, os.environ["WORLD_SIZE"])
    # The rendezvous is done: take back the address we invented, so a child process (a
    # benchmark worker, a `wmrl train` subprocess) does not inherit a port this
    # process already listens on.
    for k in ours:
        os.environ.pop(k, None)


def saved_client_state(directory: str | Path) -> dict | None:
    """The `client_state` of the newest whole checkpoint in `directory`, read without building an engine
    (what a report needs from a finished run: its world model's state, not its weights); None if none."""
    for _, folder in ckpt.tags(Path(directory)):
        if ckpt.damage(folder) is None:
            state = torch.load(folder / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
            return state[_CLIENT_KEY]
    return None


class Engine:
    """DeepSpeed-backed optimiser for one torch module (see module docstring)."""

    def __init__(
        self, module: torch.nn.Module, cfg: EngineConfig, param_groups: Sequence[ParamGroup] | None = None
    ) -> None:
        import deepspeed

        validate_config(cfg)
        ensure_distributed()
        ranks = torch.distributed.get_world_size()
        if ranks != cfg.world_size:
            raise ValueError(f"engine.world_size is {cfg.world_size} but this process is one of {ranks} ranks: launch "
                             f"`wmrl train` without a launcher (it starts the ranks), or set engine.world_size={ranks}")
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

    @contextmanager
    def gathered(self, modifier: bool = False) -> Iterator[torch.nn.Module]:
        """The module with every parameter whole inside the block (ZeRO-3 shards them outside it; other
        stages hold them whole anyway). A collective: every rank enters it. With `modifier`, what rank 0
        writes into them is what every rank keeps."""
        import deepspeed

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_DEPRECATED_COLLECTIVE, category=FutureWarning)
            params = list(self.module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0 if modifier else None):
                yield self.module

    def trained_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, whole tensor) of every trainable parameter, one submodule's at a time: under ZeRO-3 a
        rank holds at most one layer beyond its shards. A collective: every rank iterates it to the end."""
        import deepspeed

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_DEPRECATED_COLLECTIVE, category=FutureWarning)
            for prefix, sub in self.module.named_modules():
                own = [(n, p) for n, p in sub.named_parameters(recurse=False) if p.requires_grad]
                if own:
                    with deepspeed.zero.GatheredParameters([p for _, p in own]):
                        for n, p in own:
                            yield f"{prefix}.{n}" if prefix else n, p.data

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
        ranks = current_ranks()
        if ranks.world > 1 or (len(chunks) > 1 and self.cfg.zero_stage in (1, 2)):
            # ZeRO-1/2 reduce each share into partition buffers that cannot be rolled back, and ranks
            # must skip a step together: a forward-only pass finds a non-finite share before any backward.
            problem: FloatingPointError | None = None
            with torch.no_grad():
                for chunk in chunks:
                    try:
                        _check_finite(chunk())
                    except FloatingPointError as exc:
                        problem = exc
                        break
            if not ranks.all(problem is None):
                raise problem or FloatingPointError("Engine.step: another rank's loss is non-finite; update skipped "
                                                    "on every rank, weights unchanged")
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

    def save(self, directory: str | Path, tag: str, client_state: dict, *, keep: int = 0) -> Path:
        """Write checkpoint ``tag`` under ``directory``; returns ``directory/tag``.

        DeepSpeed writes into a hidden staging folder, which is sealed (files
        fsynced, a manifest of checksums written last) and renamed into place;
        ``latest`` is then replaced atomically (`core/checkpoints.py`). A crash at
        any point leaves the previous checkpoint loadable. ``keep`` > 0 then keeps
        only the newest ``keep`` checkpoints. Assumes storage shared by all ranks.
        A failed write raises `StorageError` naming the folder and the free space.
        """
        tag = ckpt.check_tag(tag)
        directory = Path(directory)
        staging = f".{tag}.tmp"
        is_rank0 = self._ds.global_rank == 0
        try:
            if is_rank0:
                directory.mkdir(parents=True, exist_ok=True)
                ckpt.sweep(directory)  # leftovers of crashed saves
            torch.distributed.barrier()
            self._ds.save_checkpoint(
                str(directory), tag=staging, client_state={_CLIENT_KEY: client_state}, save_latest=False,
                exclude_frozen_parameters=self._frozen,
            )
            # save_checkpoint ends with a barrier: every rank's shards are on disk now.
            if is_rank0:
                ckpt.seal(directory / staging)
                ckpt.publish(directory, staging, tag)
                for old in ckpt.prune(directory, keep):
                    log.info("removed checkpoint %s (trainer keeps the newest %d)", directory / old, keep)
        except Exception as exc:  # torch reports a full disk as a RuntimeError of its stream writer
            raise StorageError.of(exc, directory, f"could not write checkpoint {tag!r}") from exc
        torch.distributed.barrier()
        log.info("saved checkpoint %s", directory / tag)
        return directory / tag

    def load(self, directory: str | Path, tag: str | None = None) -> dict | None:
        """Restore weights + optimizer state from ``tag``, or from the newest whole checkpoint.

        With ``tag`` None, the checkpoint ``latest`` names is tried first, then the
        others newest first: one that is damaged (its manifest does not match, or
        DeepSpeed cannot read it) is skipped with a warning that says what was lost.
        Returns the saved ``client_state``, or None when there is no checkpoint at
        all. An explicit ``tag`` that is missing raises FileNotFoundError; one that is
        damaged, like a directory whose every checkpoint is, raises `CheckpointError`.
        """
        directory = Path(directory)
        listed = ckpt.tags(directory)
        if tag is not None:
            tag = ckpt.check_tag(tag)
            listed = [(t, p) for t, p in listed if t == tag]
            if not listed:
                raise FileNotFoundError(f"no checkpoint {tag!r} in {directory}")
        if not listed:
            return None
        skipped: list[str] = []
        for name, folder in listed:
            problem = ckpt.damage(folder)
            if problem is None:
                try:
                    client = self._load(directory, folder.name)
                except Exception as exc:  # noqa: BLE001 - an unreadable checkpoint is damaged, whatever raised
                    problem = f"DeepSpeed cannot load it ({type(exc).__name__}: {str(exc)[:200]})"
                else:
                    if skipped:
                        log.warning("resumed from checkpoint %s instead of %s: the steps after it are re-played "
                                    "(their real executions are read back from the run store)", name, skipped[0])
                    return client
            if tag is not None:
                raise CheckpointError(f"checkpoint {directory / name} is damaged: {problem}")
            log.warning("checkpoint %s is damaged: %s", directory / name, problem)
            skipped.append(name)
        raise CheckpointError(
            f"every checkpoint in {directory} is damaged ({', '.join(skipped)}); move the folder aside to "
            "train again from step 0 (the run store keeps every real execution, so none is paid again)"
        )

    def _load(self, directory: Path, on_disk: str) -> dict:
        # ZeRO 1-2 shard the optimizer state by rank: another number of ranks (a multi-rank run's checkpoint
        # evaluated or exported in one process) can take the weights, not the optimizer state
        shards = len(list((directory / on_disk).glob("*zero_pp_rank_*_optim_states.pt")))
        weights_only = 0 < shards != torch.distributed.get_world_size()
        if weights_only:
            log.warning("checkpoint %s holds the optimizer state of %d ranks and this run has %d: loading the weights "
                        "only (enough to evaluate or export, not to train on)", directory / on_disk, shards,
                        torch.distributed.get_world_size())
        path, client = self._ds.load_checkpoint(
            str(directory), tag=on_disk, load_optimizer_states=True, load_lr_scheduler_states=True,
            load_module_strict=not self._frozen,  # a checkpoint without the frozen weights lacks their keys
            load_module_only=weights_only,
        )
        if path is None:
            raise RuntimeError("load_checkpoint returned no path")
        if weights_only and (directory / on_disk / "zero_pp_rank_0_mp_rank_00_model_states.pt").is_file():
            self._load_zero3_weights(directory, on_disk)
        log.info("loaded checkpoint %s", directory / on_disk)
        return (client or {}).get(_CLIENT_KEY, {})

    def _load_zero3_weights(self, directory: Path, on_disk: str) -> None:
        """A ZeRO-3 checkpoint keeps its weights in every rank's fp32 partition, which DeepSpeed does not
        load for another number of ranks: put the shards together and write them in."""
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with warnings.catch_warnings(), redirect_stdout(io.StringIO()):  # its chatter would corrupt our stdout
            warnings.simplefilter("ignore")
            full = get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=on_disk,
                                                            exclude_frozen_parameters=self._frozen)
        with self.gathered(modifier=True) as module, torch.no_grad():
            missing = [name for name, p in module.named_parameters() if p.requires_grad and name not in full]
            if missing:
                raise RuntimeError(f"the ZeRO-3 shards lack {len(missing)} weights, e.g. {missing[0]}")
            for name, p in module.named_parameters():
                if name in full:
                    p.copy_(full[name].to(p.dtype))

    @staticmethod
    def latest_tag(directory: str | Path) -> str | None:
        """The checkpoint `load` tries first (the one `latest` names if present, else the newest), or None."""
        listed = ckpt.tags(directory)
        return listed[0][0] if listed else None
