"""The VLA pipeline behind `wmrl vla {collect,bc,eval,demo}`: demos -> LeRobotDataset -> BC -> evaluation.

One typed config (`configs/vla.yaml`, `key=value` overrides) and one run
directory hold every stage's output, so each stage finds what the one before
wrote, and rerunning a finished stage is free (the dataset is kept, BC resumes
from its latest checkpoint, evaluation recomputes on the saved policy):

    RUN_DIR/demos/        the LeRobotDataset (or `dataset=PATH`: bring your own)
    RUN_DIR/bc/policy/    the trained policy (`save_pretrained`; `from_pretrained` loads it)
    RUN_DIR/eval.json     success by split and family
    RUN_DIR/report.md     the report, with strips and GIFs of held-out episodes
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from omegaconf import OmegaConf

from wmrl.core.validation import at_least, validate_config
from wmrl.domains.vla.bc import BCConfig, behaviour_clone
from wmrl.domains.vla.collect import CollectConfig, collect_demos
from wmrl.domains.vla.dataset import load_dataset
from wmrl.domains.vla.env import VLAEnvConfig
from wmrl.domains.vla.evaluate import EvalConfig, evaluate_policy, frames_of, episode_outcome, write_gif, write_strip
from wmrl.domains.vla.policy.adapter import VLAPolicy
from wmrl.domains.vla.policy.configuration_wmrl_vla import WmrlVLAConfig
from wmrl.domains.vla.tasks import family, make_tasks

log = logging.getLogger(__name__)


@dataclass
class TasksConfig:
    families: list[str] = field(default_factory=lambda: ["lift", "stack", "pick_place_can"])
    #: held-out tasks (initial states) per family and split
    test_id: int = 4
    test_ood: int = 4
    seed: int = 0

    def validate(self) -> None:
        at_least(self, "tasks", 0, "test_id", "test_ood")
        for name in self.families:
            family(name)


@dataclass
class PolicyConfig:
    chunk_size: int = 8
    init_log_std: float = -1.0
    vision_lr_scale: float = 1.0

    def validate(self) -> None:
        at_least(self, "policy", 1, "chunk_size")


@dataclass
class VLAPipelineConfig:
    run_dir: str = "runs/vla"
    #: a LeRobotDataset root to train on instead of the collected demos ("" = RUN_DIR/demos)
    dataset: str = ""
    tasks: TasksConfig = field(default_factory=TasksConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    bc: BCConfig = field(default_factory=BCConfig)
    env: VLAEnvConfig = field(default_factory=VLAEnvConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def validate(self) -> None:
        for section in (self.tasks, self.collect, self.policy, self.bc, self.env, self.eval):
            validate_config(section)
        if self.env.chunk < self.policy.chunk_size:
            raise ValueError(f"env.chunk ({self.env.chunk}) must be >= policy.chunk_size ({self.policy.chunk_size})")

    @property
    def dataset_root(self) -> Path:
        return Path(self.dataset) if self.dataset else Path(self.run_dir) / "demos"


def load_pipeline_config(path: str | Path | None, overrides: list[str]) -> VLAPipelineConfig:
    """The pipeline config from YAML (the shipped `vla` one by default) and `key=value` overrides."""
    base = OmegaConf.structured(VLAPipelineConfig)
    layers = [OmegaConf.load(path)] if path else []
    try:
        merged = OmegaConf.merge(base, *layers, OmegaConf.from_dotlist(overrides))
    except Exception as exc:  # omegaconf names the key and the type it expected
        raise ValueError(f"vla config: {exc}".splitlines()[0]) from None
    cfg: VLAPipelineConfig = OmegaConf.to_object(merged)
    cfg.validate()
    return cfg


def collect(cfg: VLAPipelineConfig, progress: bool = True) -> dict[str, Any]:
    root = cfg.dataset_root
    if (root / "meta" / "info.json").is_file():
        log.info("collect: keeping the dataset at %s", root)
        return {"dataset": str(root), "kept": True}
    counts = collect_demos(root, cfg.collect, progress=progress)
    return {"dataset": str(root), "families": counts}


def bc(cfg: VLAPipelineConfig, progress: bool = True) -> dict[str, Any]:
    meta = load_dataset(cfg.dataset_root).meta
    policy_cfg = WmrlVLAConfig.from_dataset(meta, chunk_size=cfg.policy.chunk_size,
                                            n_action_steps=cfg.policy.chunk_size,
                                            init_log_std=cfg.policy.init_log_std, device="cpu")
    policy = VLAPolicy.build(policy_cfg, seed=cfg.bc.seed).policy
    history = behaviour_clone(policy, cfg.dataset_root, Path(cfg.run_dir) / "bc", cfg.bc, progress=progress)
    val = history["val_loss"]
    return {"policy": str(Path(cfg.run_dir) / "bc" / "policy"), "val_loss_first": val[0][1] if val else None,
            "val_loss_last": val[-1][1] if val else None, "train_loss_last": history["train_loss"][-1][1]}


def evaluate(cfg: VLAPipelineConfig, progress: bool = True) -> dict[str, Any]:
    run = Path(cfg.run_dir)
    policy = VLAPolicy.from_pretrained(str(run / "bc" / "policy"))
    tasks = {split: make_tasks(split, getattr(cfg.tasks, split), cfg.tasks.seed, cfg.tasks.families)
             for split in cfg.eval.splits}
    t0 = time.perf_counter()
    results, trajs = evaluate_policy(policy, tasks, cfg.env, cfg.eval)
    results["eval_wall_s"] = time.perf_counter() - t0
    results["episodes"] = _write_episode_media(trajs, run / "media")
    (run / "eval.json").write_text(json.dumps(results, indent=1))
    return results


def _write_episode_media(trajs: dict, media: Path) -> dict[str, dict[str, str]]:
    """A strip and a GIF of the first successful and the first failed held-out episode, per split."""
    media.mkdir(parents=True, exist_ok=True)
    out: dict[str, dict[str, str]] = {}
    for split, ts in trajs.items():
        for label, want in (("success", True), ("failure", False)):
            traj = next((t for t in ts if episode_outcome(t) is want and frames_of(t)), None)
            if traj is None:
                continue
            frames, stem = frames_of(traj), f"{split}-{label}"
            out.setdefault(split, {})[label] = traj.task.payload.instruction
            write_strip(frames, media / f"{stem}.png")
            write_gif(frames, media / f"{stem}.gif")
    return out


def write_report(cfg: VLAPipelineConfig, summary: dict[str, Any]) -> Path:
    """RUN_DIR/report.md: what was collected, how BC went, success by split and family, pictures."""
    run = Path(cfg.run_dir)
    results = json.loads((run / "eval.json").read_text())
    lines = ["# VLA run report", "", f"Run directory: `{run}`; dataset: `{cfg.dataset_root}`.", ""]
    if "collect" in summary and "families" in summary["collect"]:
        lines += ["## Demonstrations (scripted, successful episodes kept)", "", "| family | kept | attempts |",
                  "|---|---:|---:|"]
        lines += [f"| {k} | {v['kept']} | {v['attempts']} |" for k, v in summary["collect"]["families"].items()]
        lines.append("")
    if "bc" in summary:
        b = summary["bc"]
        lines += ["## Behaviour cloning", "", f"{cfg.bc.steps} updates, batch {cfg.bc.batch_size}, lr {cfg.bc.lr}: "
                  f"validation loss {_fmt(b['val_loss_first'])} -> {_fmt(b['val_loss_last'])} "
                  f"(held-out episodes; train loss at the end {_fmt(b['train_loss_last'])}).", ""]
    families = cfg.tasks.families
    lines += ["## Real success in the simulator", "",
              f"{'greedy' if cfg.eval.greedy else 'sampled'} chunks, {cfg.eval.samples} episode(s) per task.", "",
              "| split | success | n | unknown | " + " | ".join(families) + " |",
              "|---|---:|---:|---:|" + "---:|" * len(families)]
    for split in cfg.eval.splits:
        r = results[split]
        per = [_fmt(r["families"].get(f, {}).get("success")) for f in families]
        lines.append(f"| {split} | {_fmt(r['success'])} | {r['n']} | {r['unknown']} | " + " | ".join(per) + " |")
    lines += ["", "## Held-out episodes", ""]
    for split, shown in results.get("episodes", {}).items():
        for label, instruction in shown.items():
            lines += [f"**{split}, {label}** — \"{instruction}\"", "", f"![{split} {label}](media/{split}-{label}.png)",
                      f"([GIF](media/{split}-{label}.gif))", ""]
    path = run / "report.md"
    path.write_text("\n".join(lines))
    return path


def _fmt(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def demo(cfg: VLAPipelineConfig, progress: bool = True) -> dict[str, Any]:
    """collect -> bc -> eval -> report, timing each stage."""
    summary: dict[str, Any] = {"config": asdict(cfg), "wall_s": {}}
    for name, stage in (("collect", collect), ("bc", bc), ("eval", evaluate)):
        t0 = time.perf_counter()
        summary[name] = stage(cfg, progress)
        summary["wall_s"][name] = round(time.perf_counter() - t0, 1)
    summary["report"] = str(write_report(cfg, summary))
    (Path(cfg.run_dir) / "demo.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


#: `wmrl vla STAGE`: each takes the config and whether to show progress bars
STAGES: dict[str, Callable[[VLAPipelineConfig, bool], dict[str, Any]]] = {
    "collect": collect, "bc": bc, "eval": evaluate, "demo": demo,
}
