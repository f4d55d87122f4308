"""The recipe's classical teacher (aligner/training/teacher.py) on words: a synthetic corpus
whose links are known, and lines it cannot align. Its EM and forward–backward are the classical
model's, checked against enumerations and hand-computed counts in tests/test_classical.py."""
from __future__ import annotations

import dataclasses
import random

import numpy as np

from aligner.links.combine import combine
from aligner.training import recipe
from aligner.training.teacher import TeacherConfig, soft_alignments
from synthetic import one_swap_corpus


def _synthetic_corpus(lines: int, seed: int):
    """synthetic.one_swap_corpus's lines as lists of words."""
    source, target, gold = one_swap_corpus(lines, seed)
    return [s.split() for s in source], [t.split() for t in target], gold


def test_the_teacher_finds_the_links_of_a_synthetic_corpus():
    source, target, gold = _synthetic_corpus(400, seed=3)
    soft = soft_alignments(source, target, TeacherConfig(ibm1_iterations=5, hmm_iterations=3))
    for name in ("fwd", "rev"):
        assert [m.shape for m in soft[name]] == [(len(s), len(t))
                                                 for s, t in zip(source, target)]
    links = combine("soft-average", 0.5, soft=soft)
    found = sum(len(a & g) for a, g in zip(links, gold))
    predicted = sum(len(a) for a in links)
    true = sum(len(g) for g in gold)
    # a word repeated within a line can be confused with its twin, and a swap of a line's
    # first or last two words costs a jump from its start or to its end (the classical
    # model's boundaries). Measured over corpus seeds 0-5 (empty_prob 0.1): precision
    # 0.993-0.998, recall 0.975-0.993 (seed 3: 0.998 / 0.993)
    assert found / predicted > 0.97 and found / true > 0.95


def test_empty_lines_get_empty_matrices():
    source = [["a", "b"], [], ["a"]]
    target = [["x", "y"], ["z"], ["x"]]
    soft = soft_alignments(source, target, TeacherConfig(ibm1_iterations=2, hmm_iterations=1))
    assert [m.shape for m in soft["fwd"]] == [(2, 2), (0, 1), (1, 1)]
    assert [m.shape for m in soft["rev"]] == [(2, 2), (0, 1), (1, 1)]
    assert not soft["fwd"][1].size


def test_the_teacher_lowercases_its_words_as_the_classical_aligner_does():
    """TeacherConfig.lowercase (recipe.CLASSICAL_LOWERCASE, as `--model classical`): a corpus
    whose source words come in two cases gets the matrices of the same corpus lowercased;
    with case kept they differ."""
    source, target, _ = _synthetic_corpus(200, seed=5)
    rng = random.Random(8)
    cased = [[w.upper() if rng.random() < 0.4 else w for w in line] for line in source]
    assert cased != source
    config = TeacherConfig(ibm1_iterations=3, hmm_iterations=2)
    assert config.lowercase is recipe.CLASSICAL_LOWERCASE is True
    lowered = soft_alignments(source, target, config)
    folded = soft_alignments(cased, target, config)
    kept = soft_alignments(cased, target, dataclasses.replace(config, lowercase=False))
    for name in ("fwd", "rev"):
        assert all(np.array_equal(a, b) for a, b in zip(lowered[name], folded[name]))
        assert not all(np.allclose(a, b, atol=1e-3) for a, b in zip(lowered[name], kept[name]))


def test_the_teacher_written_as_a_model_directory_aligns_as_the_teacher(tmp_path):
    """soft_alignments(..., model_dir=D) writes the teacher as a classical model directory
    (the recipe's rounds/0, mixed into its output): `align extract D` gives the teacher's own
    matrices of its lines, cased words lowercased as the teacher read them; a word spelled as a
    special token (<unk>) is left out of the tables and still gets a matrix of its line."""
    from aligner.extract.inference import encode_bitext, soft_alignments_by_direction
    from aligner.formats import Bitext
    from aligner.model_dir import LoadedModelDir

    source, target, _ = _synthetic_corpus(150, seed=6)
    source[3] = ["<unk>"] + source[3]
    target[3] = ["<unk>"] + target[3]
    cased = [[w.upper() if k % 3 == 0 else w for k, w in enumerate(line)] for line in source]
    config = TeacherConfig(ibm1_iterations=3, hmm_iterations=2)
    soft = soft_alignments(cased, target, config, model_dir=str(tmp_path / "teacher"))
    loaded = LoadedModelDir.load(str(tmp_path / "teacher"))
    assert loaded.config.model_kind == "classical" and loaded.preprocessor.config.lowercase
    pairs = encode_bitext(loaded, Bitext(cased, target, "src", "tgt"))
    again = soft_alignments_by_direction(loaded.models, pairs, ("fwd", "rev"),
                                         "hmm-posterior")
    for name in ("fwd", "rev"):
        for k, (mine, theirs) in enumerate(zip(soft[name], again[name])):
            assert mine.shape == theirs.shape
            if k != 3:   # line 3's <unk> pairs take the unseen pair's probability there
                np.testing.assert_allclose(mine, theirs, atol=1e-5)
    assert again["fwd"][3].shape == (len(source[3]), len(target[3]))


def test_the_teacher_benchmark_runs_the_stage_as_the_job_does(tmp_path):
    """eval/bench_teacher.py: the teacher's lines of a bitext (here all 40, --teacher-pairs 0,
    round 1's 20 among them) trained in a process of its own, written as a classical model
    directory with the links of round 1's lines; a line saying what it measured, and the
    count of its batches' real cells."""
    import subprocess
    import sys

    from conftest import ROOT

    source, target, _ = one_swap_corpus(40, seed=4)
    (tmp_path / "s.txt").write_text("\n".join(source) + "\n")
    (tmp_path / "t.txt").write_text("\n".join(target) + "\n")
    done = subprocess.run([sys.executable, str(ROOT / "eval" / "bench_teacher.py"),
                           "-s", str(tmp_path / "s.txt"), "-t", str(tmp_path / "t.txt"),
                           "-o", str(tmp_path / "out"), "--round-pairs", "20",
                           "--teacher-pairs", "0", "--cells"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("teacher: 40 lines (round 1's 20), ")
    assert "peak RSS" in done.stdout
    # the cells of its batches: both directions' I·(J + 1) + J·(I + 1) per line, real
    lines = [(len(s.split()), len(t.split())) for s, t in zip(source, target)]
    real = int(done.stdout.split(" real")[0].rsplit("), ", 1)[1].replace(",", ""))
    assert real == sum(t * (s + 1) + s * (t + 1) for s, t in lines)
    links = (tmp_path / "out" / "0" / "links.align").read_text().splitlines()
    assert len(links) == 20 and sum(bool(line) for line in links) >= 15
    assert (tmp_path / "out" / "0" / "config.json").is_file()
    again = subprocess.run([sys.executable, str(ROOT / "eval" / "bench_teacher.py"),
                            "-s", str(tmp_path / "s.txt"), "-t", str(tmp_path / "t.txt"),
                            "-o", str(tmp_path / "out")], capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 1 and "exists; give a new folder" in again.stderr
