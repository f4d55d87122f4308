"""--join-lines: the teacher, the rounds and their guides train on the bitext's lines joined in
runs (aligner/training/joined_text.py); the output aligns every line as given."""
from __future__ import annotations

import json

import numpy as np
import pytest

from aligner.extract.mixture import long_line_length
from aligner.formats import Bitext, read_pharaoh
from aligner.training import recipe
from aligner.training.builder import build_job
from aligner.training.joined_text import (_STREAM, JoinedBitext, join_bitext,
                                          joined_round_pairs, run_sizes)
from cli_runner import error_line, run
from conftest import restored_aligner_logger
from synthetic import monotone_corpus, write_corpus
from test_self_training import TRAIN_TINY


def _alone(pair, max_words):
    return min(pair) == 0 or max(pair) > max_words


@pytest.mark.parametrize("most,max_words,seed", [(2, 10, 1), (5, 12, 3), (5, 64, 9), (1, 8, 2)])
def test_runs_follow_the_draws_and_stop_only_where_they_must(most, max_words, seed):
    """Brute force on 300 drawn lines (some with an empty side, some too long): the runs cover
    every line once in order; run k holds the drawn number of lines (the k-th draw of the
    runs' stream) unless the next line is at the end, must stay alone, or would take a side
    above max_words; a run of several lines holds no line that must stay alone."""
    rng = np.random.default_rng(seed)
    lengths = [(int(a), int(b)) for a, b in rng.integers(0, 9, size=(300, 2))]
    lengths[7] = (max_words + 1, 2)
    sizes = run_sizes(lengths, most, max_words, seed)
    assert sizes.sum() == len(lengths) and (sizes >= 1).all() and (sizes <= most).all()
    wanted = np.random.Generator(np.random.PCG64([seed, _STREAM])).integers(
        1, most + 1, size=len(lengths))
    start = 0
    for k, size in enumerate(sizes.tolist()):
        run_lines = lengths[start:start + size]
        if size > 1:
            assert not any(_alone(pair, max_words) for pair in run_lines)
            assert sum(p[0] for p in run_lines) <= max_words
            assert sum(p[1] for p in run_lines) <= max_words
        end = start + size
        if size < wanted[k] and end < len(lengths):
            after = lengths[end]
            assert (_alone(run_lines[0], max_words) or _alone(after, max_words)
                    or sum(p[0] for p in run_lines) + after[0] > max_words
                    or sum(p[1] for p in run_lines) + after[1] > max_words)
        else:
            assert size == min(wanted[k], len(lengths) - start)
        start = end
    assert (run_sizes(lengths, most, max_words, seed) == sizes).all()


def test_a_joined_bitext_gives_each_runs_words_end_to_end():
    source = [["a"], ["b", "c"], [], ["d"], ["e", "f"], ["g"]]
    target = [["A"], ["B"], ["C"], ["D", "E"], ["F"], ["G"]]
    joined = JoinedBitext(Bitext(source, target, "s", "t"), np.array([2, 1, 3]))
    assert len(joined) == 3 and joined.n_lines == 6
    assert list(joined) == [(["a", "b", "c"], ["A", "B"]), ([], ["C"]),
                            (["d", "e", "f", "g"], ["D", "E", "F", "G"])]
    assert list(joined.pairs_at([0, 2])) == [(["a", "b", "c"], ["A", "B"]),
                                             (["d", "e", "f", "g"], ["D", "E", "F", "G"])]
    assert list(joined.source) == [["a", "b", "c"], [], ["d", "e", "f", "g"]]
    assert (joined.source_name, joined.target_name) == ("s", "t")
    with pytest.raises(ValueError):
        list(joined.pairs_at([1, 3]))


def test_one_line_a_run_is_the_bitext_itself_and_a_sample_keeps_its_lines():
    bitext = Bitext([["a"]] * 9, [["b"]] * 9, "s", "t")
    assert join_bitext(bitext, 1, 64, seed=1) is bitext
    joined = JoinedBitext(bitext, np.array([3, 3, 3]))
    assert joined_round_pairs(4, joined) == 2 and joined_round_pairs(0, joined) == 0
    assert joined_round_pairs(4, bitext) == 4


def test_the_job_joins_the_recipes_rounds_only(tmp_path):
    """build_job: --join-lines given joins the bitext and scales a round's sample to the
    lines it had; left out, the recipe's JOIN_LINES for self-training rounds, 1 for one round
    or with --guide; --join-lines with --guide is refused."""
    sources = [["w"] * (1 + k % 4) for k in range(200)]
    bitext = Bitext(sources, sources, "s", "t")
    request, plan = build_job(str(tmp_path / "m"), bitext, join_lines=4, rounds=2,
                              self_training=dict(round_pairs=100), device="cpu")
    assert isinstance(request.bitext, JoinedBitext) and request.bitext.n_lines == 200
    assert plan.round_pairs == int(np.ceil(100 * len(request.bitext) / 200)) < 100
    assert request.prep_config.bpe_merges == recipe.bpe_merges(200)
    request, _ = build_job(str(tmp_path / "m"), bitext, rounds=1, device="cpu")
    assert request.bitext is bitext
    request, _ = build_job(str(tmp_path / "m"), bitext, rounds=2, device="cpu")
    assert (request.bitext is bitext) == (recipe.JOIN_LINES == 1)
    guide = tmp_path / "g.align"
    guide.write_text("0-0\n" * 200)
    request, _ = build_job(str(tmp_path / "m"), bitext, rounds=2, guide=str(guide),
                           device="cpu")
    assert request.bitext is bitext
    with pytest.raises(Exception, match="--join-lines 2 joins the bitext's lines"):
        build_job(str(tmp_path / "m"), bitext, rounds=2, guide=str(guide), join_lines=2,
                  device="cpu")


def test_align_train_trains_every_round_on_the_runs_and_extract_aligns_every_line(tmp_path):
    """align train --rounds 2 --join-lines 3 on 30 lines: the run record names the runs, the
    teacher's guide and round 1's guide have one line per run, and align extract aligns the
    30 lines as given."""
    sources, targets, golds = monotone_corpus(30, seed=3)
    src, tgt, _ = write_corpus(tmp_path, "c", sources, targets, golds)
    model = tmp_path / "m"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, "--rounds", "2", "--join-lines", "3",
            "--max-updates", "4", "--seed", "2", *TRAIN_TINY, "--max-positions", "64",
            "--max-len", "60")
    sizes = run_sizes([(len(s), len(t)) for s, t in zip(sources, targets)], 3,
                      recipe.JOIN_WORDS, seed=2)
    assert 1 < sizes.max() and len(sizes) < 30
    record = json.loads((model / "run.json").read_text())
    assert all(f"30 lines joined in {len(sizes)} runs" in r["inputs"]["bitext"]["lines"]
               for r in record["sessions"])
    for guide in ("rounds/0/links.align", "rounds/1/links.align"):
        assert len(read_pharaoh(str(model / guide))) == len(sizes)
    # the output mixture's long lines: the 99th percentile of the runs the rounds trained on
    runs = JoinedBitext(Bitext(sources, targets, "c.src", "c.tgt"), sizes)
    settings = json.loads((model / "config.json").read_text())["extra"]["align_run"]
    assert settings["mix_length"] == long_line_length(runs, recipe.MIX_LENGTH_QUANTILE)
    assert settings["mix_length"] > long_line_length(zip(sources, targets),
                                                     recipe.MIX_LENGTH_QUANTILE)
    out = tmp_path / "o.align"
    run("extract", model, "-s", src, "-t", tgt, "-o", out, "-q")
    assert len(read_pharaoh(str(out))) == 30


def test_join_lines_with_a_guide_is_one_error_line(tmp_path):
    sources, targets, golds = monotone_corpus(10, seed=3)
    src, tgt, gold = write_corpus(tmp_path, "c", sources, targets, golds)
    guide = tmp_path / "g.align"
    guide.write_text("".join("0-0\n" for _ in sources))
    line = error_line(run("train", "-s", src, "-t", tgt, "-o", tmp_path / "m", "--guide", guide,
                          "--join-lines", "2", *TRAIN_TINY, ok=False))
    assert "--join-lines 2 joins the bitext's lines" in line
