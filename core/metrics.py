"""Per-step metrics to JSONL (the record a report and a benchmark read) and TensorBoard.

JSONL is appended and flushed per step, so a killed run keeps every step it
finished; on resume, rows past the resumed step are dropped first (the file is
replaced atomically) so it never holds the same step twice.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from wmrl.core.errors import StorageError
from wmrl.core.files import write_atomic


def _clean(v: Any) -> Any:
    # JSON has no NaN; null says "not measured this step"
    return None if isinstance(v, float) and not math.isfinite(v) else v


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSONL file; a last line cut short by a crash or a full disk is dropped."""
    p = Path(path)
    if not p.exists():
        return []
    lines = [line for line in p.read_text().splitlines() if line.strip()]
    rows = [json.loads(line) for line in lines[:-1]]
    try:
        rows += [json.loads(line) for line in lines[-1:]]
    except json.JSONDecodeError:
        pass
    return rows


class MetricsLogger:
    def __init__(self, run_dir: str | Path, *, resume_step: int = 0, tensorboard: bool = True):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        rows = [r for r in read_jsonl(self.path) if r.get("step", 0) <= resume_step]
        try:
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in rows))
        except OSError as exc:
            raise StorageError.of(exc, self.path, "could not rewrite the metrics") from exc
        self._fh = self.path.open("a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tb"), purge_step=resume_step + 1 if resume_step else None)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        try:
            self._fh.write(json.dumps(row) + "\n")
            self._fh.flush()
        except OSError as exc:
            raise StorageError.of(exc, self.path, f"could not log the metrics of step {step}") from exc
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
