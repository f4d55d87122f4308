"""gzip-compressed input files (aligner/formats.py iter_lines): known by their first bytes, read
decompressed line by line as their text would be read (the same lines, the same errors), and
damaged compressed data is one error line naming the file and line. Every reader of a
regular file takes them: `align train` and `align extract` here, the gold and Pharaoh files of
`align score-aer`."""
from __future__ import annotations

import gzip

import pytest

from aligner.formats import BitextFiles, iter_lines, read_lines
from aligner.utils import AlignerError
from cli_runner import error_line, run
from synthetic import monotone_corpus, write_corpus
from test_cli_train_extract import TINY
from test_extract import make_model_dir
from test_streaming_prep import CONTENTS


def _gzip(path, content: bytes):
    with gzip.open(path, "wb") as handle:
        handle.write(content)
    return str(path)


def _compress(path) -> str:
    with open(path, "rb") as handle:
        return _gzip(str(path) + ".gz", handle.read())


@pytest.mark.parametrize("content", CONTENTS)
def test_a_gzip_file_reads_as_its_text(tmp_path, content):
    plain = tmp_path / "f.txt"
    plain.write_bytes(content)
    packed = _gzip(tmp_path / "f.gz", content)
    try:
        expected = read_lines(str(plain))
    except AlignerError as error:   # the same error, naming the compressed file
        with pytest.raises(AlignerError) as raised:
            read_lines(packed)
        assert str(raised.value) == str(error).replace(str(plain), packed)
        return
    assert read_lines(packed) == expected


def test_gzip_is_known_by_content_and_members_are_concatenated(tmp_path):
    plain_named_gz = tmp_path / "plain.gz"
    plain_named_gz.write_text("a b\nc\n")
    assert read_lines(str(plain_named_gz)) == ["a b", "c"]
    unnamed = _gzip(tmp_path / "packed.txt", b"x\ny z\n")
    assert read_lines(unnamed) == ["x", "y z"]
    two_members = tmp_path / "two.gz"   # what `cat a.gz b.gz > two.gz` makes
    two_members.write_bytes(gzip.compress(b"a\nb") + gzip.compress(b"c\n"))
    assert read_lines(str(two_members)) == ["a", "bc"]


def test_damaged_gzip_data_is_one_line_naming_file_and_line(tmp_path):
    text = "".join(f"line {k}\n" for k in range(20000)).encode()
    data = gzip.compress(text)
    truncated = tmp_path / "cut.gz"
    truncated.write_bytes(data[:len(data) // 2])
    with pytest.raises(AlignerError, match=r"cut\.gz: damaged gzip data, found while reading "
                                           r"line \d+ \("):
        list(iter_lines(str(truncated)))
    bad_crc = tmp_path / "crc.gz"
    bad_crc.write_bytes(data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:])
    with pytest.raises(AlignerError, match=r"crc\.gz: damaged gzip data, found while reading "
                                           r"line 20001 \(CRC check failed"):
        list(iter_lines(str(bad_crc)))
    middle = bytearray(data)            # deflate data broken in the middle of the member
    middle[len(data) // 2: len(data) // 2 + 64] = bytes(64)
    (tmp_path / "mid.gz").write_bytes(bytes(middle))
    with pytest.raises(AlignerError, match=r"mid\.gz: damaged gzip data, found while reading"):
        list(iter_lines(str(tmp_path / "mid.gz")))
    gold = tmp_path / "gold.talp"
    gold.write_text("0-0\n")
    assert error_line(run("score-aer", "-g", gold, "-a", truncated, ok=False)).startswith(
        f"align: error: {truncated}:")


def test_gzip_data_on_a_pipe_or_standard_input_is_refused_in_one_line(tmp_path, monkeypatch):
    """Decompressing needs the file: a FIFO (bash's <(cat x.gz)), standard input and the
    streaming path of `align extract` refuse gzip data instead of reporting bad UTF-8."""
    import io
    import os
    import threading

    from aligner.extract.streaming import LineSource

    packed = gzip.compress(b"a b\nc\n", mtime=0)   # (no newline byte: see below)
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: open(fifo, "wb").write(packed))
    writer.start()
    with pytest.raises(AlignerError, match=r"fifo: gzip-compressed data on a pipe: give the "
                                           r"\.gz file itself, or decompress into the pipe"):
        read_lines(fifo)
    writer.join()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(packed)))
    with pytest.raises(AlignerError, match=r"^-: gzip-compressed data on a pipe"):
        read_lines("-")
    # the header's mtime decides whether the compressed bytes hold a newline: without one the
    # whole input is one last line, refused as gzip data (not "empty file")
    for mtime, has_newline in ((0, False), (10, True)):
        packed = gzip.compress(b"a b\nc\n", mtime=mtime)
        assert (b"\n" in packed) == has_newline
        read_end, write_end = os.pipe()
        os.write(write_end, packed)
        os.close(write_end)
        source = LineSource("piped", read_end)
        while not source.eof:
            source.fill()
        os.close(read_end)
        assert str(source.error).startswith("piped: gzip-compressed data on a pipe")


def test_train_and_extract_read_gzip_files_as_their_text(tmp_path):
    sources, targets, golds = monotone_corpus(40, seed=4)
    src, tgt, gold = write_corpus(tmp_path, "train", sources, targets, golds)
    src_gz, tgt_gz, gold_gz = _compress(src), _compress(tgt), _compress(gold)
    assert list(BitextFiles(src_gz, tgt_gz)) == list(BitextFiles(src, tgt))
    assert list(BitextFiles(src_gz, tgt_gz).pairs_at([3, 17])) == \
        list(BitextFiles(src, tgt).pairs_at([3, 17]))
    for name, files in (("plain", (src, tgt)), ("packed", (src_gz, tgt_gz))):
        run("train", "-s", files[0], "-t", files[1], "-o", tmp_path / name, "--max-updates", 2,
            "--seed", 5, *TINY)
    for name in ("bpe.src.codes", "vocab.tgt.json", "corpus/src.ids.npy", "corpus/tgt.ids.npy"):
        assert (tmp_path / "plain" / name).read_bytes() == \
            (tmp_path / "packed" / name).read_bytes(), name
    model, _, _ = make_model_dir(tmp_path)
    run("extract", model, "-s", src, "-t", tgt, "-o", tmp_path / "plain.align", "-q")
    run("extract", model, "-s", src_gz, "-t", tgt_gz, "-o", tmp_path / "packed.align", "-q")
    assert (tmp_path / "packed.align").read_text() == (tmp_path / "plain.align").read_text()
    plain = run("score-aer", "-g", gold, "-a", tmp_path / "plain.align").stdout
    packed = run("score-aer", "-g", gold_gz, "-a", _compress(tmp_path / "plain.align")).stdout
    assert packed == plain and plain.startswith("AER")
