"""The output's thresholds per line length, calibrated on the model's own posteriors
(aligner/links/calibration.py, aligner/extract/calibrate.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from aligner.formats import read_pharaoh
from aligner.links.calibration import (BINS, MIN_LINES, Calibration, Histogram,
                                       LengthThresholds, bucket_of)
from aligner.links.soft_symmetrize import line_threshold, soft_average, soft_average_corpus
from aligner.training import recipe
from aligner.utils import AlignerError
from cli_runner import error_line, run
from conftest import restored_aligner_logger
from synthetic import monotone_corpus, write_corpus
from test_self_training import RUN_TINY


def test_buckets_cut_the_longer_side_at_the_edges():
    assert [bucket_of(i, 3) for i in (1, 14, 15, 24, 25, 39, 40, 200)] == \
        [0, 0, 1, 1, 2, 2, 3, 3]
    assert bucket_of(3, 30) == 2 and bucket_of(0, 0, edges=(5,)) == 0


@pytest.mark.parametrize("beta", [0.5, 0.7, 1.0, 2.0])
def test_the_histograms_threshold_maximizes_the_expected_f_of_the_kept_links(beta):
    """Brute force: posteriors at bin centres, every cut of the sorted values tried; the
    expected F_beta of the links the threshold keeps is the best of them."""
    rng = np.random.default_rng(3)
    values = (rng.integers(0, BINS, size=400) + 0.5) / BINS
    values = values ** 3                         # mostly small, a few large
    values = (np.floor(values * BINS) + 0.5) / BINS
    histogram = Histogram.empty()
    histogram.add(values.reshape(20, 20))
    total, b2 = values.sum(), beta * beta

    def expected_f(kept):
        return (1 + b2) * kept.sum() / (len(kept) + b2 * total)

    ordered = np.sort(values)[::-1]
    best = max(expected_f(ordered[:k]) for k in range(1, len(ordered) + 1))
    threshold = histogram.threshold(beta)
    assert expected_f(values[values >= threshold]) == pytest.approx(best)
    assert Histogram.empty().threshold(beta) == 1.0


def test_thresholds_scale_the_base_by_each_buckets_ratio_to_the_shortest_lines():
    """Short lines with sharp posteriors, long ones with spread posteriors: the long lines'
    threshold is the base times the ratio of their expected-F thresholds; a bucket with fewer
    than MIN_LINES lines takes the pooled threshold."""
    calibration = Calibration(edges=(5,))
    sharp = np.eye(3) * 0.9 + 0.02
    spread = np.full((8, 8), 0.05)
    spread[np.arange(8), np.arange(8)] = 0.45
    for _ in range(MIN_LINES):
        calibration.add(sharp, sharp)
        calibration.add(spread, spread)
    expected = calibration.expected_f_thresholds(0.7)
    assert expected[1] < expected[0]
    thresholds = calibration.thresholds(0.55, 0.7)
    assert thresholds.values[0] == pytest.approx(0.55)
    assert thresholds.values[1] == pytest.approx(0.55 * expected[1] / expected[0])
    assert thresholds.for_shape(8, 2) == thresholds.values[1]
    few = Calibration(edges=(5,))
    for _ in range(MIN_LINES):
        few.add(sharp, sharp)
    few.add(spread, spread)                       # one long line: the pooled threshold
    pooled = few.histograms[0].merged(few.histograms[1]).threshold(0.7)
    assert few.expected_f_thresholds(0.7)[1] == pooled
    again = Calibration.from_dict(json.loads(json.dumps(calibration.to_dict())))
    assert again.thresholds(0.55, 0.7) == thresholds


def test_soft_average_takes_each_lines_threshold_from_its_length():
    thresholds = LengthThresholds((3,), (0.6, 0.3))
    short = np.full((2, 2), 0.4)                  # under 0.6: nothing
    long = np.full((4, 2), 0.4)                   # over 0.3: everything
    assert soft_average_corpus([short, long], [short, long], thresholds) == \
        [set(), {(i, j) for i in range(4) for j in range(2)}]
    assert soft_average(long, long, 0.5) == set()
    # one threshold per line (a mixture's): the first line's 0.3 keeps it, the second's 0.5 not
    assert soft_average_corpus([short, long], [short, long], [0.3, 0.5]) == \
        [{(i, j) for i in range(2) for j in range(2)}, set()]
    with pytest.raises(AlignerError, match="2 thresholds for 1 sentence pairs"):
        soft_average_corpus([short], [short], [0.3, 0.5])


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """align run (two rounds) on 40 synthetic lines of 2-20 words, its model kept."""
    tmp = tmp_path_factory.mktemp("calibrated")
    sources, targets, golds = monotone_corpus(40, min_len=2, max_len=20, seed=8)
    src, tgt, _ = write_corpus(tmp, "c", sources, targets, golds)
    out, model = tmp / "o.align", tmp / "m"
    with restored_aligner_logger():
        result = run("run", "-s", src, "-t", tgt, "-o", out, "--model-dir", model,
                     "--max-updates", "6", *RUN_TINY, "-M", "max_positions=32")
    return dict(src=src, tgt=tgt, out=out, model=model, log=result.stderr, tmp=tmp,
                sources=sources, targets=targets)


def test_align_run_calibrates_on_its_bitext_and_extract_aligns_the_same(calibrated):
    model = calibrated["model"]
    record = json.loads((model / "calibration.json").read_text())
    assert record["lines"] == 40 and record["options"] == {"shortlist": 2000}
    assert record["subword pooling"] == recipe.SUBWORD_POOLING == "max"
    assert [h["lines"] for h in record["histograms"]] == [
        sum(1 for s, t in zip(calibrated["sources"], calibrated["targets"])
            if bucket_of(len(s), len(t)) == k) for k in range(4)]
    settings = json.loads((model / "config.json").read_text())["extra"]["align_run"]
    lengths = [max(len(s), len(t)) for s, t in zip(calibrated["sources"], calibrated["targets"])
               if s and t]
    assert settings == {"symmetrize": "soft-average", "threshold": 0.55,
                        "mix_weight": recipe.MIX_WEIGHT,
                        "mix_length": int(np.ceil(np.quantile(lengths, 0.99)))}
    again = calibrated["tmp"] / "again.align"
    run("extract", model, "-s", calibrated["src"], "-t", calibrated["tgt"], "-o", again, "-q")
    assert again.read_text() == calibrated["out"].read_text()


def test_uncalibrated_is_one_threshold_and_calibrated_scales_the_given_one(calibrated):
    """--uncalibrated: soft-average of the --soft matrices (mixed with the teacher's) at 0.55
    for the network's share of every line, recipe.TEACHER_MIX_THRESHOLD for the teacher's
    share; --threshold 0.4: the calibration's thresholds for the base 0.4 line by line, and the
    teacher's scaled by 0.4 / 0.55 (aligner.extract.mixture.MixedThresholds)."""
    from aligner.extract.mixture import line_weight

    model, tmp = calibrated["model"], calibrated["tmp"]
    settings = json.loads((model / "config.json").read_text())["extra"]["align_run"]

    def mixed(own, base):   # every line is aligned by both models here
        weights = [line_weight(settings["mix_weight"], settings["mix_length"], max(m.shape))
                   for m in forward]
        return [(1 - w) * line_threshold(own, *m.shape)
                + w * recipe.TEACHER_MIX_THRESHOLD * base / 0.55
                for w, m in zip(weights, forward)]

    soft = tmp / "soft.npz"
    plain, scaled = tmp / "plain.align", tmp / "scaled.align"
    bitext = ["-s", calibrated["src"], "-t", calibrated["tgt"]]
    run("extract", model, *bitext, "-o", plain, "--uncalibrated", "--soft", soft, "-q")
    run("extract", model, *bitext, "-o", scaled, "--threshold", "0.4", "-q")
    matrices = np.load(soft)
    forward = [matrices[f"fwd_{k}"] for k in range(40)]
    reverse = [matrices[f"rev_{k}"] for k in range(40)]
    assert read_pharaoh(str(plain)) == soft_average_corpus(forward, reverse, mixed(0.55, 0.55))
    calibration = Calibration.from_dict(json.loads((model / "calibration.json").read_text()))
    assert read_pharaoh(str(scaled)) == soft_average_corpus(
        forward, reverse, mixed(calibration.thresholds(0.4, recipe.CALIBRATION_BETA), 0.4))


def test_a_calibration_is_kept_only_for_its_own_subword_pooling(calibrated, monkeypatch):
    """calibrated_extraction (align run's) measures anew when the record was made with another
    pooling: a record without the key counts as the mean's, as every record before it."""
    import torch

    from aligner.extract import calibrate as calibrate_module
    from aligner.extract.corpus_alignment import Extraction, shortlist_options
    from aligner.formats import read_bitext

    model = str(calibrated["model"])
    record = json.loads((calibrated["model"] / "calibration.json").read_text())
    bitext = read_bitext(str(calibrated["src"]), str(calibrated["tgt"]))
    measured = []
    real = calibrate_module.calibrate
    monkeypatch.setattr(calibrate_module, "calibrate",
                        lambda extraction, *rest: measured.append(extraction.pooling)
                        or real(extraction, *rest))
    monkeypatch.setattr(calibrate_module, "read_calibration", lambda path: dict(record))

    def calibrate(pooling):
        extraction = Extraction.load(model, torch.device("cpu"), recipe.METHOD, "soft-average",
                                     0.55, shortlist_options(recipe.SHORTLIST), pooling=pooling)
        calibrate_module.calibrated_extraction(extraction, bitext, 1, record["precision"],
                                               write=False)

    calibrate("max")
    assert measured == []
    calibrate("mean")
    assert measured == ["mean"]
    del record["subword pooling"]   # as written before the key: the mean's
    calibrate("mean")
    assert measured == ["mean"]
    calibrate("max")
    assert measured == ["mean", "max"]


def test_extract_takes_the_subword_pooling_its_calibration_was_measured_with(calibrated,
                                                                            tmp_path):
    """LoadedModelDir.subword_pooling (align extract's and the API's default): a given one,
    else the calibration record's (a record without the key: the mean, as written before it),
    else the recipe's; align calibrate records the one it measured with."""
    import shutil

    from aligner.model_dir import LoadedModelDir

    model = tmp_path / "m"
    shutil.copytree(calibrated["model"], model)
    path = model / "calibration.json"

    def pooling(given=None):
        return LoadedModelDir.load(str(model)).subword_pooling(given)

    assert pooling() == recipe.SUBWORD_POOLING == "max" and pooling("mean") == "mean"
    run("calibrate", model, "-s", calibrated["src"], "-t", calibrated["tgt"], "-q",
        "--subword-pooling", "mean")
    assert "subword pooling" not in json.loads(path.read_text()) and pooling() == "mean"
    run("calibrate", model, "-s", calibrated["src"], "-t", calibrated["tgt"], "-q")
    assert json.loads(path.read_text())["subword pooling"] == "max" and pooling() == "max"
    path.unlink()
    assert pooling() == recipe.SUBWORD_POOLING
    with pytest.raises(AlignerError, match="subword pooling must be one of mean, max"):
        pooling("sum")


def test_a_damaged_calibration_is_one_error_line(calibrated, tmp_path):
    import shutil

    model = tmp_path / "m"
    shutil.copytree(calibrated["model"], model)
    (model / "calibration.json").write_text("{\"edges\": [15]}")
    line = error_line(run("extract", model, "-s", calibrated["src"], "-t", calibrated["tgt"],
                          "-o", tmp_path / "o", "-q", ok=False))
    assert "calibration.json: not a calibration record" in line
