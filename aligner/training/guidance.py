"""Guide alignments for guided alignment training (Garg et al. 2019, *Jointly Learning to
Align and Translate with Transformer Models*).

A guide is a Pharaoh file of word links, one line per training line (from eflomal, GIZA++,
fast_align or ``align`` itself), in source–target orientation. Training adds
λ_g · CE(guide, model alignment distribution) per target subword: :func:`guide_cross_entropy`
of the posterior of the model contract's ``training_terms``, added by the trainer
(:func:`aligner.training.loop.guided_loss`).

Word links become subword links when the corpus is encoded: word link (s, t) links every
subword of source word s with every subword of target word t. They are stored beside the
encoded corpus (memory-mapped like the ids)::

    corpus/guide.links.npy    int32 (n_links, 2): (source subword, target subword), 0-based,
                              the links of kept pair 0, then pair 1, ...
    corpus/guide.offsets.npy  int64 (n_kept + 1,): pair k's links are links[offsets[k]:offsets[k+1]]

In a batch the guide is a matrix G (B, I+1, J+1) in the direction's own orientation (rows =
decoder positions, columns = encoder positions; fwd: decoder = target): the row of a decoder
subword is uniform over the encoder subwords it is linked to, and all zero when it has no link
(no term). The EOS row and column are never linked; a kind whose "not aligned" is the EOS
column (``GUIDE_UNALIGNED_TO_EOS``) gets those zero rows sent there (:func:`unaligned_to_eos`).
"""
from __future__ import annotations

import math
import os
from itertools import tee, zip_longest
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch

from aligner.constants import EOS_ID, PAD_ID
from aligner.data import check_corpus_file, save_array
from aligner.utils import check_condition, first_line

GUIDE_LINKS = "guide.links.npy"
GUIDE_OFFSETS = "guide.offsets.npy"

Link = Tuple[int, int]


def subword_links(word_links: Iterable[Link], src_word_index: Sequence[int],
                  tgt_word_index: Sequence[int]) -> np.ndarray:
    """(n, 2) int32 (source subword, target subword) links of one pair from its word links.

    ``src_word_index[k]`` = word of source subword k (likewise for the target).
    """
    src_subwords: dict = {}
    for k, word in enumerate(src_word_index):
        src_subwords.setdefault(word, []).append(k)
    tgt_subwords: dict = {}
    for k, word in enumerate(tgt_word_index):
        tgt_subwords.setdefault(word, []).append(k)
    links = sorted({(s, t) for i, j in word_links
                    for s in src_subwords.get(i, ()) for t in tgt_subwords.get(j, ())})
    return np.asarray(links, dtype=np.int32).reshape(-1, 2)


def save_guides(out_dir: str, links_per_pair: Sequence[np.ndarray]) -> None:
    """Write the subword links of every kept pair (in corpus order) into `out_dir`."""
    offsets = np.zeros(len(links_per_pair) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(links) for links in links_per_pair])
    links = (np.concatenate(links_per_pair).astype(np.int32) if len(links_per_pair)
             else np.zeros((0, 2), dtype=np.int32))
    for name, values in ((GUIDE_LINKS, links.reshape(-1, 2)), (GUIDE_OFFSETS, offsets)):
        save_array(os.path.join(out_dir, name), values)   # a full disk: one line


class GuideLinks:
    """The stored subword guide links of an encoded corpus (memory-mapped)."""

    def __init__(self, links: np.ndarray, offsets: np.ndarray):
        self.links, self.offsets = links, offsets

    @classmethod
    def open(cls, directory: str, n_pairs: int) -> Optional["GuideLinks"]:
        """The guides of the corpus in `directory`, or None when it has none."""
        links_path = os.path.join(directory, GUIDE_LINKS)
        offsets_path = os.path.join(directory, GUIDE_OFFSETS)
        if not os.path.exists(links_path):
            return None
        try:
            links = np.load(links_path, mmap_mode="r", allow_pickle=False)
            offsets = np.load(offsets_path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as error:   # truncated, object dtype, garbage
            check_corpus_file(False, links_path, f"guide links: {first_line(error)}")
        check_corpus_file(links.ndim == 2 and links.shape[1] == 2 and offsets.ndim == 1
                          and len(offsets) == n_pairs + 1 and offsets[0] == 0
                          and offsets[-1] == len(links) and bool(np.all(np.diff(offsets) >= 0)),
                          links_path, f"guide links do not fit the {n_pairs} pairs")
        return cls(links, offsets)

    def pair(self, k: int) -> np.ndarray:
        """(n, 2) (source subword, target subword) links of kept pair k."""
        return np.asarray(self.links[self.offsets[k]:self.offsets[k + 1]])


def guide_matrix(links_per_item: Sequence[np.ndarray], direction: str, decoder_len: int,
                 encoder_len: int) -> torch.Tensor:
    """The batch's guide G (B, decoder_len, encoder_len) float32, rows summing to 1 or 0.

    ``links_per_item[b]``: (n, 2) (source subword, target subword) links of item b; fwd rows
    are target subwords, rev rows source subwords.
    """
    guide = torch.zeros(len(links_per_item), decoder_len, encoder_len)
    for b, links in enumerate(links_per_item):
        if len(links) == 0:
            continue
        pairs = torch.as_tensor(np.asarray(links, dtype=np.int64))
        rows, columns = (pairs[:, 1], pairs[:, 0]) if direction == "fwd" else \
            (pairs[:, 0], pairs[:, 1])
        guide[b, rows, columns] = 1.0
    totals = guide.sum(dim=-1, keepdim=True)
    return guide / totals.clamp_min(1.0)


def unaligned_to_eos(guide: torch.Tensor, src: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
    """The guide (B, I+1, J+1) with the zero row of every non-pad decoder token of a guided
    item (one with at least one link; the decoder's EOS included) sent to the item's EOS
    column: "not aligned", for kinds with ``GUIDE_UNALIGNED_TO_EOS``. src (B, J+1) the
    encoder side (EOS once per row), tgt_out (B, I+1) the decoder side; an item without any
    link keeps its zero rows (no guide)."""
    row_totals = guide.sum(dim=-1)                                            # (B, I+1)
    guided_item = row_totals.sum(dim=-1) > 0                                  # (B,)
    unlinked = (row_totals == 0) & (tgt_out != PAD_ID) & guided_item[:, None]
    eos = (src == EOS_ID).to(guide.dtype)                                     # (B, J+1)
    return guide + unlinked.to(guide.dtype).unsqueeze(-1) * eos.unsqueeze(1)


def guide_cross_entropy(log_posterior: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
    """−Σ_b Σ_i Σ_j G[b, i, j] · log q[b, i, j]: the guided-alignment term, a scalar.

    log_posterior (B, I+1, J+1): a model's log alignment distribution q of decoder position i
    over encoder positions j (:meth:`~aligner.models.base.AlignmentModel.training_terms`);
    guide (B, I+1, J+1): :func:`guide_matrix`, rows summing to 1 (a guided position) or 0.
    log q is clamped at log(tiny) so that a zero of the posterior stays finite.
    """
    tiny = torch.finfo(log_posterior.dtype).tiny
    return -(guide * log_posterior.clamp_min(math.log(tiny))).sum()


def check_guides(alignments: Iterable[Set[Link]], source: Iterable[Sequence[str]],
                 target: Iterable[Sequence[str]], name: str
                 ) -> Iterator[Tuple[Set[Link], Sequence[str], Sequence[str]]]:
    """(links, source words, target words) line by line, the guide's links checked against
    their sentence pair as they go: one error line
    (FILE:LINE) for a link outside its sentence pair, or (at the end) for a guide whose line
    count differs from the bitext's. A generator: iterate it to the end to check everything."""
    missing: Any = object()
    n_guide = n_bitext = 0
    for links, src, tgt in zip_longest(alignments, source, target, fillvalue=missing):
        n_guide += links is not missing
        n_bitext += src is not missing
        if links is missing or src is missing:
            continue  # counted: the line counts are compared at the end
        for i, j in links:
            check_condition(i < len(src) and j < len(tgt),
                            f"{name}:{n_guide}: link {i}-{j} outside the sentence pair "
                            f"({len(src)} source, {len(tgt)} target words)")
        yield links, src, tgt
    check_condition(n_guide == n_bitext,
                    f"{name}: {n_guide} lines, but the training bitext has "
                    f"{n_bitext}: a guide needs one line per training line")


def check_guide_file(path: str, bitext: Any, check_links: bool) -> None:
    """Check a --guide file before a run removes or writes anything: every line parses, one
    line per bitext line, and (`check_links`: the run trains on the bitext's words as they are,
    no --tokenize) every link lies inside its sentence pair. One error line naming FILE:LINE;
    a warning when no line has a link (the guide would add nothing)."""
    import logging

    from aligner.formats import iter_pharaoh

    links = iter_pharaoh(path)
    n_links = 0
    if check_links:   # one pass over the bitext, its two sides taken in step
        sources, targets = tee(iter(bitext))
        for line_links, _, _ in check_guides(links, (src for src, _ in sources),
                                             (tgt for _, tgt in targets), path):
            n_links += len(line_links)
    else:
        n_lines = 0
        for line_links in links:
            n_lines += 1
            n_links += len(line_links)
        check_condition(n_lines == len(bitext),
                        f"{path}: {n_lines} lines, but the training bitext has {len(bitext)}: "
                        f"a guide needs one line per training line")
    if n_links == 0:
        logging.getLogger(__name__).warning("%s: the guide has no link on any line: it guides "
                                            "nothing", path)


def encode_guides(pre, alignments: Iterable[Set[Link]], source: Iterable[Sequence[str]],
                  target: Iterable[Sequence[str]], line_numbers: Sequence[int],
                  out_dir: str, name: str) -> Tuple[int, int]:
    """Subword guide links of the kept pairs (``line_numbers``: their input lines, 0-based,
    increasing), saved into the corpus directory `out_dir`, reading the guide (`name`) and the
    bitext's sides line by line and checking them (:func:`check_guides`). Returns the number of
    word links (all lines) and of stored subword links."""
    per_pair: List[np.ndarray] = []
    kept = iter(line_numbers)
    next_kept = next(kept, -1)
    n_word_links = 0
    for line, (links, src_words, tgt_words) in enumerate(
            check_guides(alignments, source, target, name)):
        n_word_links += len(links)
        if line != next_kept:
            continue
        src = pre.segment(src_words, "src")
        tgt = pre.segment(tgt_words, "tgt")
        per_pair.append(subword_links(links, src.word_index, tgt.word_index))
        next_kept = next(kept, -1)
    check_condition(len(per_pair) == len(line_numbers),
                    f"{name}: the training bitext has fewer lines than its encoded corpus")
    save_guides(out_dir, per_pair)
    return n_word_links, int(sum(len(links) for links in per_pair))
