"""Starting the ranks of a multi-rank run: `wmrl train ... engine.world_size=N` on one machine.

The command re-runs itself under torch's launcher (`torch.distributed.run`,
i.e. torchrun) with N processes on this node, on a free local port; each
process is one rank of `core/ranks.py`. Across several nodes, start it with the
launcher yourself on every node (`torchrun --nnodes=M --nproc_per_node=K
--rdzv_endpoint=HOST:PORT -m wmrl.cli train ... engine.world_size=M*K`, or
DeepSpeed's launcher with a hostfile): a process that already has a
`WORLD_SIZE` is not launched again.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Sequence

__all__ = ["launch_ranks", "under_launcher", "is_leader"]


def under_launcher() -> bool:
    """Whether this process is a rank started by a launcher (torchrun, deepspeed)."""
    return "WORLD_SIZE" in os.environ


def is_leader() -> bool:
    """Whether this process is rank 0 (or not under a launcher at all)."""
    return int(os.environ.get("RANK", "0")) == 0


def launch_ranks(n: int, argv: Sequence[str]) -> int:
    """Run `wmrl argv` as `n` ranks on this machine; the launcher's exit status."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={n}",
           "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "wmrl.cli", *argv]
    proc = subprocess.Popen(cmd)
    # Ctrl-C reaches the launcher through the terminal's process group; SIGTERM is passed on to it. The
    # launcher hands the signal to the ranks, which stop at their next checkpoint (it kills them 30 s later)
    old = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
           signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, _: proc.send_signal(signum))}
    try:
        return proc.wait()
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
