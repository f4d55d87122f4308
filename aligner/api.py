"""The Python API: load a trained model directory once, align lists of sentences.

Example (a model directory written by ``align train``)::

    from aligner import Aligner

    aligner = Aligner.load("model")                      # both directions, best checkpoint
    links = aligner.align(["das Haus ist klein"], ["the house is small"])
    # links == [{(0, 0), (1, 1), (2, 2), (3, 3)}]        (source word i, target word j)
    links, probs = aligner.align([["das", "Haus"]], [["the", "house"]],
                                 return_probabilities=True)[0]
    probs["fwd"].shape == (2, 2)                         # (source words, target words)
    aligner.align_with_link_probs(["das Haus"], ["the house"], heuristic="soft-average")
    # [[((0, 0), (0.97,)), ((1, 1), (0.95,))]]           each link with its probability

Everything runs through :mod:`aligner.extract.inference` (the code path of ``align extract``), so
the API and the command line give identical links. Indices are 0-based word positions of the
(tokenized) input, always source–target, whatever the direction.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from aligner import constants as C
from aligner.utils import AlignerError, check_condition

Link = Tuple[int, int]
Sentence = Union[str, Sequence[str]]
#: what ``align(..., return_probabilities=True)`` gives per sentence pair
LinksAndProbabilities = Tuple[Set[Link], Dict[str, np.ndarray]]


def _as_words(sentences: Sequence[Sentence], name: str) -> List[List[str]]:
    """A list of sentences (strings split on whitespace, or lists of words) -> word lists."""
    if isinstance(sentences, str):
        raise AlignerError(f"{name}: expected a list of sentences, got one string (wrap it in a "
                           "list: [sentence])")
    words = []
    for k, sentence in enumerate(sentences):
        if isinstance(sentence, str):
            words.append(sentence.split())
        elif isinstance(sentence, (list, tuple)) and all(isinstance(w, str) for w in sentence):
            words.append(list(sentence))
        else:
            raise AlignerError(f"{name}[{k}]: a sentence must be a string or a list of strings, "
                               f"not {type(sentence).__name__}")
    return words


class Aligner:
    """A loaded model directory that aligns tokenized sentence pairs.

    Build it with :meth:`load`. ``loaded`` is the :class:`aligner.model_dir.LoadedModelDir`
    (models per direction, preprocessor, vocabularies); ``device`` the torch device used;
    ``precision`` "fp32" or "bf16" (see :mod:`aligner.precision`).
    """

    def __init__(self, loaded: Any, device: Any, precision: str = "fp32") -> None:
        self.loaded = loaded
        self.device = device
        self.precision = precision
        self._mixtures: Dict[Optional[float], Any] = {}   # by mix_weight, loaded once

    def _mixture(self, mix_weight: Optional[float], heuristic: str) -> Any:
        """The teacher mixed into the output at `mix_weight` (aligner/extract/mixture.py; None:
        the recorded weight), or None."""
        from aligner.extract.mixture import resolve_mixture

        if len(self.loaded.models) < 2:
            return None
        if mix_weight not in self._mixtures:
            self._mixtures[mix_weight] = resolve_mixture(self.loaded, None, mix_weight, "both",
                                                         heuristic, self.device)
        return self._mixtures[mix_weight]

    @classmethod
    def load(cls, model_dir: str, device: str = "auto", checkpoint: str = "best",
             directions: Sequence[str] = C.DIRECTIONS, precision: str = "auto") -> "Aligner":
        """Load `model_dir` (``align train`` output) on `device` (auto, cpu, cuda, cuda:N).

        `checkpoint`: "best" or "last" weights; `directions`: which models to load (both by
        default; one is enough for ``direction="fwd"`` or ``"rev"``); `precision`: "fp32",
        "bf16" (bfloat16 autocast) or "auto" (bf16 on CUDA GPUs with native bfloat16 and on
        CPUs with bfloat16 instructions, else fp32), as ``align extract --precision``. Errors
        (no such directory, missing files, CUDA asked for but absent, bf16 where unsupported)
        raise :class:`aligner.utils.AlignerError`.
        """
        from aligner.distributed import resolve_device
        from aligner.model_dir import LoadedModelDir
        from aligner.precision import resolve_precision

        torch_device = resolve_device(device)
        resolved = resolve_precision(precision, torch_device, inference=True)
        return cls(LoadedModelDir.load(model_dir, tuple(directions), checkpoint, torch_device),
                   torch_device, resolved)

    @property
    def model_kind(self) -> str:
        """``transformer``, ``alignment-layer``, ``hmm0`` or ``hmm1``."""
        return self.loaded.config.model_kind

    @property
    def methods(self) -> Tuple[str, ...]:
        """Extraction methods of this model kind; the first is the default."""
        return next(iter(self.loaded.models.values())).METHODS

    @property
    def directions(self) -> Tuple[str, ...]:
        """The directions loaded ("fwd" models p(target | source), "rev" p(source | target))."""
        return tuple(self.loaded.models)

    def words(self, sentence: Sentence, side: str) -> List[str]:
        """The words the model sees for one sentence of `side` ("src" or "tgt"): the input
        split on whitespace, re-tokenized/lowercased when the model was trained with
        --tokenize/--lowercase. Link indices and matrix rows/columns refer to these words."""
        words = _as_words([sentence], side)[0]
        pre = self.loaded.preprocessor
        if pre.config.tokenize or pre.config.lowercase:
            return pre.tokenize_line(" ".join(words), side)
        return words

    def align(self, src: Sequence[Sentence], tgt: Sequence[Sentence],
              method: Optional[str] = None, direction: str = "both",
              heuristic: Optional[str] = None, return_probabilities: bool = False,
              max_tokens: Optional[int] = None, threshold: Optional[float] = None,
              calibrated: bool = True, mix_weight: Optional[float] = None,
              subword_pooling: Optional[str] = None, **method_options: Any
              ) -> Union[List[Set[Link]], List[LinksAndProbabilities]]:
        """Word links of every sentence pair ``(src[k], tgt[k])``, in input order.

        src, tgt: equally long lists of sentences; a sentence is a string (split on
            whitespace) or a list of words. An empty sentence gets an empty link set.
        method: one of :attr:`methods` (default: the first, as ``align extract``).
        direction: "fwd", "rev" or "both" (both directions, combined by `heuristic`, one of
            intersect, union, grow-diag, grow-diag-final, grow-diag-final-and, or
            soft-average: links where the mean of the two directions' probabilities exceeds
            `threshold`; see aligner.links.soft_symmetrize). Defaults as ``align extract``: what
            ``align run`` aligned with, for a model directory it trained; else the model
            kind's best heuristic (soft-average for hmm0/hmm1, grow-diag for the others) and
            threshold 0.5 (for a model calibrated on its bitext, the threshold of the shortest
            lines, scaled per line length unless `calibrated` is False: ``align extract
            --uncalibrated``).
        max_tokens: positions per batch (default: 500 on a CPU, the classical aligner 8000;
            4000 on a GPU).
        mix_weight: the weight of the recipe's classical teacher in both directions' soft
            alignments (``align extract --mix-weight``; aligner/extract/mixture.py): default
            the weight the model directory records (the recipe's), 0 the model alone; only
            for both directions combined by soft-average. The weight grows on lines longer
            than the model directory's recorded ``mix_length`` (``align extract
            --mix-length``), and the teacher's share of a line is judged at the teacher's own
            threshold (aligner.extract.mixture.Mixture.thresholds), as in `align extract`.
        subword_pooling: how the soft alignments combine a word's subwords (``align extract
            --subword-pooling``): "max" or "mean" (default as ``align extract``'s: the one the
            model directory's calibration was measured with, else the recipe's;
            aligner.extract.inference.word_matrix).
        method_options: passed to the method, e.g. ``layer=2`` (attention), ``sgd_steps=3``,
            ``sgd_lr=1.0``, ``init="random"`` (layer-sgd), ``shortlist=0`` (hmm0/hmm1: the
            exact lexicon; default as ``align extract``'s, the recipe's shortlist).

        Returns a list with one set of ``(i, j)`` links per pair (i = 0-based source word,
        j = 0-based target word). With ``return_probabilities=True`` each entry is instead a
        tuple ``(links, probabilities)`` where ``probabilities`` maps each direction used
        ("fwd" and/or "rev") to a float32 array of shape (source words, target words): the
        method's word-level soft alignment (for both directions combined by soft-average,
        mixed with the teacher's as the links are: `mix_weight`) (with ``subword_pooling=
        "mean"`` for "fwd" every target column sums to 1 over the source words, for "rev"
        every source row sums to 1 over the target words — to the word's probability of
        being aligned, for a model with the empty word; with "max" a word of several subwords
        may sum to more; see :func:`aligner.extract.inference.word_matrix`). A pair that cannot be
        aligned (empty side, too long for the model) gets zeros.
        """
        from aligner.extract.inference import (align_pairs, default_options, encode_bitext,
                                               soft_alignments)
        from aligner.formats import Bitext, check_same_length
        from aligner.links.combine import check_heuristic, combine, needs_soft
        from aligner.precision import autocast_context

        src_words, tgt_words = _as_words(src, "src"), _as_words(tgt, "tgt")
        check_same_length("src", len(src_words), "tgt", len(tgt_words))
        check_condition(direction in C.DIRECTIONS + ("both",),
                        f"direction must be fwd, rev or both, not '{direction}'")
        heuristic, threshold = self.loaded.symmetrization(heuristic, threshold, calibrated)
        check_heuristic(heuristic)
        check_condition(not mix_weight or (direction == "both" and needs_soft(heuristic)),
                        f"mix_weight mixes both directions' posteriors for soft-average, not "
                        f"for direction={direction!r} with heuristic={heuristic!r}")
        directions = C.DIRECTIONS if direction == "both" else (direction,)
        missing = [d for d in directions if d not in self.loaded.models]
        check_condition(not missing, f"direction {', '.join(missing)} was not loaded (use "
                                     f"Aligner.load(..., directions={tuple(directions)}))")
        pooling = self.loaded.subword_pooling(subword_pooling)
        method = method or self.methods[0]
        check_condition(method in self.methods,
                        f"unknown method '{method}' for model kind '{self.model_kind}' "
                        f"(choose from {', '.join(self.methods)})")
        # the recipe's shortlist where the method takes one, as align extract's
        method_options = default_options(next(iter(self.loaded.models.values())), method,
                                         method_options)
        pairs = encode_bitext(self.loaded, Bitext(src_words, tgt_words, "src", "tgt"))
        with autocast_context(self.precision, self.device):
            by_direction = {d: align_pairs(self.loaded.models[d], pairs, d, method, max_tokens,
                                           self.device, method_options) for d in directions}
        soft = None
        if return_probabilities or (direction == "both" and needs_soft(heuristic)):
            with autocast_context(self.precision, self.device):
                soft = {d: soft_alignments(self.loaded.models[d], pairs, d, method, max_tokens,
                                           self.device, method_options, pooling=pooling)
                        for d in directions}
        if direction == "both":
            mixture = (self._mixture(mix_weight, heuristic)
                       if soft is not None and needs_soft(heuristic) else None)
            if mixture is not None:
                from aligner.extract.mixture import mix

                with autocast_context(self.precision, self.device):
                    other = mixture.soft(mixture.encode(Bitext(src_words, tgt_words, "src",
                                                               "tgt")),
                                         max_tokens, self.device, pooling=pooling)
                threshold = mixture.thresholds(threshold, soft["fwd"], other["fwd"])
                soft = mix(soft, other, mixture.weight, mixture.long_line)
            links = combine(heuristic, threshold, hard=by_direction, soft=soft)
        else:
            links = by_direction[direction]
        if not return_probabilities:
            return links
        return [(pair_links, {d: soft[d][k] for d in directions})
                for k, pair_links in enumerate(links)]

    def align_with_link_probs(self, src: Sequence[Sentence], tgt: Sequence[Sentence],
                              method: Optional[str] = None, direction: str = "both",
                              heuristic: Optional[str] = None,
                              max_tokens: Optional[int] = None,
                              threshold: Optional[float] = None,
                              calibrated: bool = True, mix_weight: Optional[float] = None,
                              subword_pooling: Optional[str] = None, **method_options: Any
                              ) -> List[List[Tuple[Link, Tuple[float, ...]]]]:
        """The links of every pair (as :meth:`align`, same arguments), each with its
        probability: per pair a list of ``((i, j), numbers)`` sorted by i then j, the numbers
        ``align extract --link-probs`` writes (unrounded; see :mod:`aligner.extract.link_probs`):
        ``(p,)`` with p = ``(p_fwd + p_rev) / 2`` for soft-average, the direction's own
        probability for ``direction="fwd"`` / ``"rev"``, and ``(p_fwd, p_rev)`` for a Moses
        heuristic (intersect, union, grow-diag, ...). The model stays loaded: call it for
        each new list of pairs.
        """
        from aligner.extract.link_probs import link_numbers

        heuristic, threshold = self.loaded.symmetrization(heuristic, threshold, calibrated)
        aligned = self.align(src, tgt, method, direction, heuristic, True, max_tokens,
                             threshold, mix_weight=mix_weight,
                             subword_pooling=subword_pooling, **method_options)
        return [link_numbers(links, probs, direction, heuristic)
                for links, probs in aligned]  # type: ignore[misc]

