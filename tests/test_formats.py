"""Formats: bitext, Pharaoh, gold (talp and NAACL), atomic writing, the shipped sample."""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys

import pytest

from aligner.formats import (Bitext, GoldAlignment, check_alignments_against_bitext,
                             check_links_in_range, flip, format_gold, format_links, parse_links,
                             read_bitext, read_gold, read_lines, read_pharaoh, tokenize_line,
                             write_pharaoh)
from aligner.utils import AlignerError
from conftest import ROOT, SAMPLE, TEST_DATA


def write(tmp_path, name: str, content, binary: bool = False) -> str:
    path = tmp_path / name
    if binary:
        path.write_bytes(content)
    else:
        path.write_bytes(content.encode("utf-8"))
    return str(path)


def error_of(function, *args, **kwargs) -> str:
    with pytest.raises(AlignerError) as info:
        function(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- lines and tokens ---------------------------------------------------------------------

def test_tokenize_splits_on_ascii_space_and_tab_only():
    assert tokenize_line("  a b\tc  ") == ["a", "b", "c"]
    assert tokenize_line("") == []
    # a non-breaking space and an ideographic space stay inside their tokens
    assert tokenize_line("10\u00a0000 x\u3000y") == ["10\u00a0000", "x\u3000y"]


def test_read_lines_keeps_every_line(tmp_path):
    path = write(tmp_path, "a.txt", "one\n\nthree\r\nfour")  # empty line, CRLF, no final \n
    assert read_lines(path) == ["one", "", "three", "four"]


def test_read_lines_drops_a_byte_order_mark(tmp_path):
    path = write(tmp_path, "bom.txt", "\ufeff0-0 1-1\n2-2\n")
    assert read_lines(path) == ["0-0 1-1", "2-2"]
    assert read_pharaoh(path) == [{(0, 0), (1, 1)}, {(2, 2)}]
    only_bom = write(tmp_path, "only_bom.txt", "\ufeff")
    assert error_of(read_lines, only_bom) == f"{only_bom}: empty file"


def test_read_lines_does_not_split_on_stray_separators(tmp_path):
    # a lone \r, a Unicode line separator and a form feed inside a line are not line ends
    path = write(tmp_path, "a.txt", "a\rb\nc\u2028d\ne\x0cf\n")
    assert read_lines(path) == ["a\rb", "c\u2028d", "e\x0cf"]


def test_read_lines_errors(tmp_path):
    assert error_of(read_lines, str(tmp_path / "nope.txt")).endswith("nope.txt: no such file")
    assert "is a directory" in error_of(read_lines, str(tmp_path))
    empty = write(tmp_path, "empty.txt", "")
    assert error_of(read_lines, empty) == f"{empty}: empty file"
    latin1 = write(tmp_path, "latin1.txt", b"ok\nalso ok\ncaf\xe9\n", binary=True)
    assert error_of(read_lines, latin1).startswith(f"{latin1}:3: not valid UTF-8")


# --- bitext -------------------------------------------------------------------------------

def test_read_bitext_two_files(tmp_path):
    src = write(tmp_path, "s.txt", "a b\n\nc\n")
    tgt = write(tmp_path, "t.txt", "x\ny z\n\n")
    bitext = read_bitext(src, tgt)
    assert bitext == Bitext([["a", "b"], [], ["c"]], [["x"], ["y", "z"], []], src, tgt)
    assert len(bitext) == 3


def test_read_bitext_joint_file(tmp_path):
    joint = write(tmp_path, "j.txt", "a b ||| x\n ||| y z\nc|||\n")
    bitext = read_bitext(joint=joint)
    assert bitext.source == [["a", "b"], [], ["c"]]
    assert bitext.target == [["x"], ["y", "z"], []]
    assert bitext.source_name == bitext.target_name == joint


def test_read_bitext_errors(tmp_path):
    src = write(tmp_path, "s.txt", "a\nb\nc\n")
    tgt = write(tmp_path, "t.txt", "x\ny\n")
    assert error_of(read_bitext, src, tgt) == (f"{tgt}:3: line counts differ: {src} has 3 lines, "
                                               f"{tgt} has 2")
    joint = write(tmp_path, "j.txt", "a ||| x\nb x\n")
    assert error_of(read_bitext, joint=joint) == (f"{joint}:2: missing '|||' between source "
                                                  "and target")
    twice = write(tmp_path, "j2.txt", "a ||| x ||| y\n")
    assert error_of(read_bitext, joint=twice) == f"{twice}:1: more than one '|||' on the line"
    assert error_of(read_bitext, src, None, joint) == ("give either a joint file (-i) or source "
                                                       "and target files (-s/-t)")
    assert "-s and -t" in error_of(read_bitext, src)
    bad = write(tmp_path, "bad.txt", b"a\n\xff\xfe\n", binary=True)
    assert error_of(read_bitext, source=bad, target=tgt).startswith(f"{bad}:2: not valid UTF-8")


# --- Pharaoh ------------------------------------------------------------------------------

def test_parse_links():
    assert parse_links("0-0 1-2  3-1\t1-2", "f", 1) == {(0, 0), (1, 2), (3, 1)}
    assert parse_links("", "f", 1) == set()


@pytest.mark.parametrize("token", ["3-x", "1p2", "1?2", "-1-2", "1-2-3", "1--2", "12", "a",
                                   "1-", "-2", "1:2", "0-0:0.9", "١-٢"])
def test_parse_links_rejects_malformed(token):
    message = error_of(parse_links, f"0-0 {token}", "hyp.txt", 12)
    assert message == f"hyp.txt:12: malformed link '{token}' (expected i-j)"


def test_read_pharaoh_and_reverse(tmp_path):
    path = write(tmp_path, "a.txt", "0-1 2-0\n\n1-1\n")
    assert read_pharaoh(path) == [{(0, 1), (2, 0)}, set(), {(1, 1)}]
    assert read_pharaoh(path, reverse=True) == [{(1, 0), (0, 2)}, set(), {(1, 1)}]
    assert flip({(0, 1), (2, 0)}) == {(1, 0), (0, 2)}


def test_read_pharaoh_names_file_and_line(tmp_path):
    path = write(tmp_path, "hyp.txt", "0-0\n1-1\n3-x\n")
    assert error_of(read_pharaoh, path) == f"{path}:3: malformed link '3-x' (expected i-j)"
    empty = write(tmp_path, "empty.txt", "")
    assert error_of(read_pharaoh, empty) == f"{empty}: empty file"


def test_format_and_write_roundtrip(tmp_path):
    alignments = [{(2, 0), (0, 1), (0, 0), (10, 2)}, set(), {(1, 1)}]
    assert format_links(alignments[0]) == "0-0 0-1 2-0 10-2"  # numeric, not string, order
    path = str(tmp_path / "out.txt")
    write_pharaoh(path, alignments)
    assert (tmp_path / "out.txt").read_text() == "0-0 0-1 2-0 10-2\n\n1-1\n"
    assert read_pharaoh(path) == alignments


def test_write_pharaoh_is_atomic(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("previous result\n")

    def failing():
        yield {(0, 0)}
        raise RuntimeError("crash half-way")

    with pytest.raises(RuntimeError):
        write_pharaoh(str(path), failing())
    assert path.read_text() == "previous result\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left


def test_write_pharaoh_stdout(capsys):
    write_pharaoh("-", [{(1, 0)}, set()])
    write_pharaoh(None, [{(0, 0)}])
    assert capsys.readouterr().out == "1-0\n\n0-0\n"


def test_check_links_in_range():
    check_links_in_range({(0, 0), (2, 3)}, 3, 4, "a.txt", 5)
    assert error_of(check_links_in_range, {(0, 0), (3, 1)}, 3, 4, "a.txt", 5) == (
        "a.txt:5: link '3-1' outside the sentence pair (source has 3 words, target has 4)")
    assert "link '4-0'" in error_of(check_links_in_range, {(0, 4)}, 3, 4, "r.txt", 1,
                                    reverse=True)


def test_check_alignments_against_bitext(tmp_path):
    bitext = Bitext([["a", "b"], ["c"]], [["x"], ["y", "z"]], "s.txt", "t.txt")
    check_alignments_against_bitext([{(1, 0)}, {(0, 1)}], "h.txt", bitext)
    assert error_of(check_alignments_against_bitext, [{(1, 0)}, {(0, 2)}], "h.txt", bitext) \
        .startswith("h.txt:2: link '0-2' outside")
    assert "line counts differ" in error_of(check_alignments_against_bitext, [set()], "h.txt",
                                            bitext)


# --- gold ---------------------------------------------------------------------------------

def test_gold_alignment_keeps_sure_inside_possible():
    gold = GoldAlignment(sure={(0, 0)}, possible={(1, 1)})
    assert gold.possible == {(0, 0), (1, 1)}


def test_read_gold_talp(tmp_path):
    path = write(tmp_path, "g.talp", "0-0 1p1 2?2\n\n0p0 0-0\n")
    gold = read_gold(path)
    assert gold == [GoldAlignment({(0, 0)}, {(0, 0), (1, 1), (2, 2)}),
                    GoldAlignment(set(), set()),
                    GoldAlignment({(0, 0)}, {(0, 0)})]  # sure wins over possible
    assert format_gold(gold[0]) == "0-0 1p1 2p2"
    assert read_gold(path, n_sentences=3) == gold
    assert error_of(read_gold, path, n_sentences=4) == (
        f"{path}:4: line counts differ: {path} has 3 lines, expected 4 (one per sentence pair)")


@pytest.mark.parametrize("token", ["1x2", "1-", "p2", "1pp2", "1-2p3", "1p²"])
def test_read_gold_talp_malformed(tmp_path, token):
    path = write(tmp_path, "g.talp", f"0-0\n0-0 {token}\n")
    assert error_of(read_gold, path).startswith(f"{path}:2: malformed gold link '{token}'")


def test_read_gold_naacl(tmp_path):
    # 1-based; 0 = NULL (dropped); no label = sure; an optional confidence column;
    # sentence 2 has no links and sentence 4 does not appear at all
    path = write(tmp_path, "g.naacl", "1 1 1 S\n1 2 3 P\n1 0 2 S\n1 3 0 P\n\n"
                                      "3 2 2\n3 1 1 P 0.8\n1 2 3 S\n")
    gold = read_gold(path, "naacl", n_sentences=4)
    assert gold == [GoldAlignment({(0, 0), (1, 2)}, {(0, 0), (1, 2)}),
                    GoldAlignment(), GoldAlignment({(1, 1)}, {(1, 1), (0, 0)}), GoldAlignment()]
    assert len(read_gold(path, "naacl")) == 3  # without a count: up to the largest sentence
    only_null = write(tmp_path, "null.naacl", "1 0 1 S\n")
    assert read_gold(only_null, "naacl", n_sentences=2) == [GoldAlignment(), GoldAlignment()]
    assert error_of(read_gold, only_null, "naacl") == (f"{only_null}: no links and no sentence "
                                                       "count given")


def test_read_gold_naacl_matches_talp(tmp_path):
    """The trial set written in NAACL form reads back as the same gold as its talp file."""
    talp = read_gold(str(SAMPLE / "trial.talp"))
    rows = [f"{k + 1} {i + 1} {j + 1} {'S' if (i, j) in gold.sure else 'P'}"
            for k, gold in enumerate(talp) for i, j in sorted(gold.possible)]
    path = write(tmp_path, "trial.naacl", "\n".join(rows) + "\n")
    assert read_gold(path, "naacl", n_sentences=len(talp)) == talp


@pytest.mark.parametrize("line, message", [
    ("1 2", "malformed gold line '1 2'"),
    ("1 2 x S", "malformed gold line '1 2 x S'"),
    ("1 ² 3 S", "malformed gold line"),
    ("1 2 3 Q", "unknown link label 'Q'"),
    ("1 2 3 S 0.5 7", "malformed gold line"),
    ("1 2 3 S high", "malformed confidence 'high'"),
    ("0 1 1 S", "sentence numbers start at 1"),
    ("6 1 1 S", "sentence 6 beyond the 5 sentence pairs"),
])
def test_read_gold_naacl_errors(tmp_path, line, message):
    path = write(tmp_path, "g.naacl", f"1 1 1 S\n{line}\n")
    assert error_of(read_gold, path, "naacl", n_sentences=5).startswith(f"{path}:2: {message}")


def test_read_gold_unknown_format(tmp_path):
    path = write(tmp_path, "g.talp", "0-0\n")
    assert "unknown gold format 'xml'" in error_of(read_gold, path, "xml")


# --- the shipped sample -------------------------------------------------------------------

def readme_table():
    """(file, lines, sha256) rows of the table in data/README.md."""
    text = (ROOT / "data" / "README.md").read_text(encoding="utf-8")
    return [(name, int(lines.replace(",", "")), digest) for name, lines, digest in
            re.findall(r"^\| (\S+) \| ([\d,]+) \| [^|]+ \| `([0-9a-f]{64})` \|$", text, re.M)]


def test_sample_matches_readme():
    rows = readme_table()
    assert [name for name, _, _ in rows] == ["train.en", "train.fr", "trial.en", "trial.fr",
                                             "trial.talp"]
    for name, lines, digest in rows:
        data = (SAMPLE / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, name
        assert len(read_lines(str(SAMPLE / name))) == lines == data.count(b"\n"), name


def test_sample_is_valid():
    train = read_bitext(str(SAMPLE / "train.en"), str(SAMPLE / "train.fr"))
    assert len(train) == 3000 and all(train.source) and all(train.target)
    trial = read_bitext(str(SAMPLE / "trial.en"), str(SAMPLE / "trial.fr"))
    gold = read_gold(str(SAMPLE / "trial.talp"))
    check_alignments_against_bitext([g.possible for g in gold], "trial.talp", trial)
    assert sum(len(g.sure) for g in gold) == 338
    assert sum(len(g.possible - g.sure) for g in gold) == 1446


def test_make_sample_reproduces_the_sample(shared_data, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "data" / "make_sample.py"),
                             "--shared-data", str(shared_data), "--out", str(tmp_path)],
                            capture_output=True, text=True, check=True)
    for name, _, _ in readme_table():
        assert (tmp_path / name).read_bytes() == (SAMPLE / name).read_bytes(), name
        assert name in result.stdout
    assert "| train.en | 3,000 | 58,881 |" in result.stdout


def test_fixture_files_are_consistent():
    """The hand-made fixtures in tests/data agree with each other (used by the CLI tests)."""
    bitext = read_bitext(str(TEST_DATA / "tiny.src"), str(TEST_DATA / "tiny.tgt"))
    for name in ("tiny.fwd", "tiny.rev.src-tgt"):
        check_alignments_against_bitext(read_pharaoh(str(TEST_DATA / name)), name, bitext)
    assert read_pharaoh(str(TEST_DATA / "tiny.rev.tgt-src"), reverse=True) == \
        read_pharaoh(str(TEST_DATA / "tiny.rev.src-tgt"))
    gold = read_gold(str(TEST_DATA / "tiny.talp"))
    check_alignments_against_bitext([g.possible for g in gold], "tiny.talp", bitext)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_written_files_get_the_usual_mode(tmp_path):
    """Atomic output (a mkstemp file renamed) must not leave a 0600 file behind."""
    import os
    old = os.umask(0o022)
    try:
        write_pharaoh(str(tmp_path / "out.txt"), [{(0, 0)}])
    finally:
        os.umask(old)
    assert (tmp_path / "out.txt").stat().st_mode & 0o777 == 0o644
