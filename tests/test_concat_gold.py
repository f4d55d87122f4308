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
    concat_gold.main(["--src", str(tmp_path / "g.src"), "--tgt", str(tmp_path / "g.tgt"),
                      "--talp", str(tmp_path / "g.talp"), "--group", "2",
                      "--output", str(tmp_path / "j")])
    assert (tmp_path / "j.src").read_text(encoding="utf-8") == "a b c\nd e f\n"
    assert (tmp_path / "j.tgt").read_text(encoding="utf-8") == "A B B' C C'\nD\n"
    assert (tmp_path / "j.talp").read_text(encoding="utf-8") == "0-0 1-1 2-3 1p2 2p4\n2-0\n"
    golds = read_gold(str(tmp_path / "j.talp"))
    assert golds[0].sure == {(0, 0), (1, 1), (2, 3)}
    assert golds[0].possible == {(0, 0), (1, 1), (2, 3), (1, 2), (2, 4)}
