"""`align symmetrize` and `align score-aer` through click's CliRunner, plus their bad inputs.

Fixtures: tests/data/tiny.* (five hand-drawn sentence pairs, see tests/data/tiny.md).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from aligner import __version__
from aligner.cli import main
from conftest import TEST_DATA

TINY = {name: str(TEST_DATA / f"tiny.{name}")
        for name in ("src", "tgt", "fwd", "rev.src-tgt", "rev.tgt-src", "talp")}

# Hand-derived from the grids G1..G4 of tests/test_symmetrize.py plus an empty fifth pair.
EXPECTED = {
    "intersect": ["0-0", "0-0 1-1", "3-3", "", ""],
    "union": ["0-0 0-1 1-0 1-1", "0-0 1-1 2-4 3-0 4-3", "0-3 1-1 2-2 3-3", "0-0 0-1", ""],
    "grow-diag": ["0-0 0-1 1-0", "0-0 1-1", "1-1 2-2 3-3", "", ""],
    "grow-diag-final": ["0-0 0-1 1-0", "0-0 1-1 2-4 3-0 4-3", "0-3 1-1 2-2 3-3", "0-0 0-1", ""],
    "grow-diag-final-and": ["0-0 0-1 1-0", "0-0 1-1 2-4 4-3", "1-1 2-2 3-3", "0-0", ""],
}


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input)


def stdout_of(result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def assert_user_error(result, expected: str) -> None:
    """Exit 1, exactly one line on stderr starting 'align: error: ' and containing `expected`."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("align: error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""


def write(tmp_path, name: str, content) -> str:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return str(path)


# --- symmetrize ---------------------------------------------------------------------------

@pytest.mark.parametrize("heuristic", sorted(EXPECTED))
def test_symmetrize_each_heuristic(heuristic):
    result = run("symmetrize", "-f", TINY["fwd"], "-r", TINY["rev.src-tgt"], "-H", heuristic)
    assert stdout_of(result) == "".join(line + "\n" for line in EXPECTED[heuristic])
    assert f"5 sentence pairs, {heuristic}" in result.stderr


def test_symmetrize_default_is_grow_diag_and_reverse_orientation(tmp_path):
    out = tmp_path / "gd.txt"
    result = run("symmetrize", "-f", TINY["fwd"], "-r", TINY["rev.tgt-src"],
                 "--reverse-orientation", "tgt-src", "-o", str(out), "-s", TINY["src"],
                 "-t", TINY["tgt"], "--quiet")
    assert stdout_of(result) == "" and result.stderr == ""
    assert out.read_text() == "".join(line + "\n" for line in EXPECTED["grow-diag"])


def test_symmetrize_reads_stdin():
    with open(TINY["fwd"]) as handle:
        forward = handle.read()
    result = run("symmetrize", "-f", "-", "-r", TINY["rev.src-tgt"], "-H", "union", "-q",
                 input=forward)
    assert stdout_of(result).splitlines() == EXPECTED["union"]


def test_symmetrize_line_counts_differ(tmp_path):
    short = write(tmp_path, "rev.txt", "0-0\n0-0\n")
    assert_user_error(run("symmetrize", "-f", TINY["fwd"], "-r", short),
                      f"{short}:3: line counts differ: {TINY['fwd']} has 5 lines, "
                      f"{short} has 2")


def test_symmetrize_malformed_link(tmp_path):
    bad = write(tmp_path, "fwd.txt", "0-0\n0-0\n0-0\n0-0\n3-x\n")
    assert_user_error(run("symmetrize", "-f", bad, "-r", TINY["rev.src-tgt"]),
                      f"{bad}:5: malformed link '3-x'")


def test_symmetrize_index_outside_sentence(tmp_path):
    bad = write(tmp_path, "rev.txt", "0-0\n0-0\n0-0\n0-2\n\n")  # pair 4 has 2 target words
    assert_user_error(run("symmetrize", "-f", TINY["fwd"], "-r", bad, "-s", TINY["src"],
                          "-t", TINY["tgt"]),
                      f"{bad}:4: link '0-2' outside the sentence pair (source has 2 words, "
                      "target has 2)")
    # the same file read target-source: the message quotes the link as written
    assert_user_error(run("symmetrize", "-f", TINY["fwd"], "-r", bad, "-s", TINY["src"],
                          "-t", TINY["tgt"], "--reverse-orientation", "tgt-src"),
                      f"{bad}:4: link '0-2' outside")
    # without sentences, indices cannot be checked and the file is accepted
    assert run("symmetrize", "-f", TINY["fwd"], "-r", bad).exit_code == 0


def test_symmetrize_empty_and_non_utf8_files(tmp_path):
    empty = write(tmp_path, "empty.txt", "")
    assert_user_error(run("symmetrize", "-f", empty, "-r", TINY["rev.src-tgt"]),
                      f"{empty}: empty file")
    latin = write(tmp_path, "src.txt", b"a b\nc d e f g\nh i j k\nl m\n\xe9\n")
    assert_user_error(run("symmetrize", "-f", TINY["fwd"], "-r", TINY["rev.src-tgt"],
                          "-s", latin, "-t", TINY["tgt"]), f"{latin}:5: not valid UTF-8")
    missing = str(tmp_path / "missing.txt")
    assert_user_error(run("symmetrize", "-f", missing, "-r", TINY["rev.src-tgt"]),
                      f"{missing}: no such file")


def test_symmetrize_joint_file_missing_separator(tmp_path):
    joint = write(tmp_path, "joint.txt", "a b ||| x y\nc d e f g ||| u v w x y\nh i j k\n"
                                         "l m ||| v w\nn ||| z\n")
    assert_user_error(run("symmetrize", "-f", TINY["fwd"], "-r", TINY["rev.src-tgt"],
                          "-i", joint), f"{joint}:3: missing '|||'")


def test_symmetrize_failure_leaves_output_untouched(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    bad = write(tmp_path, "rev.txt", "0-0\n0-0\n0-0\n0-2\n\n")
    result = run("symmetrize", "-f", TINY["fwd"], "-r", bad, "-s", TINY["src"], "-t",
                 TINY["tgt"], "-o", str(out))
    assert result.exit_code == 1
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "rev.txt"]


def test_symmetrize_unknown_heuristic():
    result = run("symmetrize", "-f", TINY["fwd"], "-r", TINY["rev.src-tgt"], "-H", "grow")
    assert result.exit_code == 2 and "'grow' is not one of" in result.output


# --- score-aer ----------------------------------------------------------------------------

def grow_diag_file(tmp_path) -> str:
    return write(tmp_path, "gd.txt", "".join(line + "\n" for line in EXPECTED["grow-diag"]))


def test_score_aer_text(tmp_path):
    # hand count (tests/data/tiny.md): |A| = 8, |S| = 9, |P| = 13, |A∩S| = 6, |A∩P| = 7
    # P = 7/8 = 87.5, R = 6/9 = 66.7, AER = 4/17 = 23.5, F1 = 28/37 = 75.7
    result = run("score-aer", "-g", TINY["talp"], "-a", grow_diag_file(tmp_path))
    assert stdout_of(result).splitlines() == [
        "AER 23.5  P 87.5  R 66.7  F1 75.7  links 8  sure 9  possible 13  sentences 5",
        f"signature: aer|gold:talp|dir:src-tgt|v:{__version__}",
    ]


def test_score_aer_json_and_width(tmp_path):
    result = run("score-aer", "-g", TINY["talp"], "-a", grow_diag_file(tmp_path), "--json")
    data = json.loads(stdout_of(result))
    assert data["signature"] == f"aer|gold:talp|dir:src-tgt|v:{__version__}"
    assert data["aer"] == pytest.approx(100 * 4 / 17)
    assert data["precision"] == pytest.approx(87.5)
    assert data["recall"] == pytest.approx(100 * 6 / 9)
    assert data["f1"] == pytest.approx(100 * 28 / 37)
    assert {k: data[k] for k in ("links", "sure", "possible", "links_sure", "links_possible",
                                 "sentences")} == {"links": 8, "sure": 9, "possible": 13,
                                                   "links_sure": 6, "links_possible": 7,
                                                   "sentences": 5}
    wide = run("score-aer", "-g", TINY["talp"], "-a", grow_diag_file(tmp_path), "-w", "3")
    assert stdout_of(wide).startswith("AER 23.529  P 87.500  R 66.667  F1 75.676  ")


def test_score_aer_per_sentence(tmp_path):
    result = run("score-aer", "-g", TINY["talp"], "-a", grow_diag_file(tmp_path),
                 "--per-sentence")
    lines = stdout_of(result).splitlines()
    assert lines[0].split("\t") == ["sentence", "aer", "precision", "recall", "f1", "links",
                                    "sure", "possible", "links_sure", "links_possible"]
    rows = [line.split("\t") for line in lines[1:6]]
    # pair 1: A = {0-0, 0-1, 1-0}, S = {0-0, 1-1}, P = S + {0-1}: AER = 1 - 3/5
    assert rows[0] == ["1", "40.0", "66.7", "50.0", "57.1", "3", "2", "3", "1", "2"]
    # pair 4: nothing proposed, one sure link: AER 100, precision 100 by convention
    assert rows[3] == ["4", "100.0", "100.0", "0.0", "0.0", "0", "1", "1", "0", "0"]
    # pair 5: nothing proposed, no sure link: a perfect score
    assert rows[4] == ["5", "0.0", "100.0", "100.0", "100.0", "0", "0", "1", "0", "0"]
    assert lines[6].startswith("AER 23.5  ")
    data = json.loads(stdout_of(run("score-aer", "-g", TINY["talp"], "-a",
                                    grow_diag_file(tmp_path), "--per-sentence", "--json")))
    assert [s["links"] for s in data["per_sentence"]] == [3, 2, 3, 0, 0]


def test_score_aer_reverse(tmp_path):
    forward = run("score-aer", "-g", TINY["talp"], "-a", TINY["rev.src-tgt"])
    reverse = run("score-aer", "-g", TINY["talp"], "-a", TINY["rev.tgt-src"], "--reverse")
    assert stdout_of(forward).splitlines()[0] == stdout_of(reverse).splitlines()[0]
    assert "dir:tgt-src" in reverse.stdout


def test_score_aer_naacl_gold(tmp_path):
    # tiny.talp in NAACL form (1-based, S/P, a NULL link that must be dropped, no line for
    # the empty-sure sentence 5 except a possible link)
    naacl = write(tmp_path, "tiny.naacl", "1 1 1 S\n1 2 2\n1 1 2 P\n"
                                          "2 1 1 S\n2 2 2 S\n2 3 5 S\n2 4 1 P\n2 0 3 S\n"
                                          "3 2 2 S\n3 3 3 S\n3 4 4 S\n3 1 4 P\n"
                                          "4 1 1 S\n5 1 1 P\n")
    talp = run("score-aer", "-g", TINY["talp"], "-a", grow_diag_file(tmp_path))
    result = run("score-aer", "-g", naacl, "--gold-format", "naacl", "-a",
                 grow_diag_file(tmp_path), "-s", TINY["src"], "-t", TINY["tgt"])
    assert stdout_of(result).splitlines()[0] == stdout_of(talp).splitlines()[0]
    assert "gold:naacl" in result.stdout
    outside = write(tmp_path, "bad.naacl", "1 1 1 S\n4 3 1 S\n")
    assert_user_error(run("score-aer", "-g", outside, "--gold-format", "naacl", "-a",
                          grow_diag_file(tmp_path), "-s", TINY["src"], "-t", TINY["tgt"]),
                      f"{outside}: sentence 4: link '3 1' outside the sentence pair")
    beyond = write(tmp_path, "beyond.naacl", "6 1 1 S\n")
    assert_user_error(run("score-aer", "-g", beyond, "--gold-format", "naacl", "-a",
                          grow_diag_file(tmp_path)), f"{beyond}:1: sentence 6 beyond the 5")


def test_score_aer_line_counts_differ(tmp_path):
    short = write(tmp_path, "hyp.txt", "0-0\n")
    assert_user_error(run("score-aer", "-g", TINY["talp"], "-a", short),
                      f"{short}:2: line counts differ: {TINY['talp']} has 5 lines, "
                      f"{short} has 1")


def test_score_aer_bad_hypothesis_and_gold(tmp_path):
    hyp = write(tmp_path, "hyp.txt", "0-0\n\n\n\n\n\n\n\n\n\n\n3-x\n")
    assert_user_error(run("score-aer", "-g", TINY["talp"], "-a", hyp),
                      f"{hyp}:12: malformed link '3-x'")
    gold = write(tmp_path, "gold.talp", "0-0\n0x1\n")
    assert_user_error(run("score-aer", "-g", gold, "-a", grow_diag_file(tmp_path)),
                      f"{gold}:2: malformed gold link '0x1'")
    empty = write(tmp_path, "empty.talp", "")
    assert_user_error(run("score-aer", "-g", empty, "-a", grow_diag_file(tmp_path)),
                      f"{empty}: empty file")
    latin = write(tmp_path, "latin.txt", b"0-0\n\xff\n\n\n\n")
    assert_user_error(run("score-aer", "-g", TINY["talp"], "-a", latin),
                      f"{latin}:2: not valid UTF-8")


def test_score_aer_index_checks(tmp_path):
    hyp = write(tmp_path, "hyp.txt", "0-0\n0-0\n0-0\n0-0\n0-1\n")  # pair 5 is 1 x 1
    assert run("score-aer", "-g", TINY["talp"], "-a", hyp).exit_code == 0  # gold has no lengths
    assert_user_error(run("score-aer", "-g", TINY["talp"], "-a", hyp, "-s", TINY["src"],
                          "-t", TINY["tgt"]), f"{hyp}:5: link '0-1' outside the sentence pair")
    gold = write(tmp_path, "gold.talp", "0-0\n0-0\n0p7\n0-0\n0-0\n")
    assert_user_error(run("score-aer", "-g", gold, "-a", TINY["fwd"], "-s", TINY["src"],
                          "-t", TINY["tgt"]), f"{gold}:3: link '0-7' outside")
    joint = write(tmp_path, "joint.txt", "a b ||| x y\nc d e f g ||| u v w x y\nh i j k\n"
                                         "l m ||| v w\nn ||| z\n")
    assert_user_error(run("score-aer", "-g", TINY["talp"], "-a", TINY["fwd"], "-i", joint),
                      f"{joint}:3: missing '|||'")
    assert_user_error(run("score-aer", "-g", TINY["talp"], "-a", TINY["fwd"], "-s", TINY["src"]),
                      "-s and -t")


def test_score_aer_reference_numbers(shared_data):
    result = run("score-aer", "-g", str(shared_data / "deen" / "test.talp"), "-a",
                 str(shared_data / "reference" / "giza.deen.grow-diagonal.talp"),
                 "-s", str(shared_data / "deen" / "test.src"),
                 "-t", str(shared_data / "deen" / "test.tgt"))
    assert stdout_of(result).splitlines()[0].startswith(
        "AER 21.4  P 94.3  R 67.2  F1 78.5  links 6974  sure 9613  possible 10534  "
        "sentences 508")
    atools = run("score-aer", "-g", str(shared_data / "deen" / "test.talp"), "-a",
                 str(shared_data / "reference" / "atools" / "giza.deen.grow-diag.talp"))
    assert stdout_of(atools).startswith("AER 19.3  ")


@pytest.mark.parametrize("heuristic", sorted(EXPECTED))
def test_symmetrize_cli_matches_atools_on_giza_reverse_tgt_src(shared_data, tmp_path, heuristic):
    reference = shared_data / "reference"
    out = tmp_path / "out.txt"
    result = run("symmetrize", "-f", str(reference / "giza.deen.talp"),
                 "-r", str(reference / "giza.deen.reverse.talp"), "--reverse-orientation",
                 "tgt-src", "-H", heuristic, "-o", str(out), "-s",
                 str(shared_data / "deen" / "test.src"), "-t",
                 str(shared_data / "deen" / "test.tgt"), "-q")
    assert result.exit_code == 0, result.output
    ours = [set(line.split()) for line in out.read_text().splitlines()]
    expected = [set(line.split()) for line in
                (reference / "atools" / f"giza.deen.{heuristic}.talp").read_text().splitlines()]
    assert ours == expected


# --- no torch -----------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["symmetrize", "-f", TINY["fwd"], "-r", TINY["rev.src-tgt"], "-q"],
    ["score-aer", "-g", TINY["talp"], "-a", TINY["fwd"], "--translations", TINY["tgt"],
     "--references", TINY["tgt"]],
])
def test_commands_do_not_import_torch(args):
    """The full `align` entry point (all commands registered) runs these without torch."""
    code = ("import runpy, sys\n"
            f"sys.argv = ['align'] + {args!r}\n"
            "try:\n"
            "    runpy.run_module('aligner', run_name='__main__')\n"
            "except SystemExit as exit:\n"
            "    assert not exit.code, exit.code\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "NO-TORCH"


# --- translation metrics next to AER ------------------------------------------------------

def test_translation_scores_perfect_and_against_sacrebleu(tmp_path):
    refs = write(tmp_path, "ref.txt", "the cat sat on the mat .\nthere is a dog here\n")
    perfect = run("score-aer", "--translations", refs, "--references", refs, "--json")
    data = json.loads(stdout_of(perfect))
    assert data["bleu"]["score"] == pytest.approx(100.0)
    assert data["ter"]["score"] == pytest.approx(0.0)
    assert data["bleu"]["signature"].startswith("nrefs:1|")
    hyps = write(tmp_path, "hyp.txt", "the cat sat on a mat .\na dog is here\n")
    from sacrebleu.metrics import BLEU, TER
    expected_bleu = BLEU().corpus_score(["the cat sat on a mat .", "a dog is here"],
                                        [["the cat sat on the mat .", "there is a dog here"]])
    expected_ter = TER().corpus_score(["the cat sat on a mat .", "a dog is here"],
                                      [["the cat sat on the mat .", "there is a dog here"]])
    result = run("score-aer", "-g", TINY["talp"], "-a", grow_diag_file(tmp_path),
                 "--translations", hyps, "--references", refs, "-w", "2")
    lines = stdout_of(result).splitlines()
    assert lines[0].startswith("AER 23.53  ")  # the alignment scores come first
    assert lines[2].startswith("BLEU|nrefs:1|")
    assert f" = {expected_bleu.score:.2f} " in lines[2]
    assert lines[3].startswith("TER|nrefs:1|")
    assert lines[3].endswith(f"= {expected_ter.score:.2f}")


def test_translation_score_errors(tmp_path):
    refs = write(tmp_path, "ref.txt", "a b\nc d\n")
    short = write(tmp_path, "hyp.txt", "a b\n")
    assert_user_error(run("score-aer", "--translations", short, "--references", refs),
                      f"{short}:2: line counts differ: {refs} has 2 lines, {short} has 1")
    assert_user_error(run("score-aer", "--translations", short),
                      "give both --translations and --references")
    assert_user_error(run("score-aer", "-g", TINY["talp"]), "give both -g/--gold and -a")
    assert_user_error(run("score-aer"), "nothing to score")
