"""`align calibrate`: the output's thresholds per line length, calibrated on a bitext."""
from __future__ import annotations

from typing import Optional

import click

from aligner.cli.options import (device_option, inference_precision_option, quiet_option,
                                 seed_option, shortlist_option, subword_pooling_option,
                                 threads_option)
from aligner.cli.train import bitext_options, check_bitext_args, set_threads
from aligner.training import recipe


@click.command("calibrate", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False))
@bitext_options
@shortlist_option
@subword_pooling_option
@device_option
@inference_precision_option
@seed_option
@threads_option()
@quiet_option
def command(model_dir: str, source: Optional[str], target: Optional[str],
            joint: Optional[str], shortlist: int, subword_pooling: str, device: str,
            precision: str, seed: int, threads: int, quiet: bool) -> None:
    """Calibrate MODEL_DIR's soft-average output on a bitext: measure how its posteriors
    spread with the line length (up to 300 lines per length bucket: under 15 words, 15-24,
    25-39, 40 and more) and write MODEL_DIR/calibration.json, with which align extract
    scales its threshold per line length (aligner/links/calibration.py). align run and a
    self-training align train calibrate on their training bitext by themselves; this is for
    another text, or a model directory of an older version."""
    from aligner.extract.calibrate import calibrate, write_calibration
    from aligner.extract.corpus_alignment import Extraction
    from aligner.formats import open_bitext
    from aligner.links.calibration import Calibration
    from aligner.log import setup_logging
    from aligner.model_dir import LoadedModelDir
    from aligner.precision import resolve_precision
    from aligner.distributed import resolve_device

    setup_logging(quiet=quiet)
    set_threads(threads)
    check_bitext_args(source, target, joint, "the sentence pairs")
    bitext = open_bitext(source, target, joint)
    torch_device = resolve_device(device)
    loaded = LoadedModelDir.load(model_dir, device=torch_device)
    heuristic, threshold = loaded.symmetrization("soft-average", calibrated=False)
    model = next(iter(loaded.models.values()))
    method = model.METHODS[0]
    options = {"shortlist": shortlist} if method in model.SHORTLIST_METHODS else {}
    extraction = Extraction(loaded, method, "both", heuristic, threshold, torch_device, options,
                            pooling=subword_pooling)
    inference_precision = resolve_precision(precision, torch_device, inference=True)
    record = calibrate(extraction, bitext, seed, recipe.CALIBRATION_LINES, inference_precision)
    path = write_calibration(model_dir, record)
    thresholds = Calibration.from_dict(record).thresholds(threshold, recipe.CALIBRATION_BETA)
    click.echo(f"align calibrate: {record['lines']} lines of {len(bitext)}; wrote {path}: "
               f"thresholds {thresholds.describe()}", err=True)
