"""Runs `wmrl CMD ...` in this process and SIGKILLs it at a scripted point (used by tests/test_durability.py).

    python tests/durability_harness.py KILL [--ledger FILE] -- wmrl-args...

KILL is where the process dies, by SIGKILL to itself, so nothing of wmrl's own
runs after that point (or, for term/int, where it is sent a stop signal):
    none                     run to the end
    commit:PREFIX[:N]        right after the N-th (default 1st) store commit of an execution keyed PREFIX...
    term:PREFIX[:N]          SIGTERM to itself at that point instead (the run is asked to stop, not killed)
    int:PREFIX[:N]           SIGINT likewise (Ctrl-C)
    checkpoint:TAG:staged    after DeepSpeed wrote checkpoint TAG, before it is published
    checkpoint:TAG:file      half-way through writing the first file of checkpoint TAG

--ledger FILE appends one line per sandboxed program that really ran (the AutoResearch
sandbox), fsynced, independently of the run store.
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import sys


SIGNALS = {"commit": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _signal_after_commit(prefix: str, n: int, signum: int) -> None:
    from wmrl.core.store import RunStore

    put, seen = RunStore.put_executions, [0]

    def put_executions(self, records):
        out = put(self, records)
        if any(r.key.startswith(prefix) for r in records):
            seen[0] += 1
            if seen[0] == n:
                os.kill(os.getpid(), signum)
        return out

    RunStore.put_executions = put_executions


def _kill_in_checkpoint(tag: str, phase: str) -> None:
    import torch

    from wmrl.core.engine import Engine

    save, torch_save, armed = Engine.save, torch.save, [False]

    def torn_save(obj, f, *args, **kwargs):
        if not armed[0]:
            return torch_save(obj, f, *args, **kwargs)
        buf = io.BytesIO()
        torch_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        with open(f, "wb") as fh:
            fh.write(data[: len(data) // 2])
            fh.flush()
            os.fsync(fh.fileno())
        _die()

    def engine_save(self, directory, name, client_state, **kwargs):
        if name != tag:
            return save(self, directory, name, client_state, **kwargs)
        if phase == "file":
            armed[0] = True
        else:
            ds_save = self._ds.save_checkpoint

            def staged(*args, **kwargs):
                ds_save(*args, **kwargs)
                _die()

            self._ds.save_checkpoint = staged
        return save(self, directory, name, client_state, **kwargs)

    torch.save = torn_save
    Engine.save = engine_save


def _ledger(path: str) -> None:
    from wmrl.domains.autoresearch.sandbox.runner import Sandbox

    run = Sandbox.run

    def counted(self, code, *args, **kwargs):
        result = run(self, code, *args, **kwargs)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (hashlib.sha256(code.encode()).hexdigest()[:16] + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return result

    Sandbox.run = counted


def main(argv: list[str]) -> int:
    split = argv.index("--")
    opts, wmrl_args = argv[:split], argv[split + 1 :]
    kill = opts[0]
    if "--ledger" in opts:
        _ledger(opts[opts.index("--ledger") + 1])
    kind, _, rest = kill.partition(":")
    if kind in SIGNALS:
        prefix, _, n = rest.partition(":")
        _signal_after_commit(prefix, int(n or 1), SIGNALS[kind])
    elif kind == "checkpoint":
        tag, _, phase = rest.partition(":")
        assert phase in ("staged", "file"), kill
        _kill_in_checkpoint(tag, phase)
    else:
        assert kind == "none", kill
    from wmrl.cli import main as wmrl

    return wmrl(wmrl_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
