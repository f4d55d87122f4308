"""One public fault-injection point: named places of a job where a test, or a user reproducing
a crash, cuts the job off for real.

A job passes :func:`reached` at each point below. A point is armed either

* in the environment, ``ALIGNER_FAULT=POINT[:N[:ACTION]]`` (for a job run as its own process):
  the N-th time (default 1) this process passes POINT, ACTION happens — ``kill`` (the
  default): the process sends itself SIGKILL, as the OOM killer or a preempted machine would
  (no handler runs, no file is closed); ``interrupt``: KeyboardInterrupt, as Ctrl-C;
  ``stop``: the process stops itself (SIGSTOP), so that a test, or a user, can send it a
  signal of its choice at that point (SIGTERM, as a job scheduler would) and continue it
  (SIGCONT); or
* in this process, by :func:`injected` (a context manager; in-process tests), which raises
  KeyboardInterrupt.

Passes are counted per process: a direction trained in a worker process of its own (parallel
directions) counts its own checkpoints.
"""
from __future__ import annotations

import contextlib
import os
import signal
from typing import Dict, Iterator, Optional, Tuple

from aligner.utils import AlignerError

#: the environment variable that arms a point: POINT[:N[:ACTION]]
ENV = "ALIGNER_FAULT"
#: each point, where a job passes it
POINTS: Dict[str, str] = {
    "preparation": "a training run begins to prepare its corpus (BPE, vocabularies, ids) in "
                   "its model directory (a self-training round: MODEL_DIR/rounds/N)",
    "checkpoint": "a Trainer has written a checkpoint (weights, training state, metrics)",
    "round-start": "a self-training round after the first begins: the previous round's links "
                   "of the bitext are written, nothing of the new round is",
    "guide-alignment": "a self-training round's model begins to align the next round's lines",
    "teacher": "the classical teacher begins to align round 1's lines "
               "(aligner/training/teacher.py)",
    "alignment-block": "a block of lines of a whole-bitext alignment is finished (its part "
                       "and the part's record written, aligner/extract/blocks.py)",
}
ACTIONS = ("kill", "interrupt", "stop")

#: armed in this process by :func:`injected`: (point, the pass that cuts off)
_armed: Optional[Tuple[str, int]] = None
#: passes counted per point, in this process
_passes: Dict[str, int] = {}


def parse(spec: str) -> Tuple[str, int, str]:
    """(point, pass, action) of an ``ALIGNER_FAULT`` value; AlignerError if it is not one."""
    parts = spec.split(":")
    point = parts[0]
    if point not in POINTS or len(parts) > 3 or (len(parts) > 1 and not parts[1].isdigit()):
        raise AlignerError(f"{ENV}={spec!r}: expected POINT[:N[:ACTION]] with POINT one of "
                         f"{', '.join(POINTS)} and ACTION one of {', '.join(ACTIONS)}")
    count = int(parts[1]) if len(parts) > 1 else 1
    action = parts[2] if len(parts) > 2 else "kill"
    if count < 1 or action not in ACTIONS:
        raise AlignerError(f"{ENV}={spec!r}: N must be at least 1, ACTION one of "
                         f"{', '.join(ACTIONS)}")
    return point, count, action


def reached(point: str) -> None:
    """The job passes `point` (one of :data:`POINTS`): cut it off here if this pass is the
    armed one; otherwise nothing happens."""
    assert point in POINTS, point
    spec = os.environ.get(ENV)
    if _armed is None and not spec:
        return
    _passes[point] = _passes.get(point, 0) + 1
    if _armed is not None:
        if _armed == (point, _passes[point]):
            raise KeyboardInterrupt
        return
    armed_point, count, action = parse(spec)
    if armed_point == point and _passes[point] == count:
        if action == "interrupt":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)


@contextlib.contextmanager
def injected(point: str, count: int = 1) -> Iterator[None]:
    """Inside the block, the `count`-th pass of `point` (counted from the block's start)
    raises KeyboardInterrupt, as a Ctrl-C there would."""
    global _armed
    assert point in POINTS and count >= 1, (point, count)
    saved = _armed, dict(_passes)
    _armed = (point, count)
    _passes.clear()
    try:
        yield
    finally:
        _armed = saved[0]
        _passes.clear()
        _passes.update(saved[1])
