"""eval/concat_gold.py: long gold pairs made by joining consecutive pairs of a gold set."""
from __future__ import annotations

import sys

from aligner.formats import read_gold
from conftest import ROOT

sys.path.insert(0, str(ROOT / "eval"))

import concat_gold  # noqa: E402


def test_joined_pairs_shift_each_parts_links_by_the_lengths_before_it(tmp_path):
    """Three pairs joined by two: the second part's links move by the first part's lengths
    (2 source, 3 target words), sure and possible kept apart; the third pair stands alone."""
    (tmp_path / "g.src").write_text("a b\nc\nd e f\n", encoding="utf-8")
    (tmp_path / "g.tgt").write_text("A B B'\nC C'\nD\n", encoding="utf-8")
    (tmp_path / "g.talp").write_text("0-0 1-1 1p2\n0-0 0p1\n2-0\n", encoding="utf-8")
    concat_gold.main(["--gold", "g", str(tmp_path / "g.src"), str(tmp_path / "g.tgt"),
                      str(tmp_path / "g.talp"), "--group", "2", "--output", str(tmp_path / "j")])
    assert (tmp_path / "j.src").read_text(encoding="utf-8") == "a b c\nd e f\n"
    assert (tmp_path / "j.tgt").read_text(encoding="utf-8") == "A B B' C C'\nD\n"
    assert (tmp_path / "j.talp").read_text(encoding="utf-8") == "0-0 1-1 2-3 1p2 2p4\n2-0\n"
    golds = read_gold(str(tmp_path / "j.talp"))
    assert golds[0].sure == {(0, 0), (1, 1), (2, 3)}
    assert golds[0].possible == {(0, 0), (1, 1), (2, 3), (1, 2), (2, 4)}


def test_a_gold_set_with_a_link_outside_its_pair_stops_with_one_line(tmp_path, capsys):
    """The shared --gold reader (eval/gold_sets.py) checks the set before anything is joined."""
    (tmp_path / "g.src").write_text("a b\n", encoding="utf-8")
    (tmp_path / "g.tgt").write_text("A\n", encoding="utf-8")
    (tmp_path / "g.talp").write_text("0-0 1-1\n", encoding="utf-8")
    try:
        concat_gold.main(["--gold", "g", str(tmp_path / "g.src"), str(tmp_path / "g.tgt"),
                          str(tmp_path / "g.talp"), "--output", str(tmp_path / "j")])
    except SystemExit as exit_:
        assert exit_.code == 2
    else:
        raise AssertionError("no error")
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"concat_gold.py: error: {tmp_path / 'g.talp'}:1: link '1-1' outside the "
                    "sentence pair (source has 2 words, target has 1)")
    assert not (tmp_path / "j.src").exists()
