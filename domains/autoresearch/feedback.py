"""What the agent reads back after a run: our verdict, then the program's own output, quoted.

Why
---
The program's output is text the policy wrote (through its program), fed back
to the policy. Under RL pressure it will print whatever makes the next turn go
its way: a fake "status: ok", a fake score, chat markers that open a new turn.
So the report keeps the two apart: the verdict comes first, in lines of our
own; the program's output follows, every line quoted with "| ", clipped,
control characters and chat markers defused. A printed line can never start a
line of the report, and the report is bounded whatever the program printed.
"""

from __future__ import annotations

import re

__all__ = ["report", "quote", "defuse"]

TAIL = 1200  # characters of each output stream shown
LINE = 240  # characters of one quoted line
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def defuse(text: str) -> str:
    """Control characters and chat markers (`<|...|>`) made inert."""
    return _CONTROL.sub("?", text).replace("<|", "< |").replace("|>", "| >")


def quote(text: str, limit: int = TAIL) -> str:
    """The tail of a program's output as the agent may read it: each line quoted and clipped."""
    lines = [ln if len(ln) <= LINE else ln[:LINE] + " [...]" for ln in defuse(text[-limit:]).splitlines()]
    return "\n".join("| " + ln for ln in lines)


def report(status: str, score: float | None = None, message: str = "", stdout: str = "", stderr: str = "") -> str:
    """The sandbox report: status, score and message (ours), then stdout and stderr (the program's), quoted."""
    lines = [f"status: {status}"]
    if score is not None:
        lines.append(f"score: {score:.4f}")
    if message:
        lines.append(defuse(message))
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        if text.strip():
            lines.append(f"{name} of your program (last {TAIL} characters):\n" + quote(text))
    return "\n".join(lines)
