"""A second model directory's posteriors mixed into a model's own: ``align extract MODEL --mix
OTHER [--mix-weight W]``.

Each direction's word-level soft alignment of a line becomes

    p(i, j) = (1 - W) · p_MODEL(i, j) + W · p_OTHER(i, j)

before the two directions are combined (soft-average at MODEL's thresholds, its calibration
per line length included), written (--soft) or scored (--link-probs). OTHER is meant to be the
classical aligner trained on the same bitext (``align train --model classical``): the neural
recipe and the classical HMM err on different lines, the neural rounds most on lines far
longer than those they trained on, where the classical HMM's jumps hold
(eval/results/mix_classical.md). Any model directory of both directions works (another seed
of the recipe: an ensemble); each side reads the input through its own preprocessing (its
BPE, its lowercasing), and both give one (source words, target words) matrix per line.

A line one of the two cannot align (a side too long for its model: an empty matrix) takes
the other's matrix alone; a line with an empty side has no links either way. The
per-direction hard links (``fwd`` / ``rev`` outputs of `align run`) stay MODEL's own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import numpy as np

from aligner import constants as C
from aligner.utils import check_condition

if TYPE_CHECKING:  # pragma: no cover
    from aligner.data import EncodedPair
    from aligner.model_dir import LoadedModelDir

@dataclass
class Mixture:
    """The other model directory of a mixture (both directions loaded), its extraction method
    (its kind's first: posteriors) with that method's default options, and its weight W."""

    loaded: "LoadedModelDir"
    method: str
    options: Dict[str, Any]
    weight: float

    @classmethod
    def load(cls, model_dir: str, weight: float, device: Any) -> "Mixture":
        from aligner.extract.inference import default_options
        from aligner.model_dir import LoadedModelDir

        check_condition(0.0 < weight <= 1.0, f"--mix-weight must be in (0, 1]: {weight}")
        loaded = LoadedModelDir.load(model_dir, C.DIRECTIONS, "best", device)
        model = loaded.models[C.DIRECTIONS[0]]
        method = model.METHODS[0]
        return cls(loaded, method, default_options(model, method, {}), weight)

    def identity(self) -> Dict[str, Any]:
        """What the mixed output depends on, for a parts record: OTHER's files, method,
        options and W."""
        from aligner.model_dir import model_checksums

        return {"model": model_checksums(self.loaded.path, C.DIRECTIONS),
                "method": self.method, "options": self.options, "weight": self.weight}

    def encode(self, block) -> List["EncodedPair"]:
        """The lines of `block` (a Bitext or a block of one) as OTHER reads them."""
        from aligner.extract.inference import encode_bitext

        return encode_bitext(self.loaded, block)

    def soft(self, pairs: Sequence["EncodedPair"], max_tokens: Optional[int], device: Any,
             workers: Any = False) -> Dict[str, List[np.ndarray]]:
        """OTHER's soft matrices of its encoded `pairs`, per direction."""
        from aligner.extract.inference import soft_alignments_by_direction

        return soft_alignments_by_direction(self.loaded.models, pairs, C.DIRECTIONS,
                                            self.method, max_tokens, device, self.options,
                                            parallel=workers)


def mix(own: Dict[str, List[np.ndarray]], other: Dict[str, List[np.ndarray]], weight: float
        ) -> Dict[str, List[np.ndarray]]:
    """Per direction and line, (1 - weight) · own + weight · other (float32); a line whose
    matrix is empty on one side takes the other side's (see the module docstring)."""
    mixed: Dict[str, List[np.ndarray]] = {}
    for direction, matrices in own.items():
        check_condition(len(matrices) == len(other[direction]),
                        "a mixture needs both models' matrices of every line")
        lines = []
        for mine, theirs in zip(matrices, other[direction]):
            if np.size(theirs) == 0:
                lines.append(mine)
            elif np.size(mine) == 0:
                lines.append(np.asarray(theirs, dtype=np.float32))
            else:
                check_condition(mine.shape == theirs.shape,
                                f"the mixed models see a line as {mine.shape} and "
                                f"{theirs.shape} words: they split words differently")
                lines.append(((1.0 - weight) * np.asarray(mine, dtype=np.float32)
                              + weight * np.asarray(theirs, dtype=np.float32)))
        mixed[direction] = lines
    return mixed
