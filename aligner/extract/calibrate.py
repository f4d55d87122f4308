"""The calibration of a model's output decision on a bitext: soft-average thresholds per line
length from the model's own posteriors (aligner/links/calibration.py), measured on a sample
of the bitext's lines and kept in the model directory as ``calibration.json``.

The sample: up to ``per_bucket`` lines of each length bucket (max(source words, target
words); lines with an empty side left out), drawn with numpy's PCG64 seeded with `seed`, so
that the long lines a bitext has few of weigh as much as the short ones it has many of. The
posteriors are those the output uses: the extraction's method and options (the lexicon
shortlist), at its precision. ``align run`` and a self-training ``align train`` calibrate on
their training bitext (its lines as given, not joined) after the last round; ``align extract``
reads the file (aligner.model_dir.LoadedModelDir.symmetrization) and scales its base
threshold (--threshold) by it.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Optional

import numpy as np

from aligner import constants as C
from aligner.formats import Bitext
from aligner.links.calibration import BUCKET_EDGES, Calibration, bucket_of
from aligner.training import recipe
from aligner.utils import AlignerError, atomic_output, check_condition

logger = logging.getLogger(__name__)

#: the random stream of the sample, apart from the rounds' samples and the joined runs
_STREAM = 3_000_017


def calibration_lines(bitext, per_bucket: int, seed: int,
                      edges=BUCKET_EDGES) -> List[int]:
    """Sorted 0-based lines of `bitext`: up to `per_bucket` drawn from each length bucket
    (all of a bucket that has fewer), lines with an empty side left out; one pass."""
    buckets = np.asarray([bucket_of(len(s), len(t), edges) if s and t else -1
                          for s, t in bitext], dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64([seed, _STREAM]))
    chosen: List[np.ndarray] = []
    for bucket in range(len(edges) + 1):
        lines = np.flatnonzero(buckets == bucket)
        if len(lines) > per_bucket:
            lines = rng.choice(lines, size=per_bucket, replace=False)
        chosen.append(lines)
    return sorted(int(k) for k in np.concatenate(chosen)) if chosen else []


def calibrate(extraction, bitext, seed: int, per_bucket: int, precision: str = "fp32"
              ) -> Dict[str, Any]:
    """The calibration record of `extraction` (aligner.extract.corpus_alignment.Extraction of
    both directions) on `bitext`: its sample's posteriors as :class:`Calibration` histograms,
    with what made them."""
    from aligner.extract import inference
    from aligner.precision import autocast_context

    lines = calibration_lines(bitext, per_bucket, seed)
    pairs = list(bitext.pairs_at(lines))
    sample = Bitext([s for s, _ in pairs], [t for _, t in pairs], bitext.source_name,
                    bitext.target_name)
    loaded = extraction.loaded
    encoded = inference.encode_bitext(loaded, sample)
    with autocast_context(precision, extraction.device):
        soft = inference.soft_alignments_by_direction(
            loaded.models, encoded, C.DIRECTIONS, extraction.method, extraction.max_tokens,
            extraction.device, extraction.options, pooling=extraction.pooling)
    calibration = Calibration()
    calibration.add_lines(zip(soft["fwd"], soft["rev"]))
    return {"format": 1, **_identity(extraction, precision), "seed": seed,
            "lines per bucket": per_bucket, "lines": len(lines),
            **calibration.to_dict()}


def _identity(extraction, precision: str) -> Dict[str, Any]:
    """What the posteriors of a calibration depend on: the model's files, the method, its
    options, the precision and the subword pooling (a record without ``subword pooling``
    was measured with the mean, as every record before the key)."""
    from aligner.extract.inference import pooling_entry
    from aligner.model_dir import model_checksums
    from aligner.precision import resolve_precision

    return {"model": model_checksums(extraction.loaded.path, C.DIRECTIONS),
            "method": extraction.method, "options": extraction.options,
            "precision": resolve_precision(precision, extraction.device),
            **pooling_entry(extraction.pooling)}


def write_calibration(model_dir: str, record: Dict[str, Any]) -> str:
    path = os.path.join(model_dir, C.CALIBRATION_NAME)
    with atomic_output(path) as handle:
        json.dump(record, handle)
        handle.write("\n")
    return path


def read_calibration(model_dir: str) -> Optional[Dict[str, Any]]:
    """The model directory's calibration record, or None when it has none; one error line
    for a file that cannot be read."""
    path = os.path.join(model_dir, C.CALIBRATION_NAME)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
        Calibration.from_dict(record)
        return record
    except (OSError, ValueError, KeyError, TypeError, IndexError, AlignerError) as error:
        raise AlignerError(f"{path}: not a calibration record ({error})") from None


def calibrated_extraction(extraction, bitext, seed: int, precision: str, write: bool):
    """`extraction` with its soft-average threshold (the base) calibrated per line length
    (:meth:`Calibration.thresholds`): from the model directory's calibration.json when it was
    made for this model, method, options, precision and subword pooling, else measured now
    on `bitext` (and kept there when `write`: rank 0 of a torchrun job, which writes
    alone)."""
    import dataclasses

    from aligner.extract.inference import recorded_pooling

    record = read_calibration(extraction.loaded.path)
    identity = json.loads(json.dumps(_identity(extraction, precision)))
    if (record is None or any(record.get(key) != value for key, value in identity.items())
            or recorded_pooling(record) != extraction.pooling):
        check_condition(extraction.direction == "both", "calibration needs both directions")
        record = calibrate(extraction, bitext, seed, recipe.CALIBRATION_LINES, precision)
        if write:
            write_calibration(extraction.loaded.path, record)
        logger.info("calibrated the output on %d lines of the bitext (up to %d per length "
                    "bucket)", record["lines"], recipe.CALIBRATION_LINES)
    thresholds = Calibration.from_dict(record).thresholds(float(extraction.threshold),
                                                          recipe.CALIBRATION_BETA)
    logger.info("output thresholds by line length (the model's share of a line mixed with "
                "another's): %s", thresholds.describe())
    return dataclasses.replace(extraction, threshold=thresholds)
