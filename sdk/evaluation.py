"""`wmrl eval`: a run's checkpoint on held-out tasks, with a per-task table beside the pooled number.

What it evaluates is the run in the folder it is given, wherever that folder now
lies (the saved `run_dir` is where it was trained), at its latest checkpoint or
at `step`. Episodes are fresh by default: each invocation gets its own tag
(`cli1`, `cli2`, ...) and seed, so its keys never meet the run's own evaluations
and a second invocation draws new samples; they are stored in the run's store
like every real execution. `reuse=True` instead reads back the evaluation the run made at that step
during training. Overrides are those of `wmrl train` (e.g.
`domain.task_root=DIR` to add task directories, `trainer.eval_samples=N`).

Results go to `RUN_DIR/eval/TAG.json` and `.md`: per split the pooled reward and,
per task, episodes, mean reward, the share that ran ok, unknown grades, the
domain's own per-episode numbers (`Domain.episode_stats`, e.g. AutoResearch's
parse rate) and the most frequent failure messages.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from wmrl.config import ConfigError
from wmrl.core.types import Trajectory

__all__ = ["evaluate_run"]

_TAG = re.compile(r"^eval-cli(\d+)/")


def _failure(traj: Trajectory) -> str | None:
    if traj.real is not None and traj.real.status == "ok":
        return None
    for info in reversed(traj.infos):
        msg = info.get("error") or info.get("detail") or info.get("reason")
        if msg:
            return str(msg).strip().splitlines()[-1][:160]
    return traj.real.status if traj.real is not None else "no outcome"


def task_rows(trajs: Sequence[Trajectory], stats: Sequence[dict[str, float]], top: int = 2) -> list[dict[str, Any]]:
    """One row per task, in first-seen order."""
    by_task: dict[str, list[int]] = {}
    for i, t in enumerate(trajs):
        by_task.setdefault(t.task.id, []).append(i)
    rows = []
    for task, idx in by_task.items():
        known = [trajs[i].real.reward for i in idx if trajs[i].real is not None and trajs[i].real.known]
        row: dict[str, Any] = {
            "task": task, "n": len(idx),
            "reward": float(np.mean(known)) if known else float("nan"),
            "ok": sum(trajs[i].real is not None and trajs[i].real.status == "ok" for i in idx) / len(idx),
            "unknown": len(idx) - len(known),
        }
        for key in sorted({k for i in idx for k in stats[i]}):
            vals = [stats[i][key] for i in idx if key in stats[i]]
            row[key] = float(np.mean(vals))
        failures = Counter(f for f in (_failure(trajs[i]) for i in idx) if f is not None)
        row["failures"] = [f"{n}x {msg}" for msg, n in failures.most_common(top)]
        rows.append(row)
    return rows


def _next_tag(store) -> str:
    used = [int(m[1]) for r in store.executions(key_prefix="eval-cli") if (m := _TAG.match(r.key))]
    return f"cli{max(used, default=0) + 1}"


def _markdown(result: dict) -> str:
    lines = [f"# wmrl eval of {result['run_dir']} at step {result['step']} ({result['episodes']})", ""]
    for split, r in result["splits"].items():
        extra = sorted({k for row in r["tasks"] for k in row} - {"task", "n", "reward", "ok", "unknown", "failures"})
        lines += [f"## {split}: reward {_fmt(r['reward'])} over {r['n']} episodes ({r['unknown']} unknown)", "",
                  "| task | n | reward | ok | unknown | " + " | ".join(extra) + (" | " if extra else "")
                  + "top failures |", "|---|---:|---:|---:|---:|" + "---:|" * len(extra) + "---|"]
        for row in r["tasks"]:
            cells = [row["task"], str(row["n"]), _fmt(row["reward"]), _fmt(row["ok"]), str(row["unknown"]),
                     *[_fmt(row.get(k)) for k in extra], "; ".join(row["failures"]).replace("|", "/") or "-"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _fmt(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def evaluate_run(run_dir: str | Path, splits: Sequence[str] | None = None, overrides: Sequence[str] = (), *,
                 step: int | None = None, reuse: bool = False) -> dict[str, Any]:
    """Evaluate the run in `run_dir` (see the module docstring); returns the results it writes."""
    from wmrl.api import resumed_trainer

    run_dir = Path(run_dir)
    if reuse and overrides:
        raise ConfigError("--reuse reads back the run's own evaluation, which overrides cannot change; "
                          "drop --reuse to draw fresh episodes with these overrides")
    trainer = resumed_trainer(run_dir, overrides, step=step)
    cfg = trainer.cfg
    try:
        eval_tag = "" if reuse else _next_tag(trainer.store)
        seed = None if reuse else cfg.seed + 100_003 + 7_919 * int(eval_tag[3:])
        result: dict[str, Any] = {"run_dir": str(run_dir), "step": trainer.step,
                                  "episodes": "reused from training" if reuse else f"fresh, tag {eval_tag}",
                                  "overrides": list(overrides), "splits": {}}
        for split in splits or cfg.eval_splits:
            trajs, _ = trainer.held_out(split, tag=eval_tag, seed=seed)
            known = [t.real.reward for t in trajs if t.real is not None and t.real.known]
            rows = task_rows(trajs, [trainer.domain.episode_stats(t) for t in trajs])
            result["splits"][split] = {"reward": float(np.mean(known)) if known else float("nan"), "n": len(trajs),
                                       "unknown": len(trajs) - len(known), "tasks": rows}
    finally:
        trainer.close()
    out = run_dir / "eval"
    out.mkdir(exist_ok=True)
    name = eval_tag or f"reuse-step{result['step']}"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    (out / f"{name}.md").write_text(_markdown(result))
    result["report"] = str(out / f"{name}.md")
    return result
