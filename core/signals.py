"""SIGINT / SIGTERM end a training run at a step boundary, with a checkpoint, instead of mid-step.

The first signal is a request: the step in progress finishes (its real
executions are stored as they finish anyway), the trainer checkpoints and stops
with a message that says how to resume. A second signal of either kind is not
waited on: SIGINT raises KeyboardInterrupt and SIGTERM ends the process at once,
which loses nothing stored either, only the step in progress.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)

__all__ = ["StopRequests"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequests:
    """While entered (in the main thread), records the first stop signal in `signum` instead of dying."""

    def __init__(self, what: str = "the step in progress"):
        self.what = what
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def _handle(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
            log.warning("%s received: finishing %s, then checkpointing and stopping (send it again to stop "
                        "at once; nothing stored is lost)", signal.Signals(signum).name, self.what)
            return
        self.__exit__()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.raise_signal(signum)

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            self._old = {s: signal.signal(s, self._handle) for s in _SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old = {}
