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
    # the output: soft-average of the mixed matrices at the model's threshold (classical: 0.5)
    lines = (root / "m.align").read_text().splitlines(keepends=True)
    assert len(lines) == 60 and lines[7] == "\n"
    expected = [format_links(soft_average(m[f"fwd_{k}"], m[f"rev_{k}"], 0.5)) + "\n"
                for k in range(60)]
    assert lines == expected
    assert lines != (root / "a.align").read_text().splitlines(keepends=True)


def test_block_processes_and_a_pipe_give_the_bytes_of_one_process(models):
    root, text = models["root"], ["-s", models["src"], "-t", models["tgt"], "-q"]
    mixed = ["--mix", models["b"], "--mix-weight", "0.4"]
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
