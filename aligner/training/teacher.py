"""The recipe's teacher: the classical aligner (``--model classical``,
aligner/models/classical.py and aligner/training/classical.py: IBM Model 1, then first-order
HMMs of both directions trained in agreement) trained on the words of round 1's lines, in
memory, and its soft alignments of those lines. One implementation: what `align train --model
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
from typing import Dict, List, Sequence, Tuple

import numpy as np

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
    max_jump: jumps longer than this share one weight. batch_cells: observed × given words
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
    batch_cells: int = _CLASSICAL["batch_cells"]
    agreement: bool = _CLASSICAL["agreement"]
    max_words: int = 200
    lowercase: bool = recipe.CLASSICAL_LOWERCASE


def _word_ids(lines: Sequence[Sequence[str]], lowercase: bool
              ) -> Tuple[List[np.ndarray], int]:
    """Each line's words (lowercased if `lowercase`) as ids (first seen, first numbered) and
    the vocabulary size."""
    vocabulary: Dict[str, int] = {}
    ids = [np.fromiter((vocabulary.setdefault(w.lower() if lowercase else w, len(vocabulary))
                        for w in words), dtype=np.int64, count=len(words)) for words in lines]
    return ids, len(vocabulary)


def model_config(config: TeacherConfig, n_src: int, n_tgt: int) -> ClassicalConfig:
    """The classical model's settings of the teacher's on vocabularies of n_src / n_tgt."""
    return ClassicalConfig(src_vocab_size=n_src, tgt_vocab_size=n_tgt,
                           ibm1_iterations=config.ibm1_iterations,
                           hmm_iterations=config.hmm_iterations, empty_prob=config.empty_prob,
                           max_jump=config.max_jump, agreement=config.agreement,
                           batch_cells=config.batch_cells)


def soft_alignments(source: Sequence[Sequence[str]], target: Sequence[Sequence[str]],
                    config: TeacherConfig = TeacherConfig()
                    ) -> Dict[str, List[np.ndarray]]:
    """Train both directions on the words of every line (the classical model's EM,
    aligner/training/classical.py, in this process alone) and return their soft alignments,
    ``{"fwd": [...], "rev": [...]}``: one (source words, target words) array per line, as
    aligner.links.combine.combine takes them; a line the teacher skips (an empty side, over
    ``config.max_words``) gets an array without elements, whatever its length (as in
    aligner.extract.inference.no_alignment)."""
    src_ids, n_src = _word_ids(source, config.lowercase)
    tgt_ids, n_tgt = _word_ids(target, config.lowercase)
    lines = list(zip(src_ids, tgt_ids))
    settings = model_config(config, n_src, n_tgt)
    tables = train_tables(lambda: [lines], n_src, n_tgt, settings, config.max_words,
                          across_ranks=False, keep_batches=True)
    sizes = {"fwd": (n_src, n_tgt), "rev": (n_tgt, n_src)}
    lexicons = {d: Lexicon(tables[d][0], tables[d][1], *sizes[d], settings.unseen_prob)
                for d in tables}
    soft = posteriors(lines, lexicons, {d: tables[d][2] for d in tables}, settings,
                      config.max_words)
    result = {}
    for name, matrices in soft.items():
        for n, matrix in enumerate(matrices):
            if matrix is None:
                shape = (len(source[n]), len(target[n]))
                matrices[n] = np.zeros(shape if 0 in shape else (0, 0), dtype=np.float32)
        result[name] = matrices
    return result
