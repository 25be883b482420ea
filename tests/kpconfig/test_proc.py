"""proc_stat: the fields after the command name, whatever the name holds."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kpconfig.proc import proc_stat


def test_command_name_with_spaces_and_parenthesis(tmp_path: Path) -> None:
    # The kernel names a process after the file it executes (``exec -a`` changes only argv[0]), so the
    # child runs sleep through a link whose name holds spaces and parentheses.
    name = "a) b (c) d"
    sleep = shutil.which("sleep")
    assert sleep is not None
    (tmp_path / name).symlink_to(sleep)
    child = subprocess.Popen(["bash", "-c", 'exec "$0" 60', str(tmp_path / name)], stdin=subprocess.DEVNULL)
    try:
        comm = ""
        while comm != name:  # until exec replaced bash (the test's timeout bounds the wait)
            comm = Path(f"/proc/{child.pid}/comm").read_text().rstrip("\n")
        fields = proc_stat(child.pid)
        # Running, or in uninterruptible disk sleep while the kernel pages sleep's binary in, until the
        # child settles into sleep's wait.
        while fields is not None and fields[0] in ("R", "D"):
            fields = proc_stat(child.pid)
        assert fields is not None
        assert fields[0] == "S"
        assert int(fields[1]) == os.getpid()  # ppid
        assert int(fields[19]) > 0  # start time
    finally:
        child.kill()
        child.wait()


def test_no_such_process() -> None:
    assert proc_stat(2**22 + 1) is None  # above Linux's largest pid_max: never a process
    assert proc_stat(os.getpid()) is not None
