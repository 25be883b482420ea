"""What Linux's ``/proc`` says of a process, for every package that watches its own children."""

from __future__ import annotations

from pathlib import Path


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name: state, ppid, ... (``[19]`` is the start
    time, field 22 of proc(5)); None when the file cannot be read (no such process, or no /proc).

    The command name stands in parentheses and may itself hold spaces and ")", so the fields start
    after the last ")"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()
