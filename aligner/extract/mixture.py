"""A second model directory's posteriors mixed into a model's own: the recipe's output mixes
in its classical teacher's by default, and ``align extract MODEL --mix OTHER [--mix-weight W]``
any other's.

Each direction's word-level soft alignment of a line becomes

    p(i, j) = (1 - W) · p_MODEL(i, j) + W · p_OTHER(i, j)

before the two directions are combined (soft-average), written (--soft) or scored
(--link-probs). Each model's share is judged at that model's own threshold: a line's
soft-average threshold is

    t(I, J) = (1 - W) · t_MODEL(I, J) + W · t_OTHER

(:meth:`Mixture.thresholds`), with t_MODEL MODEL's threshold for the line (its calibration per
line length included, aligner/extract/calibrate.py) and t_OTHER OTHER's base threshold,
uncalibrated: the one it records, else 0.5 (the recipe's teacher: recipe.TEACHER_MIX_THRESHOLD,
0.45, below the 0.5 of its links that guide round 1, as its posteriors keep the empty word's
mass; eval/results/mix_threshold.md). MODEL's base threshold, where it is not
the default it replaces, scales t_OTHER by the same ratio, so that ``--threshold`` moves every
line's decision, those OTHER decides alone included. The default it replaces: for the recipe's
own teacher recipe.THRESHOLD, what a self-training run records unless given another (so `align
run --threshold T` and `align extract MODEL --threshold T` agree); for ``--mix OTHER`` MODEL's
recorded threshold (else 0.5).

OTHER is meant to be the classical aligner trained on the same bitext (``align train --model
classical``): the neural recipe and the classical HMM err on different lines, the neural rounds
most on lines far longer than those they trained on, where the classical HMM's jumps hold
(eval/results/mix_classical.md). Any model directory of both directions works (another seed of
the recipe: an ensemble); each side reads the input through its own preprocessing (its BPE, its
lowercasing), and both give one (source words, target words) matrix per line.

On a line longer than the model's training lines W grows (:func:`line_weight`): with a
long-line length L (``--mix-length``; the recipe records the 99th percentile of its bitext's
line lengths, recipe.MIX_LENGTH_QUANTILE), a line of n > L words (its longer side) takes

    W(n) = W + (1 - W) · min(1, (n - L) / L)

so OTHER alone from 2L words on: a neural model trained on lines of at most 16 words aligns
lines of 40 badly, where the classical HMM's jumps, which do not depend on the line's length,
hold (join_lines_jaen.md, mix_length.md). L = 0: the same W on every line.

The recipe (`align run`, a self-training `align train`) keeps its teacher as a classical
model directory, ``MODEL/rounds/0`` (:data:`TEACHER_DIR`, the teacher trained on round 1's
lines and more, aligner/training/teacher.py), and records W = recipe.MIX_WEIGHT in config.json as
`align extract`'s default (``mix_weight`` of ``extra[constants.ALIGN_RUN_SETTINGS]``): so
`align run`, `align extract MODEL` and the Python API give the mixed output, and
``--mix-weight 0`` the model's own. The calibration of the thresholds per line length stays
the model's own posteriors' (aligner/extract/calibrate.py), as measured, and applies to its
share: the teacher's posteriors do not spread with the line's length as the network's do
(eval/results/mix_threshold.md).

A line MODEL cannot align (a side too long for it: an empty matrix) stays without links, as
without a mixture (its warning says so); a line only OTHER cannot align takes MODEL's matrix
alone, at MODEL's threshold. The per-direction hard links (``fwd`` / ``rev`` outputs of `align
run`) stay MODEL's own.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import numpy as np

from aligner import constants as C
from aligner.links.calibration import MAX_THRESHOLD
from aligner.links.soft_symmetrize import DEFAULT_THRESHOLD, line_threshold
from aligner.utils import check_condition

if TYPE_CHECKING:  # pragma: no cover
    from aligner.data import EncodedPair
    from aligner.links.soft_symmetrize import Threshold
    from aligner.model_dir import LoadedModelDir

logger = logging.getLogger(__name__)

#: the recipe's teacher inside its model directory: round 0's directory
TEACHER_DIR = os.path.join(C.ROUNDS_DIR, "0")


@dataclass
class Mixture:
    """The other model directory of a mixture (`path`, both directions, loaded on `device` at
    its first use: a process that hands its blocks to others never loads it), its extraction
    method (its kind's first: posteriors) with that method's default options, and its weight
    W."""

    path: str
    method: str
    options: Dict[str, Any]
    weight: float
    device: Any
    long_line: int = 0
    #: OTHER's base threshold (what it records, else DEFAULT_THRESHOLD) and the default of
    #: MODEL's that a threshold in use is measured against (module docstring): :meth:`thresholds`
    threshold: float = DEFAULT_THRESHOLD
    model_threshold: float = DEFAULT_THRESHOLD
    _loaded: Optional["LoadedModelDir"] = None

    @classmethod
    def load(cls, model_dir: str, weight: float, device: Any, long_line: int = 0,
             model_threshold: float = DEFAULT_THRESHOLD,
             threshold: Optional[float] = None) -> "Mixture":
        """The mixture of `model_dir` at `weight`, growing on lines over `long_line` words
        (:func:`line_weight`), judged at `threshold` (None: the one it records, else
        DEFAULT_THRESHOLD) into a model whose default base threshold is `model_threshold`:
        its config.json read and checked now (one error line for what is not a model
        directory of both directions), its weights later."""
        from aligner.config import RunConfig
        from aligner.extract.inference import default_options
        from aligner.model_dir import config_path, recorded_symmetrization
        from aligner.models import model_class

        check_condition(0.0 < weight <= 1.0, f"--mix-weight must be in (0, 1]: {weight}")
        check_condition(long_line >= 0, f"--mix-length must be 0 or more: {long_line}")
        check_condition(threshold is None or 0.0 <= threshold < 1.0,
                        f"--mix-threshold must be in [0, 1): {threshold}")
        check_condition(os.path.isdir(model_dir), f"{model_dir}: no such model directory")
        config = RunConfig.load(config_path(model_dir))
        check_condition(all(d in config.directions for d in C.DIRECTIONS),
                        f"{model_dir}: a mixture needs both directions; this model was "
                        f"trained for {', '.join(config.directions)} only")
        kind = model_class(config.model_kind)
        method = kind.METHODS[0]
        if threshold is None:
            threshold = recorded_symmetrization(model_dir, config).get("threshold",
                                                                       DEFAULT_THRESHOLD)
        return cls(model_dir, method, default_options(kind, method, {}), weight, device,
                   long_line, float(threshold), float(model_threshold))

    @property
    def loaded(self) -> "LoadedModelDir":
        from aligner.model_dir import LoadedModelDir

        if self._loaded is None:
            self._loaded = LoadedModelDir.load(self.path, C.DIRECTIONS, "best", self.device)
        return self._loaded

    def identity(self) -> Dict[str, Any]:
        """What the mixed output depends on, for a parts record: OTHER's files, method,
        options, W, long-line length and threshold."""
        from aligner.model_dir import model_checksums

        return {"model": model_checksums(self.path, C.DIRECTIONS),
                "method": self.method, "options": self.options, "weight": self.weight,
                "long_line": self.long_line, "threshold": self.threshold}

    def thresholds(self, own: "Threshold", mine: Sequence[np.ndarray],
                   theirs: Sequence[np.ndarray]) -> List[float]:
        """The soft-average threshold of each mixed line (the module docstring's t(I, J)):
        (1 - w) · MODEL's `own` for the line (a number, or per line length,
        aligner.links.calibration.LengthThresholds, whose shortest lines' is its base) + w ·
        OTHER's, w being OTHER's share of the line as :func:`mix` takes it from MODEL's and
        OTHER's matrices of the line (`mine`, `theirs`: one direction's). OTHER's threshold is
        scaled by `own`'s base over ``model_threshold``, the default that base replaces (1
        where MODEL keeps its default)."""
        base = float(own.values[0]) if hasattr(own, "values") else float(own)
        scale = base / self.model_threshold if self.model_threshold > 0 else 1.0
        other = min(MAX_THRESHOLD, self.threshold * scale)
        thresholds = []
        for matrix, their_matrix in zip(mine, theirs):
            share = line_share(self.weight, self.long_line, matrix, their_matrix)
            thresholds.append((1.0 - share) * line_threshold(own, *np.shape(matrix)[:2])
                              + share * other if np.size(matrix) else base)
        return thresholds

    def encode(self, block) -> List["EncodedPair"]:
        """The lines of `block` (a Bitext or a block of one) as OTHER reads them."""
        from aligner.extract.inference import encode_bitext

        return encode_bitext(self.loaded, block)

    def soft(self, pairs: Sequence["EncodedPair"], max_tokens: Optional[int], device: Any,
             workers: Any = False, pooling: str = "mean") -> Dict[str, List[np.ndarray]]:
        """OTHER's soft matrices of its encoded `pairs`, per direction, its subwords pooled as
        the main model's (`pooling`; a classical OTHER has words only)."""
        from aligner.extract.inference import soft_alignments_by_direction

        return soft_alignments_by_direction(self.loaded.models, pairs, C.DIRECTIONS,
                                            self.method, max_tokens, device, self.options,
                                            parallel=workers, pooling=pooling)


def resolve_mixture(loaded: "LoadedModelDir", mix_dir: Optional[str],
                    mix_weight: Optional[float], direction: str, heuristic: str, device: Any,
                    mix_length: Optional[int] = None,
                    mix_threshold: Optional[float] = None) -> Optional[Mixture]:
    """The mixture of an extraction with `loaded` (both directions combined by `heuristic`):
    `mix_dir` at `mix_weight` (default recipe.MIX_WEIGHT) where given; else the model
    directory's teacher (:data:`TEACHER_DIR`) at its recorded weight, or at `mix_weight`,
    where config.json records one and the teacher is there; none with `mix_weight` 0, for one
    direction or a heuristic that reads no posteriors. A `mix_weight` for a model with no
    teacher and no `mix_dir` is refused (one line). Its long-line length: `mix_length`, else
    what config.json records (``mix_length``), else 0 (the same weight on every line). Its
    threshold: `mix_threshold`, else OTHER's recorded one (else 0.5), for the teacher
    recipe.TEACHER_MIX_THRESHOLD."""
    from aligner.links.combine import needs_soft
    from aligner.model_dir import config_path, recorded_symmetrization
    from aligner.training import recipe

    if mix_weight == 0 or direction != "both" or not needs_soft(heuristic):
        return None
    settings = recorded_symmetrization(loaded.path, loaded.config)
    long_line = settings.get("mix_length", 0) if mix_length is None else mix_length
    if mix_dir:
        _, model_threshold = loaded.symmetrization(heuristic, None, calibrated=False)
        return Mixture.load(mix_dir, recipe.MIX_WEIGHT if mix_weight is None else mix_weight,
                            device, long_line, model_threshold, mix_threshold)
    recorded = settings.get("mix_weight")
    teacher = os.path.join(loaded.path, TEACHER_DIR)
    present = os.path.isfile(config_path(teacher))
    if recorded and not present:
        logger.warning("%s records a mixture with its teacher, but %s is not there (a copy "
                       "without rounds/?): the network's posteriors alone", loaded.path, teacher)
    if not recorded or not present:
        asked = ", ".join(f"{name} {value}" for name, value, given in
                          (("mix weight", mix_weight, bool(mix_weight)),
                           ("mix length", mix_length, bool(mix_length)),
                           ("mix threshold", mix_threshold, mix_threshold is not None))
                          if given)
        check_condition(not asked, f"{asked}: {loaded.path} records no teacher to mix with "
                                   f"(config.json's mix_weight and {teacher}); mix another "
                                   f"model directory (align extract --mix OTHER_MODEL_DIR)")
        return None
    # the teacher at a threshold of its own, against the recipe's output default
    return Mixture.load(teacher, recorded if mix_weight is None else mix_weight, device,
                        long_line, recipe.THRESHOLD,
                        recipe.TEACHER_MIX_THRESHOLD if mix_threshold is None else mix_threshold)


def long_line_length(bitext, quantile: float) -> int:
    """The `quantile` of the lines' lengths in words (each line's longer side; lines with an
    empty side left out), rounded up: the long-line length the recipe records for its
    mixture (0 for a bitext without a line of two sides)."""
    lengths = np.fromiter((max(len(s), len(t)) for s, t in bitext if s and t), dtype=np.int64)
    if not lengths.size:
        return 0
    return int(np.ceil(np.quantile(lengths, quantile)))


def line_weight(weight: float, long_line: int, words: int) -> float:
    """OTHER's weight on a line of `words` words (its longer side): `weight` up to
    `long_line` words (and everywhere with `long_line` 0), then growing linearly to 1 at
    2 · `long_line` (the module docstring's W(n))."""
    if long_line <= 0 or words <= long_line:
        return weight
    return weight + (1.0 - weight) * min(1.0, (words - long_line) / long_line)


def line_share(weight: float, long_line: int, mine: np.ndarray, theirs: np.ndarray) -> float:
    """OTHER's share of a line whose matrices (one direction's) are MODEL's `mine` and
    OTHER's `theirs`: line_weight(weight, long_line, its longer side), or 0 where either has
    no elements (a line MODEL or OTHER cannot align: MODEL's alone). One error line where
    the two split the line into different words."""
    if np.size(theirs) == 0 or np.size(mine) == 0:
        return 0.0
    check_condition(np.shape(mine) == np.shape(theirs),
                    f"the mixed models see a line as {np.shape(mine)} and {np.shape(theirs)} "
                    f"words: they split words differently")
    return line_weight(weight, long_line, max(np.shape(mine)))


def mix(own: Dict[str, List[np.ndarray]], other: Dict[str, List[np.ndarray]], weight: float,
        long_line: int = 0) -> Dict[str, List[np.ndarray]]:
    """Per direction and line of (source words, target words) = (S, T), (1 - w) · own + w ·
    other (float32) with w = line_weight(weight, long_line, max(S, T)); a line without
    elements in `own` stays so, one without elements in `other` keeps `own`'s."""
    mixed: Dict[str, List[np.ndarray]] = {}
    for direction, matrices in own.items():
        check_condition(len(matrices) == len(other[direction]),
                        "a mixture needs both models' matrices of every line")
        lines = []
        for mine, theirs in zip(matrices, other[direction]):
            share = line_share(weight, long_line, mine, theirs)
            if share == 0.0:
                lines.append(mine)
            else:
                lines.append(((1.0 - share) * np.asarray(mine, dtype=np.float32)
                              + share * np.asarray(theirs, dtype=np.float32)))
        mixed[direction] = lines
    return mixed
