"""Alignments in pipelines (issue 31): `align extract` streaming from a pipe, per-link
probabilities checked against the --soft matrices of the same run, `align score-aer` on
i-j:p files and its threshold sweep, the Python API's link probabilities, and the README's
Moses hand-off run on the shipped sample."""
from __future__ import annotations

import os
import re
import select
import shlex
import subprocess
import sys
import threading

import numpy as np
import pytest

from aligner.formats import read_pharaoh
from cli_runner import error_line, run
from conftest import ROOT, SAMPLE, restored_aligner_logger
from synthetic import monotone_corpus, write_corpus

TINY = ["--model", "transformer", "--bpe-merges", "20", "--d-model", "16", "--heads", "2",
        "--encoder-layers", "1", "--decoder-layers", "1", "--ff-dim", "32", "--max-tokens",
        "200", "--warmup", "2", "--lr", "3e-3", "--checkpoint-interval", "2", "-q"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ALIGN = [sys.executable, "-m", "aligner"]
#: seconds a pipe read or wait may take before the test fails instead of hanging: a guard
#: against a hang, not a speed check (a loaded machine took over 120 s for one line)
TIMEOUT = 600


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny trained transformer (both directions) and a test bitext of 12 pairs."""
    directory = tmp_path_factory.mktemp("pipelines")
    sources, targets, golds = monotone_corpus(40, seed=5)
    src, tgt, gold = write_corpus(directory, "train", sources, targets, golds)
    tsrc, ttgt, tgold = write_corpus(directory, "test", sources[:12], targets[:12], golds[:12])
    model = directory / "model"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, "--max-updates", 3, *TINY)
    joint = directory / "test.joint"
    joint.write_text("".join(f"{' '.join(s)} ||| {' '.join(t)}\n"
                             for s, t in zip(sources[:12], targets[:12])))
    return dict(model=model, src=tsrc, tgt=ttgt, gold=tgold, joint=joint, dir=directory)


def _readline(stream, timeout: float = TIMEOUT) -> bytes:
    """One line from a subprocess pipe, failing instead of hanging when none comes."""
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, "no line came back in time"
    return stream.readline()


# --- streaming ----------------------------------------------------------------------------

def test_stream_one_pair_at_a_time_through_a_pipe(tiny):
    """Write one pair, read its alignment back before writing the next; EOF ends with 0.
    The lines equal those of the file path (the block path) for the same input."""
    expected = run("extract", tiny["model"], "-i", tiny["joint"], "-q").stdout.splitlines()
    pairs = tiny["joint"].read_text().splitlines()
    process = subprocess.Popen([*ALIGN, "extract", str(tiny["model"]), "-i", "-", "-o", "-",
                                "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=ENV)
    try:
        for pair, want in zip(pairs[:4], expected):
            process.stdin.write((pair + "\n").encode())
            process.stdin.flush()
            assert _readline(process.stdout).decode().rstrip("\n") == want
        process.stdin.close()
        assert process.stdout.read() == b""
        assert process.wait(timeout=TIMEOUT) == 0
        assert b"Traceback" not in process.stderr.read()
    finally:
        process.kill()


def test_stream_ends_quietly_when_the_reader_goes_away(tiny):
    """SIGPIPE: the reader closes its end after one line while pairs keep coming: the
    process ends without a traceback (and non-zero, as `yes | head` ends `yes`)."""
    line = (tiny["joint"].read_text().splitlines()[0] + "\n").encode()
    process = subprocess.Popen([*ALIGN, "extract", str(tiny["model"]), "-i", "-", "-o", "-"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=ENV)
    stop = threading.Event()

    def feed():
        try:
            while not stop.is_set():
                process.stdin.write(line * 20)
                process.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        assert _readline(process.stdout)
        process.stdout.close()
        code = process.wait(timeout=TIMEOUT)
        stop.set()
        stderr = process.stderr.read().decode()
        assert code != 0 and "Traceback" not in stderr and "Error" not in stderr, stderr
    finally:
        stop.set()
        process.kill()


def test_stream_matches_file_mode_for_side_files_and_blank_sides(tiny, tmp_path):
    """-s/-t from pipes and -i - from a pipe (with an empty side: an empty line and a
    warning naming the line) give the file path's lines; < file takes the file path."""
    lines = tiny["joint"].read_text().splitlines()
    lines[3] = lines[3].split("|||")[0] + "|||"
    joint = tmp_path / "blank.joint"
    joint.write_text("\n".join(lines) + "\n")
    expected = run("extract", tiny["model"], "-i", joint, "-q").stdout
    piped = subprocess.run(f"cat {shlex.quote(str(joint))} | {shlex.join(ALIGN)} extract "
                           f"{shlex.quote(str(tiny['model']))} -i - -o - -q", shell=True,
                           capture_output=True, env=ENV, timeout=TIMEOUT)
    assert piped.returncode == 0 and piped.stdout.decode() == expected
    assert "-:4: an empty side: writing an empty alignment" in piped.stderr.decode()
    sides = subprocess.run(
        ["bash", "-c", f"{shlex.join(ALIGN)} extract {shlex.quote(str(tiny['model']))} -q "
                       f"-s <(cat {shlex.quote(str(tiny['src']))}) "
                       f"-t <(cat {shlex.quote(str(tiny['tgt']))})"],
        capture_output=True, env=ENV, timeout=TIMEOUT)
    assert sides.returncode == 0, sides.stderr
    assert sides.stdout.decode() == run("extract", tiny["model"], "-s", tiny["src"], "-t",
                                        tiny["tgt"], "-q").stdout
    with open(joint, "rb") as stdin:   # a regular file on stdin: the block path
        redirected = subprocess.run([*ALIGN, "extract", str(tiny["model"]), "-i", "-", "-q"],
                                    stdin=stdin, capture_output=True, env=ENV,
                                    timeout=TIMEOUT)
    assert redirected.returncode == 0 and redirected.stdout.decode() == expected


def test_stream_bad_line_after_the_good_ones(tiny):
    """A malformed line: the lines before it are written, then one error line naming it."""
    good = tiny["joint"].read_text().splitlines()[:2]
    result = subprocess.run([*ALIGN, "extract", str(tiny["model"]), "-i", "-", "-q"],
                            input=("\n".join(good) + "\nno separator here\n").encode(),
                            capture_output=True, env=ENV, timeout=TIMEOUT)
    assert result.returncode == 1
    assert len(result.stdout.decode().splitlines()) == 2
    stderr = result.stderr.decode()
    assert stderr.strip() == "align: error: -:3: missing '|||' between source and target"
    bad = subprocess.run([*ALIGN, "extract", str(tiny["model"]), "-i", "-", "-q"],
                         input=good[0].encode() + b"\n\xff ||| x\n", capture_output=True,
                         env=ENV, timeout=TIMEOUT)
    assert bad.returncode == 1 and len(bad.stdout.splitlines()) == 1
    assert bad.stderr.decode().strip() == ("align: error: -:2: not valid UTF-8 (byte 0xff at "
                                           "column 1)")


def test_stream_batches_wait_at_most_the_documented_time():
    """StreamBitext: a pair alone is handed on after WAIT_SECONDS; pairs that arrive
    together go in one batch; side files must end together."""
    import time

    from aligner.extract.streaming import WAIT_SECONDS, LineSource, StreamBitext
    from aligner.utils import AlignerError

    read_fd, write_fd = os.pipe()
    source = LineSource("pipe", fd=read_fd)
    bitext = StreamBitext([source])
    os.write(write_fd, b"a b ||| c d\ne ||| f\n")
    batches = bitext.batches()
    start = time.monotonic()
    first = next(batches)
    assert len(first) == 2 and first.first_line == 1
    assert time.monotonic() - start < WAIT_SECONDS + 1.0
    os.write(write_fd, b"g ||| h\n")
    second = next(batches)
    assert (second.source, second.target, second.first_line) == ([["g"]], [["h"]], 3)
    os.close(write_fd)
    assert list(batches) == []
    os.close(read_fd)

    fds = [os.pipe() for _ in range(2)]
    sides = []
    for (r, w), data, name in zip(fds, (b"a\nb\n", b"c\n"), ("src", "tgt")):
        os.write(w, data)
        os.close(w)
        sides.append(LineSource(name, fd=r))
    with pytest.raises(AlignerError, match="src:2: line counts differ: tgt has 1 lines, src "
                                           "has more"):
        list(StreamBitext(sides).batches())
    for r, _ in fds:
        os.close(r)


# --- per-link probabilities -----------------------------------------------------------------

@pytest.mark.parametrize("direction, heuristic", [("both", "soft-average"),
                                                  ("both", "grow-diag-final-and"),
                                                  ("fwd", None), ("rev", None)])
def test_link_probs_are_the_soft_matrices_of_the_run(tiny, tmp_path, direction, heuristic):
    """--link-probs and --inline-probs numbers against the --soft .npz of the same run: the
    mean of fwd and rev for soft-average, both for a Moses heuristic, the direction's own
    for one direction (4 decimals); the links are those of the run without probabilities."""
    args = ["extract", tiny["model"], "-s", tiny["src"], "-t", tiny["tgt"], "-q",
            "--direction", direction]
    if heuristic:
        args += ["-H", heuristic]
        if heuristic == "soft-average":
            args += ["--threshold", "0.05"]
    plain = run(*args).stdout
    soft, probs = tmp_path / "soft.npz", tmp_path / "probs.txt"
    pharaoh = tmp_path / "out.txt"
    run(*args, "--soft", soft, "--link-probs", probs, "-o", pharaoh)
    assert pharaoh.read_text() == plain
    inline = run(*args, "--inline-probs").stdout          # block path, no --soft
    blocks = tmp_path / "probs2.txt"
    run(*args, "--link-probs", blocks, "-o", tmp_path / "out2.txt")
    assert blocks.read_text() == probs.read_text()
    matrices = np.load(soft)
    prob_lines = probs.read_text().split("\n")[:-1]
    inline_lines = inline.split("\n")[:-1]
    n_links = 0
    for k, (line, numbers, inline_line) in enumerate(zip(plain.split("\n"), prob_lines,
                                                         inline_lines)):
        links = [tuple(map(int, t.split("-"))) for t in line.split()]
        tokens = numbers.split()
        assert len(tokens) == len(links)
        assert inline_line == " ".join(f"{i}-{j}:{p}" for (i, j), p in zip(links, tokens))
        for (i, j), token in zip(links, tokens):
            values = [float(v) for v in token.split(",")]
            fwd, rev = (float(matrices[f"{d}_{k}"][i, j]) if f"{d}_{k}" in matrices else None
                        for d in ("fwd", "rev"))
            if direction == "fwd":
                want = [fwd]
            elif direction == "rev":
                want = [rev]
            elif heuristic == "soft-average":
                want = [(fwd + rev) / 2]
                assert want[0] > 0.05
            else:
                want = [fwd, rev]
            assert values == pytest.approx(want, abs=5.1e-5)
            n_links += 1
    assert n_links > 0


def test_link_probs_streamed_and_errors(tiny, tmp_path):
    """--inline-probs streams i-j:p to stdout; --link-probs from a pipe appears when done;
    option errors are one line before any work."""
    probs = tmp_path / "probs.txt"
    file_args = ["-H", "grow-diag", "-q"]
    expected = run("extract", tiny["model"], "-i", tiny["joint"], "--inline-probs",
                   *file_args).stdout
    piped = subprocess.run([*ALIGN, "extract", str(tiny["model"]), "-i", "-", "-o", "-",
                            "--inline-probs", "--link-probs", str(probs), *file_args],
                           input=tiny["joint"].read_bytes(), capture_output=True, env=ENV,
                           timeout=TIMEOUT)
    assert piped.returncode == 0 and piped.stdout.decode() == expected
    assert [line.count(" ") for line in probs.read_text().splitlines()] == [
        line.count(" ") for line in expected.splitlines()]
    assert "--link-probs -: give a file name" in error_line(
        run("extract", tiny["model"], "-i", tiny["joint"], "--link-probs", "-", ok=False))
    assert "-o and --link-probs name the same file" in error_line(
        run("extract", tiny["model"], "-i", tiny["joint"], "--link-probs", probs, "-o",
            probs, ok=False))


# --- score-aer --------------------------------------------------------------------------------

def test_score_aer_reads_inline_probs_and_sweeps(tiny, tmp_path):
    """i-j:p links score as the same links without numbers; --sweep prints one row per
    threshold (links above it, as soft-average keeps them) and draws a PNG; the same
    numbers from a --link-probs file give the same table."""
    pytest.importorskip("matplotlib")
    base = ["extract", tiny["model"], "-s", tiny["src"], "-t", tiny["tgt"], "-q", "-H",
            "soft-average", "--threshold", "0.01"]
    inline, plain, probs = tmp_path / "inline.txt", tmp_path / "plain.txt", tmp_path / "p.txt"
    run(*base, "--inline-probs", "-o", inline)
    run(*base, "--link-probs", probs, "-o", plain)
    score = ["score-aer", "-g", tiny["gold"], "-s", tiny["src"], "-t", tiny["tgt"]]
    assert run(*score, "-a", inline).stdout == run(*score, "-a", plain).stdout
    png = tmp_path / "pr.png"
    swept = run(*score, "-a", inline, "--sweep", png, "--json")
    import json
    rows = json.loads(swept.stdout)["sweep"]
    assert [r["threshold"] for r in rows] == pytest.approx([k / 20 for k in range(20)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the row of threshold 0.3: the score of the soft-average links at --threshold 0.3
    at_03 = tmp_path / "at03.txt"
    run("extract", tiny["model"], "-s", tiny["src"], "-t", tiny["tgt"], "-q", "-H",
        "soft-average", "--threshold", "0.3", "-o", at_03)
    direct = json.loads(run(*score, "-a", at_03, "--json").stdout)
    row = next(r for r in rows if abs(r["threshold"] - 0.3) < 1e-9)
    assert (row["aer"], row["links"]) == (pytest.approx(direct["aer"]), direct["links"])
    from_file = run(*score, "-a", plain, "--link-probs", probs, "--sweep", tmp_path / "b.png",
                    "--json")
    assert json.loads(from_file.stdout)["sweep"] == rows
    line = error_line(run(*score, "-a", plain, "--sweep", tmp_path / "c.png", ok=False))
    assert re.search(r"plain.txt:\d+: link '\d+-\d+' has no probability", line)
    bad = tmp_path / "bad.txt"
    bad.write_text("0-0:x\n" * 12)
    assert "bad.txt:1: malformed link '0-0:x'" in error_line(run(*score, "-a", bad, ok=False))


# --- Python API -----------------------------------------------------------------------------

def test_api_link_probs_equal_the_command_line(tiny, tmp_path):
    """Aligner.align_with_link_probs: the links and numbers of align extract --link-probs,
    with the model loaded once for several calls."""
    from aligner import Aligner

    aligner = Aligner.load(str(tiny["model"]), device="cpu")
    src = [line.split() for line in tiny["src"].read_text().splitlines()]
    tgt = [line.split() for line in tiny["tgt"].read_text().splitlines()]
    for heuristic in ("soft-average", "grow-diag"):
        probs = tmp_path / f"{heuristic}.txt"
        out = run("extract", tiny["model"], "-s", tiny["src"], "-t", tiny["tgt"], "-q", "-H",
                  heuristic, "--threshold" if heuristic == "soft-average" else "-q",
                  *(["0.05"] if heuristic == "soft-average" else []), "--link-probs", probs)
        scored = aligner.align_with_link_probs(src, tgt, heuristic=heuristic,
                                               threshold=0.05 if heuristic == "soft-average"
                                               else None)
        assert [[link for link, _ in pair] for pair in scored] == [
            sorted(links) for links in read_pharaoh_text(out.stdout)]
        for pair, line in zip(scored, probs.read_text().splitlines()):
            assert [",".join(f"{p:.4f}" for p in numbers) for _, numbers in pair] == \
                line.split()
    one = aligner.align_with_link_probs(["a b"], ["c d"], direction="fwd")[0]
    assert all(len(numbers) == 1 and 0.0 <= numbers[0] <= 1.0 for _, numbers in one)


def read_pharaoh_text(text):
    return [{tuple(map(int, t.split("-"))) for t in line.split()}
            for line in text.split("\n")[:-1]]


# --- the Moses hand-off ----------------------------------------------------------------------

def _readme_moses_lines():
    """The command lines of the README's Moses hand-off block."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("**Moses hand-off.**"):]
    block = section[section.index("```\n") + 4:]
    return block[:block.index("```")].strip().splitlines()


def test_readme_moses_hand_off_on_the_sample(tmp_path):
    """Run the README's lines on 120 pairs of the shipped sample (a tiny model instead of
    the recipe) and check what train-model.perl --first-step 4 would read: CORPUS.f,
    CORPUS.e and PREFIX.align, line-aligned, every link foreign-english within range."""
    lines = _readme_moses_lines()
    for lang in ("en", "fr"):
        sample = (SAMPLE / f"train.{lang}").read_text().splitlines()[:120]
        (tmp_path / f"raw.{lang}").write_text("\n".join(sample) + "\n")
    python = shlex.quote(sys.executable)
    moses = None
    for line in lines:
        words = shlex.split(line)
        if words[0] == "train-model.perl":
            moses = words
            continue
        if words[0] == "align":
            line = f"{python} -m aligner{line[len('align'):]}"
            if words[1] == "train":
                line += " --max-updates 2 " + shlex.join(TINY)
        elif words[0] == "sacremoses":
            line = f"{python} -m sacremoses{line[len('sacremoses'):]}"
        done = subprocess.run(line, shell=True, cwd=tmp_path, env=ENV, capture_output=True,
                              timeout=600)
        assert done.returncode == 0, (line, done.stderr.decode()[-2000:])
    assert moses is not None and "--first-step" in moses
    option = {moses[k]: moses[k + 1] for k in range(1, len(moses) - 1)
              if moses[k].startswith("--")}
    assert option["--first-step"] == "4" and option["--alignment"] == "align"
    corpus, prefix = tmp_path / option["--corpus"], tmp_path / option["--alignment-file"]
    foreign = (tmp_path / f"{corpus}.{option['--f']}").read_text().splitlines()
    english = (tmp_path / f"{corpus}.{option['--e']}").read_text().splitlines()
    alignment = read_pharaoh(f"{prefix}.{option['--alignment']}")
    assert len(foreign) == len(english) == len(alignment) == 120
    assert sum(map(len, alignment)) > 0
    for links, f_line, e_line in zip(alignment, foreign, english):
        assert all(i < len(f_line.split(" ")) and j < len(e_line.split(" ")) for i, j in links)
