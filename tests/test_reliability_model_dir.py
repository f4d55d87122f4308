"""A damaged or hand-edited model directory gives one error line naming the file, never a
traceback nor silently different results: empty or flipped weights files (checked against their
sha256), a damaged corpus cache on --resume, bad config.json values, a vocabulary that does not
match the config, BPE codes that are not UTF-8."""
from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest

from aligner import constants as C
from aligner.model_dir import CHECKSUM_SUFFIX, LoadedModelDir
from conftest import restored_aligner_logger
from cli_runner import error_line, run
from synthetic import monotone_corpus, write_corpus

#: one training run each (--rounds 1; self-training rounds: tests/test_self_training.py)
TINY = ["--bpe-merges", "20", "--d-model", "16", "--heads", "2", "--encoder-layers", "1",
        "--decoder-layers", "1", "--ff-dim", "32", "--max-tokens", "200", "--warmup", "2",
        "--lr", "3e-3", "--checkpoint-interval", "2", "-q", "--rounds", "1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny transformer model directory (2 updates) and its training data; never modified."""
    root = tmp_path_factory.mktemp("trained")
    sources, targets, golds = monotone_corpus(40, seed=4)
    src, tgt, _ = write_corpus(root, "train", sources, targets, golds)
    model = root / "model"
    with restored_aligner_logger():
        run("train", "-s", src, "-t", tgt, "-o", model, "--max-updates", 2, *TINY)
    return dict(model=model, src=src, tgt=tgt)


@pytest.fixture
def model(trained, tmp_path):
    """A private copy of the trained model directory, free to damage."""
    copy = tmp_path / "model"
    shutil.copytree(trained["model"], copy)
    return copy


def extract(trained, model, *args, ok=True):
    return run("extract", model, "-s", trained["src"], "-t", trained["tgt"], *args, ok=ok)


def resume(trained, model, ok=True):
    return run("train", "-s", trained["src"], "-t", trained["tgt"], "-o", model,
               "--max-updates", 4, "--resume", *TINY, ok=ok)


# -- weights files: empty, damaged, checksums -----------------------------------------------

def test_empty_weights_file_is_one_error_line(trained, model):
    (model / "fwd" / C.PARAMS_BEST).write_bytes(b"")
    line = error_line(extract(trained, model, ok=False))
    assert "fwd/params.best.pt: empty file" in line


def test_empty_weights_file_without_checksum_is_one_error_line(trained, model):
    (model / "fwd" / C.PARAMS_BEST).write_bytes(b"")
    (model / "fwd" / (C.PARAMS_BEST + CHECKSUM_SUFFIX)).unlink()
    assert "fwd/params.best.pt: empty file" in error_line(extract(trained, model, ok=False))


def test_empty_training_state_on_resume_is_one_error_line(trained, model):
    (model / "fwd" / C.TRAINING_STATE).write_bytes(b"")
    line = error_line(resume(trained, model, ok=False))
    assert "fwd/training_state.pt: empty file" in line


def test_every_checkpoint_file_has_a_sha256sum_line(trained):
    import hashlib

    for direction in C.DIRECTIONS:
        for name in (C.PARAMS_BEST, C.PARAMS_LAST, C.TRAINING_STATE):
            path = trained["model"] / direction / name
            line = (path.parent / (name + CHECKSUM_SUFFIX)).read_text()
            assert line == f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {name}\n"


def _flip_bytes(path, start, count=64):
    data = bytearray(path.read_bytes())
    for k in range(start, start + count):
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))


def _flip_inside_a_tensor(path):
    """Flip 64 bytes of the largest tensor's raw data: the zip stays readable."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename),
                   key=lambda i: i.file_size)
    # raw storage: the local header (30 bytes + name + extra) precedes the data
    with open(path, "rb") as handle:
        handle.seek(info.header_offset + 26)
        name_len, extra_len = np.frombuffer(handle.read(4), dtype="<u2")
    _flip_bytes(path, info.header_offset + 30 + int(name_len) + int(extra_len) + 8)


def test_flipped_bytes_in_weights_are_refused(trained, model):
    path = model / "fwd" / C.PARAMS_BEST
    _flip_inside_a_tensor(path)
    line = error_line(extract(trained, model, ok=False))
    assert "fwd/params.best.pt: checksum mismatch, the file is damaged" in line


def test_flipped_bytes_in_training_state_are_refused_on_resume(trained, model):
    path = model / "rev" / C.TRAINING_STATE
    _flip_inside_a_tensor(path)
    line = error_line(resume(trained, model, ok=False))
    assert "rev/training_state.pt: checksum mismatch, the file is damaged" in line


def test_model_without_checksums_still_loads(trained, model, caplog):
    for path in model.glob("*/*" + CHECKSUM_SUFFIX):
        path.unlink()
    logger = logging.getLogger("aligner.model_dir")  # (a CLI run above stops propagation)
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("DEBUG", logger="aligner.model_dir"):
            LoadedModelDir.load(str(model), ("fwd",))
    finally:
        logger.removeHandler(caplog.handler)
    assert "params.best.pt: no .sha256 file (written by an older version): not verified" \
        in caplog.text
    reference = extract(trained, trained["model"], "--direction", "fwd").stdout
    assert extract(trained, model, "--direction", "fwd").stdout == reference
    resume(trained, model)  # and a resumed run writes checksums again
    assert (model / "fwd" / (C.TRAINING_STATE + CHECKSUM_SUFFIX)).is_file()


def test_bad_checksum_file_is_one_error_line(trained, model):
    (model / "fwd" / (C.PARAMS_BEST + CHECKSUM_SUFFIX)).write_text("nonsense\n")
    line = error_line(extract(trained, model, ok=False))
    assert "fwd/params.best.pt.sha256:1: not a sha256 checksum line" in line


# -- the encoded corpus on --resume ---------------------------------------------------------

def _truncate(path):
    path.write_bytes(path.read_bytes()[:-8])


def _object_dtype(path):
    np.save(path, np.array([1, "x", None], dtype=object), allow_pickle=True)


def _id_out_of_range(path):
    ids = np.load(path)
    ids[3] = 10_000
    np.save(path, ids)


def _negative_id(path):
    ids = np.load(path)
    ids[0] = -1
    np.save(path, ids)


@pytest.mark.parametrize("damage, message", [
    (_truncate, "mmap length is greater than file size"),
    (_object_dtype, "Python objects"),
    (_id_out_of_range, "ids from 4 to 10000, outside the vocabulary of"),
    (_negative_id, "ids from -1 to"),
])
def test_damaged_corpus_on_resume_is_one_error_line(trained, model, damage, message):
    damage(model / "corpus" / "src.ids.npy")
    line = error_line(resume(trained, model, ok=False))
    assert "corpus/src.ids.npy: damaged (" in line and message in line
    assert "--overwrite to rebuild" in line


def test_damaged_corpus_offsets_are_one_error_line(trained, model):
    path = model / "corpus" / "tgt.offsets.npy"
    offsets = np.load(path)
    offsets[-1] += 5
    np.save(path, offsets)
    line = error_line(resume(trained, model, ok=False))
    assert "corpus/tgt.offsets.npy: damaged (offsets must rise from 0 to the" in line


def test_corpus_written_without_vocabulary_sizes_still_opens(trained, model):
    from aligner.data import EncodedCorpus

    meta = model / "corpus" / "corpus.json"
    stats = json.loads(meta.read_text())
    assert stats["src_vocab_size"] > 4 and stats["tgt_vocab_size"] > 4
    del stats["src_vocab_size"], stats["tgt_vocab_size"]  # as an older version wrote it
    meta.write_text(json.dumps(stats))
    assert len(EncodedCorpus.open(str(model / "corpus"))) == 40
    resume(trained, model)


# -- config.json, vocabularies, BPE codes ---------------------------------------------------

def _edit_config(model, direction, key, value):
    path = model / C.CONFIG_NAME
    config = json.loads(path.read_text())
    config["models"][direction][key] = value
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("key, value, message", [
    ("d_model", "abc", "models.fwd: d_model must be an integer, not 'abc'"),
    ("d_model", -16, "models.fwd: d_model must be positive: -16"),
    ("n_heads", 0, "models.fwd: n_heads must be positive: 0"),
    ("max_positions", -5, "models.fwd: max_positions must be at least 2"),
    ("dropout", None, "models.fwd: dropout must be a number, not None"),
    ("tie_embeddings", "yes", "models.fwd: tie_embeddings must be true or false"),
    ("src_vocab_size", 10 ** 12, "vocab.src.json: "),
    ("tgt_vocab_size", 3.5, "vocab.tgt.json: "),
])
def test_bad_model_config_values_are_one_error_line(trained, model, key, value, message):
    _edit_config(model, "fwd", key, value)
    line = error_line(extract(trained, model, ok=False))
    assert message in line
    assert (C.CONFIG_NAME + ": models.fwd:" in line) or "does not belong to this model" in line


def test_bad_training_config_value_is_one_error_line(trained, model):
    path = model / C.CONFIG_NAME
    config = json.loads(path.read_text())
    config["training"]["lr"] = "fast"
    path.write_text(json.dumps(config))
    line = error_line(extract(trained, model, ok=False))
    assert f"{C.CONFIG_NAME}: training: lr must be a number, not 'fast'" in line


def test_vocabulary_with_tokens_removed_is_refused(trained, model):
    path = model / C.VOCAB_TGT
    vocab = json.loads(path.read_text())
    size = len(vocab["tokens"])
    vocab["tokens"] = vocab["tokens"][:-3]
    path.write_text(json.dumps(vocab))
    line = error_line(extract(trained, model, ok=False))
    assert f"vocab.tgt.json: {size - 3} tokens, but config.json gives {size} " \
           f"(models.fwd.tgt_vocab_size): the vocabulary does not belong to this model" in line


def test_vocabulary_with_a_non_string_token_is_one_error_line(trained, model):
    path = model / C.VOCAB_SRC
    vocab = json.loads(path.read_text())
    vocab["tokens"][-1] = ["a", "list"]
    path.write_text(json.dumps(vocab))
    line = error_line(extract(trained, model, ok=False))
    assert "vocab.src.json: a token must be a string, not ['a', 'list']" in line


def test_bpe_codes_not_utf8_is_one_error_line(trained, model):
    path = model / C.BPE_CODES_SRC
    lines = path.read_bytes().split(b"\n")
    lines[2] = b"\xff\xfe " + lines[2]
    path.write_bytes(b"\n".join(lines))
    line = error_line(extract(trained, model, ok=False))
    assert f"{C.BPE_CODES_SRC}:3: not UTF-8 text (byte 0xff)" in line


def test_bad_prep_config_value_is_one_error_line(trained, model):
    path = model / "prep.json"
    prep = json.loads(path.read_text())
    prep["bpe_merges"] = "many"
    path.write_text(json.dumps(prep))
    line = error_line(extract(trained, model, ok=False))
    assert "prep.json: not a valid preprocessing config (bpe_merges must be an integer" in line


def test_old_corpus_with_an_id_outside_the_vocabulary_is_one_error_line_on_resume(trained,
                                                                                   model):
    """A corpus.json without vocabulary sizes (older versions): training checks the ids."""
    meta = model / "corpus" / "corpus.json"
    stats = json.loads(meta.read_text())
    del stats["src_vocab_size"], stats["tgt_vocab_size"]
    meta.write_text(json.dumps(stats))
    _id_out_of_range(model / "corpus" / "src.ids.npy")
    line = error_line(resume(trained, model, ok=False))
    assert "corpus/src.ids.npy: damaged (id 10000 outside the vocabulary of" in line
