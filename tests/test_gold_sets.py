"""eval/gold_sets.py: the one --gold syntax of the eval/ scripts (NAME SRC TGT GOLD), its checks,
finding a gold set among a text's lines, and hand-counted AER through the harness
(eval/compare_aligners.py) and through eval/aer_by_length.py, both scored by
aligner.links.metrics.score_aer."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from aligner.utils import AlignerError
from conftest import ROOT

sys.path.insert(0, str(ROOT / "eval"))
import aer_by_length  # noqa: E402
import bench_extract  # noqa: E402
import compare_aligners as ca  # noqa: E402
import gold_sets  # noqa: E402
import peers  # noqa: E402


def write(path: Path, lines) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.fixture
def hand_set(tmp_path):
    """Two gold pairs: sure 0-0, 2-2 and possible 1-1 in the first, sure 0-0, 1-1 in the
    second (|S| = 4, |P| = 5)."""
    return ("hand", write(tmp_path / "g.src", ["a b c", "d e"]),
            write(tmp_path / "g.tgt", ["A B C", "D E"]),
            write(tmp_path / "g.talp", ["0-0 1p1 2-2", "0-0 1-1"]))


# ------------------------------------------------------------------------------------------
# the shared parser: one line per mistake


def test_a_gold_set_reads_its_sentences_and_gold(hand_set):
    (gold_set,) = gold_sets.load_gold_sets([hand_set])
    assert (gold_set.name, gold_set.size, gold_set.offset) == ("hand", 2, None)
    assert gold_set.sources == [["a", "b", "c"], ["d", "e"]]
    assert gold_set.golds[0].sure == {(0, 0), (2, 2)}
    assert gold_set.golds[0].possible == {(0, 0), (1, 1), (2, 2)}


def test_the_parser_rejects_wrong_arity_a_missing_file_and_a_name_given_twice(hand_set):
    name, src, tgt, talp = hand_set
    with pytest.raises(AlignerError) as error:
        gold_sets.load_gold_sets([(name, src, talp)])
    assert str(error.value) == (f"--gold hand {src} {talp}: expected 4 values, NAME SRC TGT "
                                "GOLD; got 3")
    missing = str(Path(talp).with_name("missing.talp"))
    with pytest.raises(AlignerError) as error:
        gold_sets.load_gold_sets([(name, src, tgt, missing)])
    assert str(error.value) == f"--gold hand: {missing} is not a file"
    with pytest.raises(AlignerError) as error:
        gold_sets.load_gold_sets([hand_set, hand_set])
    assert str(error.value) == "--gold: gold set name 'hand' given twice"


def test_the_parser_rejects_unequal_line_counts_and_links_outside_the_pair(tmp_path, hand_set):
    name, src, tgt, _ = hand_set
    short = write(tmp_path / "short.talp", ["0-0"])
    with pytest.raises(AlignerError, match=r"short\.talp:2: line counts differ"):
        gold_sets.load_gold_sets([(name, src, tgt, short)])
    outside = write(tmp_path / "outside.talp", ["0-0", "0-2"])
    with pytest.raises(AlignerError, match=r"outside\.talp:2: link '0-2' outside the sentence "
                                           r"pair \(source has 2 words, target has 2\)"):
        gold_sets.load_gold_sets([(name, src, tgt, outside)])


def test_a_script_reports_a_bad_gold_in_one_line(hand_set, capsys):
    """argparse's arity error and the shared reader's, as a script prints them."""
    name, src, tgt, talp = hand_set
    common = ["--model-dir", "m", "--src", src, "--tgt", tgt, "--tree", "a=."]
    with pytest.raises(SystemExit) as exit_:
        bench_extract.main(common + ["--gold", name, src, tgt])
    assert exit_.value.code == 2
    # (argparse names the program after sys.argv[0], pytest's here)
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        ": error: argument --gold: expected 4 arguments")
    with pytest.raises(SystemExit) as exit_:
        bench_extract.main(common + ["--gold", name, src, tgt, talp + ".gone"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"bench_extract.py: error: --gold hand: {talp}.gone is not a file"]


def test_the_harness_reports_a_missing_gold_file_in_one_line(tmp_path, hand_set):
    name, src, tgt, talp = hand_set
    result = CliRunner().invoke(ca.main, ["--train", src, tgt, "--gold", name, src, tgt,
                                          talp + ".gone", "--peers", "", "--workdir",
                                          str(tmp_path / "w")])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (f"compare_aligners: error: --gold hand: "
                                              f"{talp}.gone is not a file")


# ------------------------------------------------------------------------------------------
# finding a gold set among the lines of a text


def test_locate_finds_the_last_block_of_a_texts_lines_equal_to_the_gold_set(hand_set):
    (gold_set,) = gold_sets.load_gold_sets([hand_set])
    text = [("x", "X"), ("a b c", "A B C"), ("d e", "D E"), ("y", "Y"), ("a b c", "A B C"),
            ("d e", "D E"), ("z", "Z")]
    sources = [s.split() for s, _ in text]
    targets = [t.split() for _, t in text]
    gold_sets.locate([gold_set], sources, targets, "text")
    assert gold_set.offset == 4
    # a pair whose target differs is not the gold set's
    targets[5] = ["D", "F"]
    gold_sets.locate([gold_set], sources, targets, "text")
    assert gold_set.offset == 1
    targets[2] = ["D", "F"]
    with pytest.raises(AlignerError) as error:
        gold_sets.locate([gold_set], sources, targets, "t.src t.tgt")
    assert str(error.value) == (
        f"gold set 'hand': its 2 sentence pairs ({gold_set.source}, {gold_set.target}) are not "
        "consecutive lines of t.src t.tgt (append them to the text, as the benchmark "
        "convention does)")


# ------------------------------------------------------------------------------------------
# hand-counted AER
#
# fwd  = {0-0 1-1 2-1}, {0-0}      |A| 4, |A∩S| 2, |A∩P| 3: AER 1 - 5/8 = 37.5, P 75.0, R 50.0
# rev  = {0-0 2-2},     {0-0 1-0}  |A| 4, |A∩S| 3, |A∩P| 3: AER 1 - 6/8 = 25.0, P 75.0, R 75.0
# intersect {0-0}, {0-0}           |A| 2, |A∩S| 2, |A∩P| 2: AER 1 - 4/6 = 33.3, P 100,  R 50.0
# union {0-0 1-1 2-1 2-2}, {0-0 1-0}  |A| 6, 3, 4:          AER 1 - 7/10 = 30.0, P 66.7, R 75.0
FWD, REV = ["0-0 1-1 2-1", "0-0"], ["0-0 2-2", "0-0 1-0"]


def test_the_harness_scores_a_hand_counted_system(tmp_path, hand_set):
    """A system whose two directions are fixed files, run, symmetrized, scored and tabled by
    eval/compare_aligners.py with --heuristics intersect,union."""
    train = (write(tmp_path / "t.src", ["x y"]), write(tmp_path / "t.tgt", ["X Y"]))
    work = tmp_path / "w"
    work.mkdir()
    corpus = ca.build_corpus([train], [hand_set], str(work))
    assert [(g.name, g.offset) for g in corpus.gold_sets] == [("hand", 1)]
    fixed = {"fwd": write(tmp_path / "fixed.fwd", FWD), "rev": write(tmp_path / "fixed.rev", REV)}
    out = {d: str(work / f"{d}.txt") for d in fixed}
    run = peers.PeerRun(label="by hand", version="", settings="",
                        steps=[peers.Step(d, ["cp", fixed[d], out[d]]) for d in fixed],
                        forward=out["fwd"], reverse=out["rev"],
                        first_line=corpus.first_gold_line)
    heuristics = ("intersect", "union")
    result = ca.run_system(run, corpus, str(work), {}, heuristics)
    assert result.status == "ok"
    table = ca.render_table([result], corpus, "hand", "cmd", {}, heuristics)
    assert "| system | fwd | rev | intersect | union | soft-average | time s | peak MiB |" in table
    row = next(line for line in table.splitlines() if line.startswith("| by hand |"))
    assert row.startswith("| by hand | 37.5 (75.0/50.0) | 25.0 (75.0/75.0) | "
                          "33.3 (100.0/50.0) | 30.0 (66.7/75.0) | – | ")
    union = result.scores["hand"]["union"]
    assert (union.n_hyp, union.hyp_and_sure, union.hyp_and_possible) == (6, 3, 4)
    with pytest.raises(AlignerError, match="unknown heuristic"):
        ca.compare([train], [hand_set], [], [], str(tmp_path / "w2"),
                   heuristics=("grow-sideways",))


def test_aer_by_length_finds_the_gold_lines_in_the_text_and_scores_them_by_hand(tmp_path,
                                                                                 hand_set):
    """The same forward links as a whole-text Pharaoh file (text = one training line, then
    the gold set): the gold lines are found at text lines 2-3 and scored as counted above."""
    _, src, tgt, _ = hand_set
    text = (write(tmp_path / "text.src", ["x y", "a b c", "d e"]),
            write(tmp_path / "text.tgt", ["X Y", "A B C", "D E"]))
    system = write(tmp_path / "fwd.align", ["0-0 1-1"] + FWD)
    result = CliRunner().invoke(aer_by_length.main, ["--text", *text, "--gold", *hand_set,
                                                     f"fwd={system}"])
    assert result.exit_code == 0, result.output
    assert "## hand: 2 of 2 gold lines (text lines 2-3) in every system" in result.output
    assert "| all | 2 | 37.5 (75.0 / 50.0) |" in result.output
    # the gold set is not in the text: one line, no table
    result = CliRunner().invoke(aer_by_length.main, ["--text", src, src, "--gold", *hand_set,
                                                     f"fwd={system}"])
    assert result.exit_code == 2
    assert "gold set 'hand': its 2 sentence pairs" in result.output
    assert "| all |" not in result.output
