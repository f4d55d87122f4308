"""Live processes under a test's command, read from Linux /proc: which processes a job
started, their state and command line, and a SIGTERM sent to a job with its stderr back."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Dict, List


def _parents() -> Dict[int, List[int]]:
    """{parent pid: the pids of its live (not zombie) children}."""
    parents: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents.setdefault(int(fields[1]), []).append(int(entry))
    return parents


def children(pid: int) -> List[int]:
    """PIDs of the live processes whose parent is `pid`."""
    return _parents().get(pid, [])


def descendants(pid: int) -> List[int]:
    """PIDs of the live processes below `pid`, children first."""
    parents = _parents()
    found, todo = [], [pid]
    while todo:
        below = parents.get(todo.pop(), [])
        found += below
        todo += below
    return found


def state(pid: int) -> str:
    """The one-letter state of `pid` ("" when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as handle:
            return handle.read()
    except OSError:
        return ""


def workers(pid: int) -> List[int]:
    """The "spawn" worker processes below `pid` (multiprocessing's spawn_main)."""
    return [below for below in descendants(pid) if "spawn_main" in cmdline(below)]


def terminate(process: subprocess.Popen, timeout: float = 120) -> str:
    """SIGTERM (then SIGCONT, for a job stopped at a fault point) to `process`; its stderr
    once it has ended (killed if it has not within `timeout` seconds)."""
    try:
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGCONT)
        _, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return stderr


def left_running(pids: List[int], wait: float = 10) -> List[int]:
    """Those of `pids` still running (not gone, not zombies) after up to `wait` seconds."""
    deadline = time.time() + wait
    while [pid for pid in pids if state(pid) not in ("", "Z")] and time.time() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if state(pid) not in ("", "Z")]
