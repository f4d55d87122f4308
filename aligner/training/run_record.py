"""The run record: MODEL_DIR/run.json, what a training job did and how long each of its stages took.

A training job (`align train`, `align run`, every self-training round of one, and each
``--resume`` of it) writes one small JSON file into its model directory, so that its facts and
times are read from a file made for it rather than from its logs (eval/compare_aligners.py)::

    {"format": 1,
     "earlier_unrecorded": false,
     "sessions": [{"argv": [...], "cwd": "...", "version": "...", "started": "...",
                   "resumed": false, "directions": ["fwd", "rev"], "device": "cpu",
                   "precision": "fp32", "deterministic": false, "processes": 1, "threads": 2,
                   "parallel_directions": true, "inputs": {...}}, ...],
     "stages": [{"session": 0, "round": 1, "stage": "preparation", "seconds": 1.2},
                {"session": 0, "round": 1, "stage": "training", "direction": "fwd",
                 "parallel": true, "seconds": 30.5}, ...,
                {"session": 0, "round": 1, "stage": "guide", "seconds": 4.0}, ...]}

A **session** is one command that trained in the directory: the first, then one per
``--resume`` (``resumed`` true), its stages appended after the earlier ones. A **stage** is a
part of a session's work in one self-training round (1 for a run without rounds):
``preparation`` (BPE, vocabularies, corpus encoding), ``training`` of one ``direction`` (or of
``fwd+rev`` together, agreement training), ``guide`` (the round's model aligning the bitext for
the next round's guide, aligner/training/rounds.py), ``teacher`` (the classical aligner's
links that guide round 1, aligner/training/teacher.py), ``calibration`` (the output's
thresholds per line length, after the last round, aligner/extract/calibrate.py). ``seconds`` are wall seconds of that stage
in that session; a stage cut off (a killed process) is not recorded. The whole job's wall time is
:meth:`RunRecord.wall_seconds`: the sum of the stages, where the directions trained side by
side (``parallel``) in one round of one session count as the longest of them.

The record is written atomically (aligner.utils.atomic_output) when a session begins and after
every stage. A model directory written before run records has none; one resumed by this
version starts its record at that session (``earlier_unrecorded`` true).
"""
from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from aligner import __version__
from aligner import constants as C
from aligner.utils import AlignerError, atomic_output

#: version of the file's layout (bumped when a field changes meaning)
FORMAT = 1
#: the stages a session records (see the module docstring)
STAGES = ("preparation", "training", "guide", "teacher", "calibration")


def record_path(model_dir: str) -> str:
    """MODEL_DIR/run.json."""
    return os.path.join(model_dir, C.RUN_RECORD_NAME)


@dataclass
class RunRecord:
    """The run record of one model directory, in memory (see the module docstring).

    path: the file it is saved to (MODEL_DIR/run.json). sessions: one dict per command that
    trained there, in order (fields: argv, the command line; cwd, its working directory;
    version, the package's; started, UTC date and time ISO 8601; resumed, whether it continued
    an earlier session; directions, the directions trained; device, precision, deterministic
    (--deterministic; absent in records of older versions), processes (the
    torchrun world size, 1 without), threads (torch threads of the main process),
    parallel_directions (each direction in a process of its own); inputs, see
    :func:`aligner.training.run.run_inputs`). stages: one dict per finished stage (fields: session,
    the index of its session; round, the self-training round; stage, one of :data:`STAGES`;
    direction, for training: fwd, rev or fwd+rev; parallel, for training: trained at the same
    time as the other direction; seconds). earlier_unrecorded: the directory was trained by a
    version without run records before its first recorded session. current_round: the
    self-training round the stages being added belong to (not saved; each stage says its own).
    """

    path: str
    sessions: List[Dict[str, Any]] = field(default_factory=list)
    stages: List[Dict[str, Any]] = field(default_factory=list)
    earlier_unrecorded: bool = False
    current_round: int = 1
    #: the index of this process's session, once begun
    _open_session: Optional[int] = field(default=None, repr=False)

    @classmethod
    def load(cls, model_dir: str) -> "RunRecord":
        """MODEL_DIR/run.json as written by :meth:`save`; AlignerError (one line naming the
        file) when it is missing or not a run record."""
        path = record_path(model_dir)
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format') if isinstance(data, dict) else '?'}"
                                 f", expected {FORMAT}")
            sessions, stages = data["sessions"], data["stages"]
            if not (isinstance(sessions, list) and all(isinstance(s, dict) for s in sessions)
                    and isinstance(stages, list)):
                raise ValueError("sessions and stages must be lists")
            for stage in stages:
                if not (isinstance(stage, dict) and stage.get("stage") in STAGES
                        and isinstance(stage.get("seconds"), (int, float))
                        and isinstance(stage.get("round"), int)
                        and isinstance(stage.get("session"), int)
                        and 0 <= stage["session"] < len(sessions)):
                    raise ValueError(f"bad stage {stage!r:.80}")
            return cls(path, sessions, stages, bool(data.get("earlier_unrecorded", False)))
        except FileNotFoundError:
            raise AlignerError(f"{path}: missing (the directory has no run record)") from None
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise AlignerError(f"{path}: not a run record of `align train` ({error})") from None

    @classmethod
    def resumed(cls, model_dir: str) -> "RunRecord":
        """The record a resumed run adds to: MODEL_DIR/run.json, or a new one marked
        ``earlier_unrecorded`` when the directory has none (written by an older version)."""
        if os.path.isfile(record_path(model_dir)):
            return cls.load(model_dir)
        return cls(record_path(model_dir), earlier_unrecorded=True)

    def begin_session(self, argv: Sequence[str], directions: Sequence[str], device: str,
                      precision: str, processes: int, threads: int,
                      parallel_directions: bool, deterministic: bool = False) -> None:
        """Start this process's session (a no-op once begun: a self-training job's later
        rounds belong to the session of the command that trains them); not saved."""
        if self._open_session is not None:
            return
        self.sessions.append({
            "argv": list(argv), "cwd": os.getcwd(), "version": __version__,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "resumed": bool(self.sessions) or self.earlier_unrecorded,
            "directions": list(directions), "device": device, "precision": precision,
            "deterministic": deterministic, "processes": processes, "threads": threads,
            "parallel_directions": parallel_directions, "inputs": {}})
        self._open_session = len(self.sessions) - 1

    @property
    def session(self) -> Dict[str, Any]:
        """This process's session (begun with :meth:`begin_session`)."""
        if self._open_session is None:
            raise RuntimeError("no session begun")
        return self.sessions[self._open_session]

    def set_inputs(self, inputs: Dict[str, Any]) -> None:
        """Record this session's inputs (the first round's: later rounds keep them) and save."""
        if not self.session["inputs"]:
            self.session["inputs"] = inputs
            self.save()

    def add_stage(self, stage: str, seconds: float, direction: Optional[str] = None,
                  parallel: bool = False) -> None:
        """Append a finished stage of this session in the current round, and save."""
        entry: Dict[str, Any] = {"session": self._open_session, "round": self.current_round,
                                 "stage": stage}
        if direction is not None:
            entry["direction"] = direction
            entry["parallel"] = parallel
        entry["seconds"] = round(seconds, 3)
        self.stages.append(entry)
        self.save()

    def has_stages_before(self, round_number: int) -> bool:
        """Whether stages of rounds before `round_number` are recorded (a self-training job
        that goes on: its record must outlive a round that is discarded)."""
        return any(stage["round"] < round_number for stage in self.stages)

    def wall_seconds(self) -> float:
        """The recorded stages' wall time: their sum, the directions trained side by side in
        one round of one session counting as the longest of them."""
        total, parallel = 0.0, {}
        for stage in self.stages:
            if stage.get("parallel"):
                key = (stage["session"], stage["round"])
                parallel[key] = max(parallel.get(key, 0.0), stage["seconds"])
            else:
                total += stage["seconds"]
        return total + sum(parallel.values())

    def save(self) -> None:
        """Write the record to its path, atomically."""
        def rows(items: List[Dict[str, Any]]) -> str:   # one line per session and stage
            return "[" + ",".join("\n  " + json.dumps(item) for item in items) + "]"

        with atomic_output(self.path) as handle:
            handle.write(f'{{"format": {FORMAT}, "earlier_unrecorded": '
                         f'{json.dumps(self.earlier_unrecorded)},\n "sessions": '
                         f'{rows(self.sessions)},\n "stages": {rows(self.stages)}}}\n')
