"""CPU seconds of a server's whole process tree, from /proc (Linux): SGLang and vLLM spawn schedulers,
engine cores and workers beside their HTTP process, and a fair CPU figure counts them all."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["tree_cpu_seconds", "tree_pids"]

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone between the listing and the read
        return None
    # The command name is in parentheses and may hold spaces: the fields after it are fixed.
    return text[text.rindex(")") + 2 :].split()


def tree_pids(root: int) -> list[int]:
    """``root`` and every live descendant."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))  # fields[1]: the parent's pid
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU of ``root`` and its live descendants, every thread, so far."""
    total = 0
    for pid in tree_pids(root):
        fields = _stat_fields(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14 and 15)
    return total / _TICKS
