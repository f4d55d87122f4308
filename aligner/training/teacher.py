"""The recipe's teacher: the classical aligner (``--model classical``,
aligner/models/classical.py and aligner/training/classical.py: IBM Model 1, then first-order
HMMs of both directions trained in agreement) trained on the words of round 1's lines and more
(up to recipe.TEACHER_PAIRS lines in all: aligner/training/samples.py teacher_sample), in
memory, and its soft alignments of round 1's lines. One implementation: what `align train --model
classical` writes into a model directory is the same EM on the same words, there encoded
through the model directory's word vocabularies.

Agreement (Liang et al. 2006, the default) roughly halves each direction's AER on en-fr
(eval/results/teacher_enfr.md). It trains in seconds to a minute on tens of thousands of lines.
Its soft alignments of both directions, averaged (soft-average), are what the first
self-training round of the recipe is guided by (aligner.training.rounds), so that the first
neural round starts from links far better than its own unguided ones.

Soft alignments come back per line as (source words, target words) arrays, source–target
orientation as in aligner.links.combine: fwd[s, t] = p(source s | target t) (the HMM that
observes the target), rev[s, t] = p(target t | source s).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from aligner import constants as C

from aligner.models.classical import ClassicalConfig, Lexicon
from aligner.training import recipe
from aligner.training.classical import posteriors, train_tables

logger = logging.getLogger(__name__)


#: torch threads of the teacher in `align run` (aligner/training/rounds.py): its
#: forward-backward steps through the words one small (lines, states) operation at a time, so
#: a second thread gains little on idle cores, while on a loaded 2-core CPU every operation
#: waits for the thread that another process holds: on 8,000 Hansards lines with a second
#: job on the cores, 77-361 s with 2 threads against 13-16 s with 1
#: (eval/results/teacher_threads.md)
THREADS = 1


#: the classical model's defaults, the teacher's too (one place: aligner/models/classical.py)
_CLASSICAL = {field.name: field.default for field in dataclasses.fields(ClassicalConfig)}


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    """ibm1_iterations, hmm_iterations: EM iterations of each model (IBM-1 first; its
    lexicon starts the HMM). empty_prob: p0, the probability of the empty word, fixed.
    max_jump: jumps longer than this share one weight. boundaries: the lines' start and end
    are states of the HMM (aligner/models/classical.py). batch_cells: observed × given words
    (× lines) per batch, the unit of memory. agreement: the HMMs of the two directions are
    trained together (Liang et al. 2006): each EM iteration's lexicon counts of both are the
    product of the two directions' link posteriors, not each one's own. max_words: a line
    with a side longer than this is not aligned (no links), as a line with an empty side.
    lowercase: words are lowercased before they are numbered, as `--model classical` does
    (recipe.CLASSICAL_LOWERCASE)."""
    ibm1_iterations: int = _CLASSICAL["ibm1_iterations"]
    hmm_iterations: int = _CLASSICAL["hmm_iterations"]
    empty_prob: float = _CLASSICAL["empty_prob"]
    max_jump: int = _CLASSICAL["max_jump"]
    boundaries: bool = _CLASSICAL["boundaries"]
    batch_cells: int = _CLASSICAL["batch_cells"]
    agreement: bool = _CLASSICAL["agreement"]
    max_words: int = 200
    lowercase: bool = recipe.CLASSICAL_LOWERCASE


def _word_ids(lines: Sequence[Sequence[str]], lowercase: bool
              ) -> Tuple[List[np.ndarray], List[str]]:
    """Each line's words (lowercased if `lowercase`) as ids (first seen, first numbered) and
    the words in id order."""
    vocabulary: Dict[str, int] = {}
    ids = [np.fromiter((vocabulary.setdefault(w.lower() if lowercase else w, len(vocabulary))
                        for w in words), dtype=np.int64, count=len(words)) for words in lines]
    return ids, list(vocabulary)


def model_config(config: TeacherConfig, n_src: int, n_tgt: int) -> ClassicalConfig:
    """The classical model's settings of the teacher's on vocabularies of n_src / n_tgt."""
    return ClassicalConfig(src_vocab_size=n_src, tgt_vocab_size=n_tgt,
                           ibm1_iterations=config.ibm1_iterations,
                           hmm_iterations=config.hmm_iterations, empty_prob=config.empty_prob,
                           max_jump=config.max_jump, boundaries=config.boundaries,
                           agreement=config.agreement,
                           batch_cells=config.batch_cells)


@dataclasses.dataclass
class Teacher:
    """A trained teacher: its words of each side in id order (``src_words[k]`` has id k; the
    empty word is id ``len(words)`` of the given side), its model settings, and per direction
    the tables of aligner.training.classical.train_tables, (lexicon keys (N,) int64 sorted,
    probabilities (N,), jumps (2·max_jump + 1,)), on those ids."""

    src_words: List[str]
    tgt_words: List[str]
    settings: ClassicalConfig
    tables: Dict[str, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    lowercase: bool


def train(source: Sequence[Sequence[str]], target: Sequence[Sequence[str]],
          config: TeacherConfig = TeacherConfig()
          ) -> Tuple[Teacher, List[Tuple[np.ndarray, np.ndarray]]]:
    """Train both directions on the words of every line (the classical model's EM,
    aligner/training/classical.py, in this process alone): the teacher and its lines as ids."""
    src_ids, src_words = _word_ids(source, config.lowercase)
    tgt_ids, tgt_words = _word_ids(target, config.lowercase)
    lines = list(zip(src_ids, tgt_ids))
    settings = model_config(config, len(src_words), len(tgt_words))
    tables = train_tables(lambda: [lines], len(src_words), len(tgt_words), settings,
                          config.max_words, across_ranks=False, keep_batches=True)
    return Teacher(src_words, tgt_words, settings, tables, config.lowercase), lines


def soft_alignments(source: Sequence[Sequence[str]], target: Sequence[Sequence[str]],
                    config: TeacherConfig = TeacherConfig(), model_dir: Optional[str] = None,
                    lines: Optional[Sequence[int]] = None) -> Dict[str, List[np.ndarray]]:
    """Train the teacher on the lines (:func:`train`) and return the soft alignments of those
    at positions `lines` (0-based; None: every line, in order),
    ``{"fwd": [...], "rev": [...]}``: one (source words, target words) array per line, as
    aligner.links.combine.combine takes them; a line the teacher skips (an empty side, over
    ``config.max_words``) gets an array without elements, whatever its length (as in
    aligner.extract.inference.no_alignment). With `model_dir`, the teacher is also written
    there as a classical model directory (:func:`save_model_dir`)."""
    trained, id_lines = train(source, target, config)
    if lines is not None:
        id_lines = [id_lines[k] for k in lines]
        source = [source[k] for k in lines]
        target = [target[k] for k in lines]
    if model_dir is not None:
        save_model_dir(trained, model_dir)
    settings, tables = trained.settings, trained.tables
    sizes = {"fwd": (settings.src_vocab_size, settings.tgt_vocab_size),
             "rev": (settings.tgt_vocab_size, settings.src_vocab_size)}
    lexicons = {d: Lexicon(tables[d][0], tables[d][1], *sizes[d], settings.unseen_prob)
                for d in tables}
    soft = posteriors(id_lines, lexicons, {d: tables[d][2] for d in tables}, settings,
                      config.max_words)
    result = {}
    for name, matrices in soft.items():
        for n, matrix in enumerate(matrices):
            if matrix is None:
                shape = (len(source[n]), len(target[n]))
                matrices[n] = np.zeros(shape if 0 in shape else (0, 0), dtype=np.float32)
        result[name] = matrices
    return result


def _renumbered(keys: torch.Tensor, n_observed: int, given_ids: np.ndarray,
                observed_ids: np.ndarray, n_observed_now: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Lexicon keys (given · n_observed + observed) renumbered: given word g becomes
    given_ids[g] (its last entry: the empty word), observed word o observed_ids[o]; an entry
    with a word mapped to -1 is dropped. Returns (the new keys sorted, the order that takes the
    old entries there)."""
    # in place where it can: the 407k job's teacher has 5.9M keys per direction, 47 MB each
    # int64 array, and this ran beside its tables and posteriors
    new = torch.from_numpy(given_ids)[keys // n_observed]
    observed = torch.from_numpy(observed_ids)[keys % n_observed]
    known = (new >= 0) & (observed >= 0)
    new.mul_(n_observed_now).add_(observed)
    del observed
    if bool(known.all()):     # every word kept (a word spelled as a special token is not)
        order = torch.argsort(new)
        return new[order], order
    kept = torch.nonzero(known).flatten()
    new = new[kept]
    order = torch.argsort(new)
    return new[order], kept[order]


def save_model_dir(teacher: Teacher, model_dir: str) -> None:
    """Write the teacher as a classical model directory (`align extract` aligns any text with
    it, as a model of `align train --model classical`): the model directory's vocabularies
    number its words after the special tokens, in the teacher's order, and its tables are
    renumbered to match. A word spelled as a special token (``<unk>``) is left out with its
    word pairs, which then take the unseen pair's probability."""
    from aligner.config import DataConfig, RunConfig, TrainConfig
    from aligner.model_dir import (build_direction_model, config_path, params_path,
                                   save_params, write_version)
    from aligner.prep import PrepConfig, Preprocessor
    from aligner.training.request import output_settings
    from aligner.training.run import direction_model_configs
    from aligner.vocab import Vocabulary

    os.makedirs(model_dir, exist_ok=True)
    vocabularies, ids = {}, {}
    for side, words in (("src", teacher.src_words), ("tgt", teacher.tgt_words)):
        vocabulary = Vocabulary(list(C.SPECIAL_TOKENS)
                                + [w for w in words if w not in C.SPECIAL_TOKENS])
        # the teacher's id k -> the directory's; the extra last entry: the empty word
        ids[side] = np.array([-1 if w in C.SPECIAL_TOKENS else vocabulary.token_id(w)
                              for w in words] + [len(vocabulary)], dtype=np.int64)
        vocabularies[side] = vocabulary
    n_src, n_tgt = len(vocabularies["src"]), len(vocabularies["tgt"])
    options = {key: value for key, value in teacher.settings.to_dict().items()
               if key not in ("src_vocab_size", "tgt_vocab_size")}
    prep = PrepConfig(lowercase=teacher.lowercase, bpe_merges=0)
    config = RunConfig(model_kind="classical", directions=list(C.DIRECTIONS),
                       models=direction_model_configs(options, C.DIRECTIONS, n_src, n_tgt),
                       prep=prep.to_dict(),
                       data=DataConfig(), training=TrainConfig(),
                       extra={C.ALIGN_RUN_SETTINGS: output_settings(
                           C.SOFT_HEURISTICS[0], recipe.TEACHER_THRESHOLD)})
    write_version(model_dir)
    Preprocessor(prep).save(model_dir)
    vocabularies["src"].save(os.path.join(model_dir, C.VOCAB_SRC))
    vocabularies["tgt"].save(os.path.join(model_dir, C.VOCAB_TGT))
    sides = {"fwd": ("src", "tgt"), "rev": ("tgt", "src")}   # (given, observed)
    for direction, (given, observed) in sides.items():
        keys, probs, jumps = teacher.tables[direction]
        n_observed = len(ids[observed]) - 1
        new_keys, order = _renumbered(keys.cpu(), n_observed, ids[given], ids[observed][:-1],
                                      len(vocabularies[observed]))
        model = build_direction_model(config, direction)
        model.set_tables(new_keys, probs.cpu()[order], jumps.cpu())
        os.makedirs(os.path.dirname(params_path(model_dir, direction)), exist_ok=True)
        save_params(model, params_path(model_dir, direction))
    config.save(config_path(model_dir))   # last: a directory cut off before is incomplete
