"""--round-pairs: each self-training round trains on a sample of the bitext drawn anew per round
(aligner/training/samples.py), and the round before it aligns only that sample to guide it."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from aligner.formats import Bitext, read_pharaoh
from aligner.training.samples import (SampledBitext, round_bitext, sample_lines,
                                      teacher_sample)
from cli_runner import error_line, run
from conftest import restored_aligner_logger
from synthetic import monotone_corpus, write_corpus
from test_self_training import TRAIN_TINY


def test_no_sample_when_the_budget_covers_the_bitext():
    assert sample_lines(100, 0, seed=1, round_number=2) is None
    assert sample_lines(100, 100, seed=1, round_number=2) is None
    assert sample_lines(100, 250, seed=1, round_number=1) is None


def test_samples_are_cyclic_windows_of_one_seeded_permutation():
    """Brute force: the permutation drawn by hand, the windows cut by hand."""
    n, size = 10, 4
    permutation = np.random.Generator(np.random.PCG64(7)).permutation(n).tolist()
    cycle = permutation * 3
    for round_number in range(1, 6):
        start = ((round_number - 1) * size) % n
        expected = sorted(cycle[start:start + size])
        assert sample_lines(n, size, 7, round_number).tolist() == expected


def test_fine_tuned_rounds_take_their_share_after_round_one():
    """Brute force, --fine-tune-share f: round 1 takes min(S, N) lines, rounds 2, 3, ...
    min(S, N, ceil(f N)) each, the windows following one another around the permutation."""
    n = 10
    permutation = np.random.Generator(np.random.PCG64(7)).permutation(n).tolist()
    cycle = permutation * 4
    for first, share, later in ((4, 0.3, 3), (0, 0.3, 3), (25, 0.55, 6), (3, 0.5, 3),
                                (0, 1.0, 10), (6, 1.0, 6)):
        sizes = [first if 0 < first < n else n] + [later] * 4
        for round_number in range(1, 6):
            start = sum(sizes[:round_number - 1]) % n
            got = sample_lines(n, first, 7, round_number, fine_tune_share=share)
            if sizes[round_number - 1] == n:
                assert got is None
            else:
                assert got.tolist() == sorted(cycle[start:start + sizes[round_number - 1]])
    # round 1 on all 10 lines, then 3 + 3 + 3: nine distinct lines in rounds 2-4
    later = [sample_lines(n, 0, 7, r, fine_tune_share=0.3) for r in (2, 3, 4)]
    assert len(set(np.concatenate(later).tolist())) == 9
    # share 1: every sample as without one
    for r in range(1, 5):
        assert np.array_equal(sample_lines(1000, 230, 3, r, fine_tune_share=1.0),
                              sample_lines(1000, 230, 3, r))


def test_rounds_see_distinct_lines_until_the_corpus_is_used_up():
    n, size = 1000, 230
    samples = [sample_lines(n, size, 3, r) for r in range(1, 5)]      # 920 lines of 1000
    for sample in samples:
        assert len(sample) == size and len(set(sample.tolist())) == size
        assert (np.diff(sample) > 0).all()                               # input order
    assert len(set(np.concatenate(samples).tolist())) == 4 * size       # no line twice
    wrapped = [sample_lines(n, size, 3, r) for r in range(1, 6)]       # 1150 > 1000: wraps
    seen = np.concatenate(wrapped)
    assert len(set(seen.tolist())) == n and np.bincount(seen, minlength=n).max() == 2
    # the seed decides the sample; the same seed, the same sample
    assert (sample_lines(n, size, 3, 2) == samples[1]).all()
    assert not np.array_equal(sample_lines(n, size, 4, 2), samples[1])


def test_sampled_bitext_gives_the_lines_it_holds_in_order():
    sources = [[f"s{k}"] * (k % 3) for k in range(20)]
    targets = [[f"t{k}"] for k in range(20)]
    bitext = Bitext(sources, targets, "a.src", "a.tgt")
    lines = np.array([0, 4, 5, 19])
    view = SampledBitext(bitext, lines)
    assert list(view) == [(sources[k], targets[k]) for k in lines]
    assert list(view) == list(view)                                      # re-iterable
    assert list(view.source) == [sources[k] for k in lines]
    assert list(view.target) == [targets[k] for k in lines]
    assert len(view) == len(view.source) == 4
    assert (view.source_name, view.target_name) == ("a.src", "a.tgt")
    assert round_bitext(bitext, 0, 1, 2) is bitext
    sample = round_bitext(bitext, 5, 1, 2)
    assert list(sample.lines) == sample_lines(20, 5, 1, 2).tolist()
    assert sample.description == "round 2's sample of 5 of 20 lines (seed 1)"


def test_the_teachers_sample_holds_round_ones_lines():
    """teacher_sample: the first max(teacher_pairs, round_pairs) lines of round 1's
    permutation, with round 1's lines' positions among them; all lines where either budget
    is 0 or covers the bitext."""
    bitext = Bitext([[f"s{k}"] for k in range(30)], [[f"t{k}"] for k in range(30)], "a", "b")
    for seed in (1, 2, 9):
        teacher, positions = teacher_sample(bitext, 8, 20, seed)
        round1 = sample_lines(30, 8, seed, 1)
        assert isinstance(teacher, SampledBitext) and len(teacher) == 20
        assert set(round1.tolist()) < set(teacher.lines.tolist())
        assert teacher.lines[positions].tolist() == round1.tolist()
        assert teacher.description == f"the teacher's sample of 20 of 30 lines (seed {seed})"
        everything, positions = teacher_sample(bitext, 8, 30, seed)   # covers the bitext
        assert everything is bitext and positions.tolist() == round1.tolist()
        assert teacher_sample(bitext, 8, 0, seed)[0] is bitext          # no cap
        smaller, positions = teacher_sample(bitext, 12, 5, seed)      # the cap below round 1's
        assert smaller.lines.tolist() == sample_lines(30, 12, seed, 1).tolist()
        assert positions is None
    assert teacher_sample(bitext, 0, 20, 1) == (bitext, None)          # round 1 on all lines


def test_the_teacher_trains_on_more_lines_than_round_one_and_guides_its_lines(
        tmp_path, corpus, monkeypatch):
    """align train --rounds 2 --round-pairs 8 on 20 lines with recipe.TEACHER_PAIRS 14: the
    teacher (rounds/0) trains on 14 lines, round 1's 8 among them; its links.align holds the
    teacher's soft-average links of round 1's 8 lines, as trained on the 14; its vocabulary
    holds the words of the 14."""
    import torch

    from aligner.formats import format_links
    from aligner.links.combine import combine
    from aligner.training import recipe, teacher
    from aligner.training.teacher import TeacherConfig, soft_alignments
    from aligner.vocab import Vocabulary

    _, _, sources, targets = corpus
    taught = sample_lines(20, 14, 5, 1).tolist()
    round1 = sample_lines(20, 8, 5, 1).tolist()
    extra = [k for k in taught if k not in round1][0]   # a word only the teacher's lines have
    sources[extra], targets[extra] = sources[extra] + ["onlyteacher"], targets[extra] + ["x9"]
    src, tgt, _ = write_corpus(tmp_path, "t", sources, targets)
    monkeypatch.setattr(recipe, "TEACHER_PAIRS", 14)
    model = tmp_path / "m"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, "--rounds", "2", "--round-pairs", "8",
            "--max-updates", "2", "--seed", "5", *TRAIN_TINY)
    positions = [taught.index(k) for k in round1]
    threads = torch.get_num_threads()
    torch.set_num_threads(teacher.THREADS)   # as the teacher's own process: the same sums
    try:
        soft = soft_alignments([sources[k] for k in taught], [targets[k] for k in taught],
                               TeacherConfig(), lines=positions)
    finally:
        torch.set_num_threads(threads)
    expected = combine("soft-average", recipe.TEACHER_THRESHOLD, soft=soft)
    guide = (model / "rounds" / "0" / "links.align").read_text()
    assert guide == "".join(format_links(links) + "\n" for links in expected)
    assert len(guide.splitlines()) == 8
    words = set(Vocabulary.load(str(model / "rounds" / "0" / "vocab.src.json")).tokens)
    assert {w.lower() for k in taught for w in sources[k]} <= words
    assert "onlyteacher" in words


def _fingerprint(pairs) -> str:
    digest = hashlib.sha256()
    for source, target in pairs:
        digest.update(f"{' '.join(source)}\t{' '.join(target)}\n".encode("utf-8"))
    return digest.hexdigest()


@pytest.fixture
def corpus(tmp_path):
    sources, targets, golds = monotone_corpus(20, seed=6)
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets, golds)
    return src, tgt, sources, targets


def test_each_round_trains_on_its_sample_and_the_guide_aligns_the_next_one(tmp_path, corpus):
    """align train --rounds 3 --round-pairs 8 on 20 lines: each guide has the next round's 8
    lines, the last round's cached corpus is exactly round 3's sample (its fingerprint from the
    lines picked by hand), align extract then aligns all 20 lines, and --resume with another
    --round-pairs is refused."""
    src, tgt, sources, targets = corpus
    model = tmp_path / "m"
    args = ["--rounds", "3", "--round-pairs", "8", "--max-updates", "3", "--seed", "5",
            *TRAIN_TINY]
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, *args)
    for round_number in (1, 2):
        guide = read_pharaoh(str(model / "rounds" / str(round_number) / "links.align"))
        assert len(guide) == 8
        following = sample_lines(20, 8, 5, round_number + 1)
        for links, k in zip(guide, following):     # each guide line indexes its sample line
            assert all(i < len(sources[k]) and j < len(targets[k]) for i, j in links)
    inputs = json.loads((model / "rounds" / "3" / "corpus" / "inputs.json").read_text())
    round3 = sample_lines(20, 8, 5, 3)
    assert inputs["pairs"] == 8
    assert inputs["sha256"] == _fingerprint((sources[k], targets[k]) for k in round3)
    record = json.loads((model / "run.json").read_text())
    assert record["sessions"][0]["inputs"]["bitext"]["lines"] == \
        "round 1's sample of 8 of 20 lines (seed 5)"
    run("extract", model, "-s", src, "-t", tgt, "-o", tmp_path / "x", "-q")
    assert len(read_pharaoh(str(tmp_path / "x"))) == 20
    line = error_line(run("train", "-s", src, "-t", tgt, "-o", model, *args[:2],
                          "--round-pairs", "9", *args[4:], "--resume", ok=False))
    assert "--round-pairs (8 saved, 9 asked)" in line


def test_fine_tuned_rounds_train_on_their_own_sample(tmp_path, corpus):
    """align train --rounds 3 --round-pairs 0 --fine-tune-share 0.4 on 20 lines: round 1
    trains on all 20, its guide holds round 2's 8 lines, round 3's cached corpus is exactly
    its own sample; --resume with another --fine-tune-share is refused."""
    src, tgt, sources, targets = corpus
    model = tmp_path / "m"
    args = ["--rounds", "3", "--round-pairs", "0", "--max-updates", "3", "--seed", "5",
            *TRAIN_TINY]
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, *args, "--fine-tune-share", "0.4")
    record = json.loads((model / "run.json").read_text())
    assert record["sessions"][0]["inputs"]["bitext"]["pairs"] == 20
    assert len(read_pharaoh(str(model / "rounds" / "1" / "links.align"))) == 8
    assert len(read_pharaoh(str(model / "rounds" / "2" / "links.align"))) == 8
    round3 = sample_lines(20, 0, 5, 3, fine_tune_share=0.4)
    assert round3.tolist() == sorted(sample_lines(20, 8, 5, 2).tolist())  # windows 8-15
    inputs = json.loads((model / "rounds" / "3" / "corpus" / "inputs.json").read_text())
    assert inputs["pairs"] == 8
    assert inputs["sha256"] == _fingerprint((sources[k], targets[k]) for k in round3)
    line = error_line(run("train", "-s", src, "-t", tgt, "-o", model, *args,
                          "--fine-tune-share", "0.45", "--resume", ok=False))
    assert "--fine-tune-share (0.4 saved, 0.45 asked)" in line


def test_a_budget_as_large_as_the_bitext_trains_as_without_one(tmp_path, corpus):
    """--round-pairs 0 and --round-pairs 20 (the bitext's size) give the same guides and
    weights: every round trains on the whole bitext."""
    src, tgt, _, _ = corpus
    with restored_aligner_logger():
        for name, pairs in (("all", "0"), ("same", "20")):
            run("train", "-s", src, "-t", tgt, "-o", tmp_path / name, "--rounds", "2",
                "--round-pairs", pairs, "--max-updates", "2", *TRAIN_TINY)
    assert (tmp_path / "all" / "rounds" / "1" / "links.align").read_bytes() == \
        (tmp_path / "same" / "rounds" / "1" / "links.align").read_bytes()
    assert (tmp_path / "all" / "fwd" / "params.best.pt").read_bytes() == \
        (tmp_path / "same" / "fwd" / "params.best.pt").read_bytes()
    assert len(read_pharaoh(str(tmp_path / "all" / "rounds" / "1" / "links.align"))) == 20


def test_a_guide_leaves_the_lines_training_skips_unaligned(tmp_path, corpus):
    """align train --rounds 2 --max-len 4 on 20 lines of 2-6 whole words (--bpe-merges 0):
    round 2 trains on the lines of at most 4 words only, so round 1's guide aligns only those.
    Its lines of 5 or 6 words are empty; every other line is what the same extraction without
    the filter gives (aligner.extract.corpus_alignment.align_bitext of round 1's model)."""
    import torch

    from aligner.extract.corpus_alignment import Extraction, align_bitext
    from aligner.training import recipe

    src, tgt, sources, targets = corpus
    model = tmp_path / "m"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, "--rounds", "2", "--round-pairs", "0",
            "--max-updates", "60", "--seed", "5", *TRAIN_TINY, "--max-len", "4")
    guide = read_pharaoh(str(model / "rounds" / "1" / "links.align"))
    unfiltered = tmp_path / "unfiltered.align"
    align_bitext(Extraction.load(str(model / "rounds" / "1"), torch.device("cpu"),
                                 "hmm-posterior", recipe.HEURISTIC, recipe.SELF_GUIDE_THRESHOLD),
                 Bitext(sources, targets, str(src), str(tgt)),
                 {recipe.HEURISTIC: str(unfiltered)}, quiet=True)
    every_line = read_pharaoh(str(unfiltered))
    longer = [k for k in range(20) if max(len(sources[k]), len(targets[k])) > 4]
    assert 0 < len(longer) < 20 and len(guide) == len(every_line) == 20
    assert any(every_line[k] for k in longer)            # the filter emptied links
    assert [guide[k] for k in longer] == [set() for _ in longer]
    kept = [k for k in range(20) if k not in longer]
    assert [guide[k] for k in kept] == [every_line[k] for k in kept]
    assert any(guide[k] for k in kept)
    record = json.loads((model / "rounds" / "2" / "corpus" / "corpus.json").read_text())
    assert record["n_kept"] == len(kept) and record["n_too_long"] == len(longer)
