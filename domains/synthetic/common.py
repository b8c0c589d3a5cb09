"""What both synthetic domains share: the cost of real execution and its ledger.

"Expensive" has to be real wall time for the benchmarks to mean anything, so a
synthetic real environment sleeps `delay_s` per execution, running `capacity`
executions at once like a sandbox pool would. The optional ledger appends one
line per real execution the moment it completes, independently of the run
store, which is how tests prove that a crashed and resumed run executed nothing
twice.
"""

from __future__ import annotations

import math
import time
from pathlib import Path


class ExecutionCost:
    def __init__(self, delay_s: float, capacity: int, ledger: str | None = None):
        if delay_s < 0:
            raise ValueError("domain.real_delay_s must be >= 0")
        if capacity < 1:
            raise ValueError("domain.real_capacity must be >= 1")
        self.delay_s = delay_s
        self.capacity = capacity
        self.ledger = Path(ledger) if ledger else None
        self.executions = 0

    def pay(self, labels: list[str]) -> None:
        """Spend the wall time of executing `labels` and record them."""
        if not labels:
            return
        if self.delay_s:
            time.sleep(self.delay_s * math.ceil(len(labels) / self.capacity))
        self.executions += len(labels)
        if self.ledger is not None:
            with self.ledger.open("a") as fh:
                fh.write("".join(label + "\n" for label in labels))
