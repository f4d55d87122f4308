"""The training corpus of a model directory: the bitext tokenized and encoded into
MODEL_DIR/corpus (memory-mapped ids, a guide's subword links), the record of the data it came
from (its fingerprint, MODEL_DIR/corpus/inputs.json) and the check that a resumed run trains on
that data.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from aligner import constants as C
from aligner import faults
from aligner.config import DataConfig
from aligner.data import EncodedCorpus
from aligner.formats import Bitext, BitextFiles
from aligner.model_dir import CORPUS_DIR, load_preprocessing
from aligner.utils import AlignerError, atomic_output, check_condition
from aligner.vocab import Vocabulary

if TYPE_CHECKING:  # pragma: no cover
    from aligner.prep import Preprocessor, PrepConfig

logger = logging.getLogger(__name__)


class _TokenizedSide:
    """One side of a bitext after the preprocessor's tokenization/lowercasing, re-iterable:
    each pass tokenizes the side's sentences again (nothing is kept)."""

    def __init__(self, pre: "Preprocessor", sentences: Iterable[List[str]], side: str):
        self.pre, self.sentences, self.side = pre, sentences, side

    def __iter__(self) -> Iterator[List[str]]:
        for words in self.sentences:
            yield self.pre.tokenize_line(" ".join(words), self.side)

    def __len__(self) -> int:
        return len(self.sentences)  # type: ignore[arg-type]


def tokenize_bitext(pre: "Preprocessor", bitext: "Bitext | BitextFiles"
                    ) -> Tuple[Iterable[List[str]], Iterable[List[str]]]:
    """Words of both sides after the preprocessor's tokenization/lowercasing (if any): the
    bitext's own sides when it has neither, else re-iterable views that tokenize as they go
    (in memory only for an in-memory :class:`Bitext`)."""
    if not (pre.config.tokenize or pre.config.lowercase):
        return bitext.source, bitext.target
    if isinstance(bitext, Bitext):
        return ([pre.tokenize_line(" ".join(words), "src") for words in bitext.source],
                [pre.tokenize_line(" ".join(words), "tgt") for words in bitext.target])
    return _TokenizedSide(pre, bitext.source, "src"), _TokenizedSide(pre, bitext.target, "tgt")


#: in MODEL_DIR/corpus: which bitext the cached corpus was encoded from (see record_inputs)
INPUTS_NAME = "inputs.json"


def update_fingerprint(digest: "hashlib._Hash", source: Sequence[str],
                       target: Sequence[str]) -> None:
    """Add one pair's words to a sha256 fingerprint (see :func:`bitext_fingerprint`)."""
    digest.update(f"{' '.join(source)}\t{' '.join(target)}\n".encode("utf-8"))


def bitext_fingerprint(bitext: "Bitext | BitextFiles") -> str:
    """sha256 of the bitext's words, pair by pair (the same for the same text however its
    files are named, spaced or stored); one pass, one pair in memory at a time."""
    digest = hashlib.sha256()
    for source, target in bitext:
        update_fingerprint(digest, source, target)
    return digest.hexdigest()


def _bitext_names(bitext: Bitext) -> str:
    """'train.src + train.tgt', or the one file of a joint bitext."""
    if bitext.source_name == bitext.target_name:
        return bitext.source_name
    return f"{bitext.source_name} + {bitext.target_name}"


def start_weights(start_dir: str) -> Dict[str, str]:
    """{direction: sha256 of params.best.pt} of the model directory a run starts from
    (--init-from, or the base of stage 2): what is compared on --resume, wherever it lies."""
    from aligner.model_dir import file_sha256, params_path, recorded_checksum

    paths = {direction: params_path(start_dir, direction, "best") for direction in C.DIRECTIONS}
    # the checksum written beside the weights (checked on every load), hashed only without one
    return {direction: recorded_checksum(path) or file_sha256(path)
            for direction, path in paths.items() if os.path.isfile(path)}


def record_inputs(model_dir: str, bitext: "Bitext | BitextFiles",
                  fingerprint: Optional[str] = None, guide: Optional[str] = None,
                  start_dir: Optional[str] = None) -> None:
    """Write MODEL_DIR/corpus/inputs.json: the files, pair count and fingerprint of the bitext
    the cached corpus is encoded from, and the sha256 of its `guide` file, if any
    (:func:`check_inputs` compares them on --resume); `fingerprint`: its
    :func:`bitext_fingerprint` when already known."""
    from aligner.model_dir import file_sha256

    record = {"files": _bitext_names(bitext), "pairs": len(bitext),
              "sha256": fingerprint or bitext_fingerprint(bitext)}
    if guide is not None and os.path.isfile(guide):   # (a pipe was read once, when encoded)
        record["guide_sha256"] = file_sha256(guide)
    if start_dir is not None:
        record["start_weights_sha256"] = start_weights(start_dir)
    with atomic_output(os.path.join(model_dir, CORPUS_DIR, INPUTS_NAME)) as out:
        json.dump(record, out, indent=2, sort_keys=True)
        out.write("\n")


def check_inputs(model_dir: str, bitext: Bitext, ignore_change: bool = False,
                 guide: Optional[str] = None, start_dir: Optional[str] = None,
                 saved_guide: Optional[str] = None) -> None:
    """On --resume: refuse (one line) when `bitext` is not the bitext the cached corpus of
    `model_dir` was encoded from, unless `ignore_change` (then training continues on the cached
    corpus and `bitext` is not used). Likewise for the `guide` file: it is compared by content,
    wherever it lies now (a run resumed from another directory, or after the model directory
    moved, names it by another path). A corpus without a record (written by an older version)
    cannot be checked: a warning says so."""
    from aligner.model_dir import file_sha256

    path = os.path.join(model_dir, CORPUS_DIR, INPUTS_NAME)
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
        recorded = (str(record["files"]), int(record["pairs"]), str(record["sha256"]))
    except FileNotFoundError:
        logger.warning("%s: missing (written by an older version): cannot check that %s is the "
                       "data the cached corpus was built from", path, _bitext_names(bitext))
        return
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise AlignerError(f"{path}: not a record of the training data ({error})") from None
    files, pairs, fingerprint = recorded
    guide_sha256 = record.get("guide_sha256")
    if guide is not None and not ignore_change:
        if guide_sha256 is not None:
            changed = os.path.isfile(guide) and file_sha256(guide) != guide_sha256
        else:   # recorded before guides were fingerprinted: compare where they lie
            changed = (saved_guide is not None
                       and os.path.realpath(saved_guide) != os.path.realpath(guide))
        if changed:
            raise AlignerError(f"{guide}: not the guide the run's corpus was encoded with "
                               f"(its content differs); --resume would go on training with "
                               f"the old one (use --overwrite to train with this guide)")
    recorded_start = record.get("start_weights_sha256")
    if start_dir is not None and recorded_start is not None:
        now = start_weights(start_dir)
        check_condition(all(now.get(d) == sha for d, sha in recorded_start.items()),
                        f"{start_dir}: not the model the run started from (its weights "
                        f"differ); a direction without a checkpoint would start from these "
                        f"(use --overwrite to start anew from them)")
    if fingerprint == bitext_fingerprint(bitext):
        return
    if ignore_change:
        logger.warning("%s differs from the data of the cached corpus (%s, %d pairs): "
                       "continuing on the cached corpus (--resume-ignore-data-change)",
                       _bitext_names(bitext), files, pairs)
        return
    what = ("changed since the run's corpus was built from it" if files == _bitext_names(bitext)
            else f"not the data the run's corpus was built from ({files})")
    raise AlignerError(f"{_bitext_names(bitext)}: {what}: {pairs} pairs then, {len(bitext)} "
                       f"now, different text; --resume would go on training on the old corpus "
                       f"(use --overwrite to train on the new data, or "
                       f"--resume-ignore-data-change to continue on the old corpus)")


def _encode_and_save(pre, src_vocab, tgt_vocab, source, target, model_dir: str,
                     data_config, bitext: "Bitext | BitextFiles",
                     fingerprint: Optional[str] = None, start_dir: Optional[str] = None) -> None:
    """Encode the training corpus into MODEL_DIR/corpus (with the record of the bitext it came
    from, `bitext`) and save prep, BPE and vocabularies. `source` / `target`: the bitext's
    (tokenized) sides, iterated once for the corpus and once more for a guide."""
    from aligner.data import encode_corpus

    corpus_dir = os.path.join(model_dir, CORPUS_DIR)
    encode_corpus(pre, src_vocab, tgt_vocab, source, target, corpus_dir,
                  max_len=data_config.max_len, max_ratio=data_config.max_ratio)
    if data_config.guide:
        _encode_guide(pre, data_config.guide, source, target, corpus_dir)
    record_inputs(model_dir, bitext, fingerprint, guide=data_config.guide or None,
                  start_dir=start_dir)
    pre.save(model_dir)
    src_vocab.save(os.path.join(model_dir, C.VOCAB_SRC))
    tgt_vocab.save(os.path.join(model_dir, C.VOCAB_TGT))


def _encode_guide(pre, path: str, source, target, corpus_dir: str) -> None:
    """Read the --guide file (Pharaoh word links of the training lines as training sees their
    words) line by line beside the bitext, check it (one error line) and store its subword
    links beside the encoded corpus (aligner/training/guidance.py)."""
    from aligner.formats import iter_pharaoh
    from aligner.training.guidance import encode_guides

    line_numbers = EncodedCorpus.open(corpus_dir).line_numbers
    n_word_links, n_links = encode_guides(pre, iter_pharaoh(path), source, target,
                                          line_numbers, corpus_dir, path)
    logger.info("guide %s: %d word links, %d subword links over %d training pairs", path,
                n_word_links, n_links, len(line_numbers))


def prepare_data(model_dir: str, bitext: "Bitext | BitextFiles", prep_config: "PrepConfig",
                  data_config: DataConfig, seed: int
                  ) -> Tuple["Preprocessor", Vocabulary, Vocabulary]:
    """Learn BPE, build vocabularies, encode the corpus into MODEL_DIR/corpus (rank 0 only).

    Two passes over the bitext, one pair in memory at a time: the first counts the words
    (and fingerprints the bitext), BPE and the vocabularies are learned from the counts, the
    second encodes (a third reads a --guide beside the bitext). With
    ``bpe_sample_sentences`` BPE is learned on a sample drawn in the first pass."""
    faults.reached("preparation")
    from aligner.prep import Preprocessor, WordCounts, _reservoir_sample

    start = time.time()
    tokenizer = Preprocessor(prep_config)
    retokenize = prep_config.tokenize or prep_config.lowercase
    counts, digest = WordCounts(), hashlib.sha256()
    sample_size = prep_config.bpe_sample_sentences if prep_config.bpe_merges > 0 else 0

    def counted() -> Iterator[Tuple[List[str], List[str]]]:
        for src, tgt in bitext:
            update_fingerprint(digest, src, tgt)
            if retokenize:
                src = tokenizer.tokenize_line(" ".join(src), "src")
                tgt = tokenizer.tokenize_line(" ".join(tgt), "tgt")
            counts.add(src, tgt)
            yield src, tgt

    if sample_size:
        sample = _reservoir_sample(counted(), sample_size, seed)
        pre = Preprocessor.learn(prep_config, [s for s, _ in sample], [t for _, t in sample])
    else:
        for _ in counted():
            pass
        pre = Preprocessor.learn_from_counts(prep_config, counts)
    src_vocab = Vocabulary.from_counts(pre.subword_counts(counts.src, "src"))
    tgt_vocab = Vocabulary.from_counts(pre.subword_counts(counts.tgt, "tgt"))
    logger.info("vocabularies: %d source and %d target subwords (with 4 specials)",
                len(src_vocab), len(tgt_vocab))
    source, target = tokenize_bitext(tokenizer, bitext)
    _encode_and_save(pre, src_vocab, tgt_vocab, source, target, model_dir, data_config,
                     bitext, digest.hexdigest())
    logger.info("preparation took %.1fs", time.time() - start)
    return pre, src_vocab, tgt_vocab


def prepare_like(model_dir: str, other_dir: str, bitext: Bitext, data_config: DataConfig
                  ) -> Tuple["Preprocessor", Vocabulary, Vocabulary]:
    """Stage 2 (`other_dir` = the base) or ``--init-from`` (the model fine-tuned): the other
    model directory's preprocessing and vocabularies (copied into `model_dir`) and the training
    corpus (and guide) encoded with them into MODEL_DIR/corpus (rank 0 only)."""
    faults.reached("preparation")
    start = time.time()
    pre, src_vocab, tgt_vocab = load_preprocessing(other_dir)
    source, target = tokenize_bitext(pre, bitext)
    _encode_and_save(pre, src_vocab, tgt_vocab, source, target, model_dir, data_config,
                     bitext, start_dir=other_dir)
    logger.info("preprocessing and vocabularies of %s", other_dir)
    logger.info("preparation took %.1fs", time.time() - start)
    return pre, src_vocab, tgt_vocab
