"""The VLA section of a run's report: what the embodied world model imagined for one anchor group, beside
what the simulator showed.

An anchor group is the one place where both exist for the same actions: the
simulator ran the episodes, and the world model grades them by replaying the
same chunks from the same first observation. For the run's last anchor group
the figure shows, per episode, the real camera frames, the model's success
("solved by now") after each chunk against the real outcome, and the imagined
against the real gripper height. The model is the one of the run's latest
checkpoint, so the picture is of the model as training left it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from wmrl.core.engine import saved_client_state
from wmrl.core.estimators import plan_mode
from wmrl.core.replay import read_trajectories
from wmrl.core.types import Trajectory

FIGURE = "imagined_vs_real.png"
EEF_Z = 2  # the end effector's height in the proprio state


def _last_anchor_group(run_dir: Path, run_id: str) -> list[Trajectory]:
    stored = read_trajectories(run_dir / "store.sqlite", run_id)
    if not stored:
        return []
    last = stored[-1]
    return [s.trajectory for s in stored if s.step == last.step and s.group == last.group]


def imagined_vs_real(domain: Any, run_dir: Path, cfg: Any) -> list[str]:
    """Markdown lines and the figure for the run's last anchor group; none when the run had no world model
    grading anchors (mode `real`) or has no checkpoint yet."""
    if cfg.world_model is None or cfg.world_model.type != "embodied":
        return []
    if not plan_mode(cfg.estimator, cfg.anchors.fraction).uses_world_model:
        return []
    state = saved_client_state(run_dir / "checkpoints")
    group = _last_anchor_group(run_dir, cfg.run_id)
    if state is None or not group:
        return []
    wm = domain.make_world_model(cfg.world_model)
    try:
        wm.load_state_dict(state["world_model"])
        traces = [wm.trace(t) for t in group]
        d = len(wm.codec.vectors(group[0].observations[:1])[0]) - len(group[0].observations[0]["state"])
    finally:
        wm.close()
    _figure(group, traces, d, run_dir / FIGURE, wm.success_threshold)
    return ["## Imagined vs real: the last anchor group", "",
            "Per episode: the simulator's frames; the embodied world model's success after each chunk "
            "(the same chunks replayed from the same first observation) against the real outcome; and the "
            "imagined against the real end-effector height.", "", f"![imagined vs real]({FIGURE})", ""]


def _figure(group: list[Trajectory], traces: list[tuple[np.ndarray, np.ndarray]], vision_dim: int, path: Path,
            threshold: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(group)
    fig, axes = plt.subplots(n, 3, figsize=(13, 2.0 * n), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1.2, 1.2]})
    for row, (traj, (imagined, success)) in enumerate(zip(group, traces)):
        turns = np.arange(1, traj.turns + 1)
        frames = np.concatenate([o["image"] for o in traj.observations], axis=1)
        real = 1.0 if traj.real is not None and traj.real.reward == 1.0 else 0.0
        ax = axes[row][0]
        ax.imshow(frames)
        ax.set_axis_off()
        ax.set_title(f"real: {'success' if real else 'failure'} after {traj.turns} chunks", fontsize=8, loc="left")
        ax = axes[row][1]
        ax.plot(turns, success, marker="o", label="imagined success")
        ax.axhline(threshold, color="grey", lw=0.8, ls=":")
        ax.scatter([traj.turns], [real], color="red", zorder=3, label="real outcome")
        ax.set_ylim(-0.05, 1.05)
        ax.tick_params(labelsize=7)
        ax = axes[row][2]
        ax.plot(turns, imagined[:, vision_dim + EEF_Z], marker="o", label="imagined")
        ax.plot(turns, [o["state"][EEF_Z] for o in traj.observations], marker="x", label="real")
        ax.tick_params(labelsize=7)
    axes[0][1].legend(fontsize=7)
    axes[0][2].legend(fontsize=7)
    axes[0][1].set_title("success after each chunk", fontsize=8)
    axes[0][2].set_title("end-effector height", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
