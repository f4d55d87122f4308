"""`align extract MODEL --mix OTHER --mix-weight W` (aligner/extract/mixture.py): each
direction's soft matrices are (1 - W) · MODEL's + W · OTHER's, the output is the soft-average
of those, the same bytes in one process, in block processes and from a pipe, and misuse gets
one error line. Two classical models trained on different synthetic lines stand in for the
recipe and the classical aligner (both give word-level posteriors, in seconds)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from aligner.formats import format_links
from aligner.extract.mixture import line_weight, long_line_length, mix
from aligner.links.soft_symmetrize import soft_average
from aligner.training import recipe
from cli_runner import error_line, run
from conftest import ROOT, restored_aligner_logger
from synthetic import one_swap_corpus, write_lines

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two classical model directories trained on different lines (the second with fewer EM
    iterations, so that their posteriors differ) and a text to align: 60 new lines, one with
    an empty target side."""
    root = tmp_path_factory.mktemp("mixture")
    for name, seed, flags in (("a", 1, []), ("b", 2, ["-M", "ibm1_iterations=2",
                                                      "-M", "hmm_iterations=1"])):
        source, target = one_swap_corpus(300, seed, vocabulary=30)[:2]
        with restored_aligner_logger():   # (module scope: before the per-test snapshot)
            run("train", "--model", "classical", "-q", *flags, "-o", root / name,
                "-s", write_lines(root / f"{name}.src", source),
                "-t", write_lines(root / f"{name}.tgt", target))
    source, target = one_swap_corpus(60, 3, vocabulary=30)[:2]
    target[7] = ""
    return {"a": str(root / "a"), "b": str(root / "b"), "root": root,
            "src": write_lines(root / "new.src", source),
            "tgt": write_lines(root / "new.tgt", target)}


def _soft(path):
    with np.load(path) as arrays:
        return {key: arrays[key] for key in arrays.files}


def test_the_mixture_is_the_weighted_mean_of_both_models_matrices(models):
    root, text = models["root"], ["-s", models["src"], "-t", models["tgt"], "-q"]
    run("extract", models["a"], *text, "-o", root / "a.align", "--soft", root / "a.npz")
    run("extract", models["b"], *text, "-o", root / "b.align", "--soft", root / "b.npz")
    run("extract", models["a"], *text, "--mix", models["b"], "--mix-weight", "0.3",
        "-o", root / "m.align", "--soft", root / "m.npz")
    run("extract", models["a"], *text, "--mix", models["b"], "-o", root / "d.align",
        "--soft", root / "d.npz")
    a, b, m, d = (_soft(root / f"{name}.npz") for name in "abmd")
    assert sorted(m) == sorted(a) == sorted(d)
    differ = 0
    for key in a:
        if a[key].size == 0:   # the line with an empty side: nothing either way
            assert m[key].size == 0 and b[key].size == 0
            continue
        np.testing.assert_allclose(m[key], 0.7 * a[key] + 0.3 * b[key], atol=1e-6)
        np.testing.assert_allclose(d[key], (1 - recipe.MIX_WEIGHT) * a[key]
                                   + recipe.MIX_WEIGHT * b[key], atol=1e-6)
        differ += not np.allclose(a[key], b[key], atol=1e-3)
    assert differ > 10   # the two models do disagree, so the mixture is a test of the mean
    # the output: soft-average of the mixed matrices at the models' thresholds (classical: 0.5)
    lines = (root / "m.align").read_text().splitlines(keepends=True)
    assert len(lines) == 60 and lines[7] == "\n"
    expected = [format_links(soft_average(m[f"fwd_{k}"], m[f"rev_{k}"], 0.5)) + "\n"
                for k in range(60)]
    assert lines == expected
    assert lines != (root / "a.align").read_text().splitlines(keepends=True)


def test_the_weight_grows_on_lines_longer_than_the_long_line_length():
    """line_weight by hand: W up to L words, then linear to 1 at 2L; L = 0: W everywhere."""
    assert line_weight(0.25, 0, 500) == 0.25
    assert line_weight(0.25, 10, 10) == 0.25
    assert line_weight(0.25, 10, 15) == 0.625
    assert line_weight(0.25, 10, 12) == 0.25 + 0.75 * 0.2
    assert line_weight(0.25, 10, 20) == line_weight(0.25, 10, 41) == 1.0
    own = {"fwd": [np.ones((3, 4), np.float32), np.ones((2, 2), np.float32)], "rev": [
        np.ones((3, 4), np.float32), np.zeros((0, 0), np.float32)]}
    other = {"fwd": [np.zeros((3, 4), np.float32), np.zeros((2, 2), np.float32)],
             "rev": [np.zeros((3, 4), np.float32), np.zeros((0, 0), np.float32)]}
    mixed = mix(own, other, 0.25, long_line=2)   # 4 words: 1 - (0.25 + 0.75) = 0
    np.testing.assert_allclose(mixed["fwd"][0], 0.0)
    np.testing.assert_allclose(mixed["fwd"][1], 0.75)   # 2 words: W
    assert mixed["rev"][1].size == 0


def test_the_long_line_length_is_a_quantile_of_the_line_lengths():
    """The longer side of each line; lines with an empty side left out; rounded up."""
    bitext = [(["a"] * 2, ["b"]), (["a"] * 4, ["b"] * 3), (["a"], ["b"] * 6), ([], ["b"] * 50),
              (["a"] * 8, ["b"] * 2), (["a"] * 10, ["b"] * 10)]   # lengths 2 4 6 8 10
    assert long_line_length(bitext, 0.5) == 6
    assert long_line_length(bitext, 0.99) == 10   # 9.92 rounded up
    assert long_line_length(bitext, 0.3) == 5     # 4.4 rounded up
    assert long_line_length([([], ["b"])], 0.99) == 0


def test_longer_lines_take_more_of_the_other_model(models):
    """--mix-length L: each line's matrices are (1 - w) · MODEL's + w · OTHER's with w =
    line_weight(W, L, its longer side); a length recorded in MODEL's config.json is the
    default, --mix-length 0 the same W everywhere."""
    import json
    import shutil

    root, text = models["root"], ["-s", models["src"], "-t", models["tgt"], "-q"]
    mixed = ["--mix", models["b"], "--mix-weight", "0.3"]
    for name, model in (("a", models["a"]), ("b", models["b"])):
        run("extract", model, *text, "-o", root / f"{name}.l.align", "--soft",
            root / f"{name}.l.npz")
    run("extract", models["a"], *text, *mixed, "--mix-length", "4", "-o", root / "l4.align",
        "--soft", root / "l4.npz")
    a, b, l4 = _soft(root / "a.l.npz"), _soft(root / "b.l.npz"), _soft(root / "l4.npz")
    weights = set()
    for key in a:
        if a[key].size:
            w = line_weight(0.3, 4, max(a[key].shape))
            np.testing.assert_allclose(l4[key], (1 - w) * a[key] + w * b[key], atol=1e-6)
            weights.add(round(w, 6))
    assert {0.3, 1.0} < weights   # lines of at most 4, of 8 and more, and between
    recorded = root / "a_recorded"
    shutil.copytree(models["a"], recorded)
    config = json.loads((recorded / "config.json").read_text())
    config["extra"]["align_run"] = {"mix_length": 4}
    (recorded / "config.json").write_text(json.dumps(config))
    run("extract", recorded, *text, *mixed, "-o", root / "r.align")
    assert (root / "r.align").read_bytes() == (root / "l4.align").read_bytes()
    run("extract", recorded, *text, *mixed, "--mix-length", "0", "-o", root / "r0.align")
    run("extract", models["a"], *text, *mixed, "-o", root / "w.align")
    assert (root / "r0.align").read_bytes() == (root / "w.align").read_bytes()
    assert (root / "r0.align").read_bytes() != (root / "r.align").read_bytes()


def test_mixed_thresholds_by_hand():
    """Each share at its own threshold: (1 - w) · MODEL's (per line length) + w · OTHER's,
    w growing on long lines, 0 where OTHER has no matrix; a base threshold other than the
    default scales OTHER's by the same ratio."""
    from aligner.extract.mixture import Mixture
    from aligner.links.calibration import LengthThresholds

    own = LengthThresholds((15,), (0.6, 0.3))   # lines of 15 words and more: 0.3
    mixture = Mixture("other", "hmm-posterior", {}, 0.25, "cpu", 10, threshold=0.5,
                      model_threshold=0.6)
    shapes = [(4, 5), (12, 3), (16, 15), (30, 2), (30, 2), (0, 3)]
    mine = [np.ones(shape) for shape in shapes]
    theirs = [np.ones(shape) for shape in shapes[:4]] + [np.zeros((0, 0)), np.ones((0, 3))]
    assert mixture.thresholds(own, mine, theirs) == pytest.approx([
        0.75 * 0.6 + 0.25 * 0.5,
        0.6 * 0.6 + 0.4 * 0.5,     # w = 0.25 + 0.75 · 0.2
        0.3 * 0.3 + 0.7 * 0.5,     # w = 0.25 + 0.75 · 0.6, MODEL's long-line threshold
        0.5,                       # OTHER alone from 2L words on
        0.3,                       # OTHER cannot align the line: MODEL's alone, at its own
        0.6])                      # nobody aligns it (no links either way)
    halved = mixture.thresholds(0.3, mine[:4], theirs[:4])   # a base of half the default
    assert halved == pytest.approx([0.75 * 0.3 + 0.25 * 0.25, 0.6 * 0.3 + 0.4 * 0.25,
                                    0.3 * 0.3 + 0.7 * 0.25, 0.25])


def test_each_model_s_share_is_judged_at_its_own_threshold(models):
    """MODEL records soft-average at 0.7, OTHER (classical) has 0.5: a line's output is the
    mixed matrices' soft-average at (1 - w) · 0.7 + w · 0.5; --threshold 0.35 halves both."""
    import json
    import shutil

    root, text = models["root"], ["-s", models["src"], "-t", models["tgt"], "-q"]
    recorded = root / "a_at_07"
    shutil.copytree(models["a"], recorded)
    config = json.loads((recorded / "config.json").read_text())
    config["extra"]["align_run"] = {"symmetrize": "soft-average", "threshold": 0.7}
    (recorded / "config.json").write_text(json.dumps(config))
    mixed = ["--mix", models["b"], "--mix-weight", "0.3", "--mix-length", "4"]
    for name, flags in (("t07", []), ("t035", ["--threshold", "0.35"])):
        run("extract", recorded, *text, *mixed, *flags, "-o", root / f"{name}.align",
            "--soft", root / f"{name}.npz")
    soft = _soft(root / "t07.npz")
    shares = set()
    for name, own, other in (("t07", 0.7, 0.5), ("t035", 0.35, 0.25)):
        lines = (root / f"{name}.align").read_text().splitlines(keepends=True)
        expected = []
        for k in range(60):
            forward, reverse = soft[f"fwd_{k}"], soft[f"rev_{k}"]
            w = line_weight(0.3, 4, max(forward.shape)) if forward.size else 0.0
            shares.add(round(w, 6))
            expected.append(format_links(soft_average(forward, reverse,
                                                      (1 - w) * own + w * other)) + "\n")
        assert lines == expected
    assert {0.3, 1.0} < shares
    assert ((root / "t07.align").read_bytes() != (root / "t035.align").read_bytes())
    run("extract", recorded, *text, *mixed, "--threshold", "0.35", "-o", root / "t035b.align",
        "--processes", "2", "--block-lines", "16")   # block processes: the same bytes
    assert (root / "t035b.align").read_bytes() == (root / "t035.align").read_bytes()
    # the whole line at MODEL's threshold (as before OTHER kept its own) differs
    at_own = [format_links(soft_average(soft[f"fwd_{k}"], soft[f"rev_{k}"], 0.7)) + "\n"
              for k in range(60)]
    assert (root / "t07.align").read_text().splitlines(keepends=True) != at_own


def test_the_recipe_s_teacher_is_judged_at_the_teacher_mix_threshold(models):
    """A model directory with its teacher in rounds/0 (as `align run` leaves it) mixes it in
    by default at the weight it records, and judges the teacher's share at
    recipe.TEACHER_MIX_THRESHOLD, not at the 0.5 the teacher's directory records: a line's
    output is the mixed matrices' soft-average at (1 - w) · 0.55 + w · 0.45."""
    import json
    import shutil

    root = models["root"]
    recipe_like = root / "recipe_like"
    shutil.copytree(models["a"], recipe_like)
    shutil.copytree(models["b"], recipe_like / "rounds" / "0")
    config = json.loads((recipe_like / "config.json").read_text())
    config["extra"]["align_run"] = {"symmetrize": "soft-average", "threshold": recipe.THRESHOLD,
                                    "mix_weight": 0.3, "mix_length": 4}
    (recipe_like / "config.json").write_text(json.dumps(config))
    run("extract", recipe_like, "-s", models["src"], "-t", models["tgt"], "-q",
        "-o", root / "recipe_like.align", "--soft", root / "recipe_like.npz")
    soft = _soft(root / "recipe_like.npz")

    def judged_at(teacher_threshold):
        """Each line's soft-average at (1 - w) · MODEL's threshold + w · `teacher_threshold`."""
        out = []
        for k in range(60):
            forward, reverse = soft[f"fwd_{k}"], soft[f"rev_{k}"]
            w = line_weight(0.3, 4, max(forward.shape)) if forward.size else 0.0
            threshold = (1 - w) * recipe.THRESHOLD + w * teacher_threshold
            out.append(format_links(soft_average(forward, reverse, threshold)) + "\n")
        return out

    lines = (root / "recipe_like.align").read_text().splitlines(keepends=True)
    assert lines == judged_at(recipe.TEACHER_MIX_THRESHOLD)
    assert lines != judged_at(0.5)   # the teacher directory's own recorded threshold
    # block processes judge it as this process does
    run("extract", recipe_like, "-s", models["src"], "-t", models["tgt"], "-q",
        "-o", root / "recipe_like_blocks.align", "--processes", "2", "--block-lines", "16")
    assert (root / "recipe_like_blocks.align").read_bytes() == \
        (root / "recipe_like.align").read_bytes()
    # --mix-threshold sets it, in block processes too
    for name, flags in (("one", []), ("blocks", ["--processes", "2", "--block-lines", "16"])):
        run("extract", recipe_like, "-s", models["src"], "-t", models["tgt"], "-q",
            "--mix-threshold", "0.3", "-o", root / f"mt03_{name}.align", *flags)
        assert (root / f"mt03_{name}.align").read_text().splitlines(keepends=True) == \
            judged_at(0.3)


def test_block_processes_and_a_pipe_give_the_bytes_of_one_process(models):
    root, text = models["root"], ["-s", models["src"], "-t", models["tgt"], "-q"]
    mixed = ["--mix", models["b"], "--mix-weight", "0.4", "--mix-length", "6"]
    run("extract", models["a"], *text, *mixed, "-o", root / "one.align", "--processes", "1")
    run("extract", models["a"], *text, *mixed, "-o", root / "two.align", "--processes", "2",
        "--block-lines", "16")
    one = (root / "one.align").read_bytes()
    assert (root / "two.align").read_bytes() == one
    run("extract", models["a"], *text, "-o", root / "alone.align")
    assert (root / "alone.align").read_bytes() != one   # the mixture is there to be kept
    source = open(models["src"], encoding="utf-8").read().splitlines()
    target = open(models["tgt"], encoding="utf-8").read().splitlines()
    joint = "".join(f"{s} ||| {t}\n" for s, t in zip(source, target))
    done = subprocess.run([sys.executable, "-m", "aligner", "extract", models["a"], "-i", "-",
                           *mixed, "-q"], input=joint, env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.encode() == one


def test_misuse_of_mix_gets_one_error_line(models):
    root, text = models["root"], ["-s", models["src"], "-t", models["tgt"], "-q"]
    out = ["-o", root / "x.align"]
    assert "records no teacher" in error_line(run("extract", models["a"], *text, *out,
                                                "--mix-weight", "0.2", ok=False))
    assert "mix length 12: " in error_line(run("extract", models["a"], *text, *out,
                                             "--mix-length", "12", ok=False))
    for value in ("0.3", "0"):   # a threshold of 0 is asked for too
        assert f"mix threshold {float(value)}: " in error_line(run(
            "extract", models["a"], *text, *out, "--mix-threshold", value, ok=False))
    assert "--direction both" in error_line(run("extract", models["a"], *text, *out,
                                                "--mix-threshold", "0.3", "--direction", "rev",
                                                ok=False))
    assert "--direction both" in error_line(run("extract", models["a"], *text, *out,
                                                "--mix-length", "12", "--direction", "rev",
                                                ok=False))
    assert "--direction both" in error_line(run("extract", models["a"], *text, *out, "--mix",
                                                models["b"], "--direction", "fwd", ok=False))
    assert "-H soft-average" in error_line(run("extract", models["a"], *text, *out, "--mix",
                                               models["b"], "-H", "grow-diag", ok=False))
    assert "no such model directory" in error_line(run(
        "extract", models["a"], *text, *out, "--mix", root / "nothing", ok=False))
    assert not (root / "x.align").exists()
    refused = run("extract", models["a"], *text, *out, "--mix", models["b"], "--mix-weight",
                  "1.5", ok=False)
    assert refused.exit_code == 2 and "--mix-weight" in refused.output
