"""A classical word aligner trained by EM: IBM Model 1, then first-order HMMs of both
directions trained in agreement.

The HMM is Vogel et al. (1996) with Och & Ney's (2003) empty word: J empty states, state
J + j' standing for "the empty word, after source word j'", so that a jump after an empty word
is measured from the last real position. Its lexicon is a table t(o | g) over the word pairs
that occur together in a line; its jumps share one distribution s(d) over the distance
d = j - j' clipped to [-max_jump, max_jump], normalized over each line's positions:
p(j | j', J) = (1 - p0) · s(j - j') / Σ_{j''<J} s(j'' - j'), and the empty word p0.
In agreement (Liang et al. 2006, the default) each EM iteration counts, for both directions'
lexicons, the product of the two directions' posteriors that source word j and target word i
are linked (the empty word takes what is left of each word's mass), instead of each
direction's own posteriors; the jumps are counted by each direction on its own. That roughly
halves each direction's AER on en-fr (eval/results/teacher_enfr.md).

The forward–backward runs in float32, scaled per position, batched over lines of one given
length (one (J, J) transition matrix per batch); counts and the lexicon are float64.

It trains in seconds to a minute on tens of thousands of lines, on words (no subwords, no
neural network). Its soft alignments of both directions, averaged (soft-average), are what the
first self-training round of the recipe is guided by (aligner.training.rounds), so that the
first neural round starts from links far better than its own unguided ones.

Conventions: one direction at a time. The *observed* side's words are the HMM's time steps
i = 0..I-1; the *given* side's words are its states j = 0..J-1. "fwd" observes the target
given the source (as the model p(target | source)); "rev" the source given the target.
Soft alignments come back per line as (source words, target words) arrays, source–target
orientation as in aligner.links.combine: fwd[i, j] = p(source i | target j), rev[i, j] =
p(target j | source i).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

logger = logging.getLogger(__name__)


#: torch threads of the teacher in `align run` (aligner/training/rounds.py): its
#: forward-backward steps through the words one small (lines, states) operation at a time, so
#: a second thread gains little on idle cores, while on a loaded 2-core CPU every operation
#: waits for the thread that another process holds: on 8,000 Hansards lines with a second
#: job on the cores, 77-361 s with 2 threads against 13-16 s with 1
#: (eval/results/teacher_threads.md)
THREADS = 1


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    """ibm1_iterations, hmm_iterations: EM iterations of each model (IBM-1 first; its
    lexicon starts the HMM). empty_prob: p0, the probability of the empty word, fixed.
    max_jump: jumps longer than this share one weight. batch_cells: observed × given words
    (× lines) per batch, the unit of memory. agreement: the HMMs of the two directions are
    trained together (Liang et al. 2006): each EM iteration's lexicon counts of both are the
    product of the two directions' link posteriors, not each one's own. max_words: a line
    with a side longer than this is not aligned (no links), as a line with an empty side."""
    ibm1_iterations: int = 5
    hmm_iterations: int = 5
    empty_prob: float = 0.2
    max_jump: int = 100
    batch_cells: int = 1_000_000
    agreement: bool = True
    max_words: int = 200


class _Batch:
    """Lines whose given sides have the same length J, padded on the observed side.

    pairs (B, I, J + 1) int32: the index into the lexicon of (given word j, observed word i);
    column J is the empty word; padded observed positions (i >= lengths[b]) hold the
    lexicon's extra zero entry. lengths (B,) long: observed words per line. lines (B,): their
    line numbers in the corpus."""

    def __init__(self, pairs: torch.Tensor, lengths: torch.Tensor, lines: np.ndarray):
        self.pairs = pairs
        self.lengths = lengths
        self.lines = lines
        steps = torch.arange(pairs.shape[1])
        self.valid = steps[None, :] < lengths[:, None]          # (B, I)

    @property
    def given_len(self) -> int:
        return self.pairs.shape[2] - 1


def _word_ids(lines: Sequence[Sequence[str]]) -> Tuple[List[np.ndarray], int]:
    """Each line's words as ids (first seen, first numbered) and the vocabulary size."""
    vocabulary: Dict[str, int] = {}
    ids = [np.fromiter((vocabulary.setdefault(w, len(vocabulary)) for w in words),
                       dtype=np.int64, count=len(words)) for words in lines]
    return ids, len(vocabulary)


class _Direction:
    """One direction's data (batches) and parameters (lexicon, jump weights)."""

    def __init__(self, observed: Sequence[Sequence[str]], given: Sequence[Sequence[str]],
                 config: TeacherConfig):
        self.config = config
        obs_ids, obs_vocab = _word_ids(observed)
        given_ids, given_vocab = _word_ids(given)
        empty = given_vocab                                     # the empty word's id
        lines = [n for n in range(len(observed))
                 if 0 < len(observed[n]) <= config.max_words
                 and 0 < len(given[n]) <= config.max_words]
        lines.sort(key=lambda n: (len(given[n]), len(observed[n])))
        # (lines, observed ids (B, I) padded -1, given ids + empty (B, J+1), lengths)
        batches: List[Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        start = 0
        while start < len(lines):
            given_len = len(given[lines[start]])
            stop, longest = start, 0
            while stop < len(lines) and len(given[lines[stop]]) == given_len:
                longer = max(longest, len(observed[lines[stop]]))
                if stop > start and (stop - start + 1) * longer * (given_len + 1) \
                        > config.batch_cells:
                    break
                longest = longer
                stop += 1
            chunk = np.array(lines[start:stop])
            lengths = np.array([len(obs_ids[n]) for n in chunk])
            obs = np.full((len(chunk), longest), -1, dtype=np.int64)
            for row, n in enumerate(chunk):
                obs[row, :lengths[row]] = obs_ids[n]
            giv = np.stack([np.append(given_ids[n], empty) for n in chunk])   # (B, J+1)
            batches.append((chunk, obs, giv, lengths))
            start = stop

        def keys_of(obs: np.ndarray, giv: np.ndarray) -> np.ndarray:
            """(B, I, J+1) int64 keys given · |observed vocabulary| + observed; -1 padded."""
            keys = giv[:, None, :] * obs_vocab + obs[:, :, None]
            keys[obs < 0] = -1
            return keys

        # the lexicon's entries: every (given, observed) pair in a line, the empty word's too
        # (batch by batch, so that the keys of the whole corpus never exist at once)
        table_keys = np.unique(np.concatenate(
            [np.unique(keys[keys >= 0]) for keys in
             (keys_of(obs, giv) for _, obs, giv, _ in batches)]))
        self.size = len(table_keys)                             # padded cells: index size
        self.given_of_pair = torch.from_numpy(table_keys // obs_vocab)
        self.given_vocab = given_vocab + 1
        self.batches = []
        for chunk, obs, giv, lengths in batches:
            keys = keys_of(obs, giv)
            index = np.searchsorted(table_keys, keys).astype(np.int32)
            index[keys < 0] = self.size
            self.batches.append(_Batch(torch.from_numpy(index), torch.from_numpy(lengths),
                                       chunk))
        self.lexicon = torch.ones(self.size + 1, dtype=torch.float64)
        self.lexicon[-1] = 0.0
        self.jumps = torch.ones(2 * config.max_jump + 1, dtype=torch.float64)

    def _normalized(self, counts: torch.Tensor) -> torch.Tensor:
        """t(o | g) = c(g, o) / c(g), with the padding entry 0 appended."""
        totals = torch.zeros(self.given_vocab, dtype=torch.float64).index_add_(
            0, self.given_of_pair, counts)
        table = counts / totals[self.given_of_pair].clamp_min(1e-300)
        return torch.cat([table, table.new_zeros(1)])

    def ibm1_iteration(self) -> float:
        counts = torch.zeros(self.size + 1, dtype=torch.float64)
        log_likelihood = 0.0
        for batch in self.batches:
            emission = self.lexicon[batch.pairs]                 # (B, I, J+1)
            total = emission.sum(-1, keepdim=True)
            posterior = emission / total.clamp_min(1e-300)
            counts.index_add_(0, batch.pairs.flatten(), posterior.flatten())
            log_likelihood += float(total.squeeze(-1)[batch.valid].log().sum())
        self.lexicon = self._normalized(counts[:-1])
        return log_likelihood

    def _transitions(self, given_len: int) -> torch.Tensor:
        """(J, J) p(real j | previous position j'), rows j', summing to 1 - p0."""
        positions = torch.arange(given_len)
        distance = (positions[None, :] - positions[:, None]).clamp(
            -self.config.max_jump, self.config.max_jump) + self.config.max_jump
        weights = self.jumps[distance]
        return (1 - self.config.empty_prob) * weights / weights.sum(-1, keepdim=True)

    def hmm_pass(self, batch: _Batch, want_counts: bool):
        """Forward–backward of one batch (scaled, probability space).

        Returns the posteriors (B, I, 2J) (real states j < J, empty states J + j'; padded
        positions 0), the log-likelihood, and, when `want_counts`, the expected jumps
        (J, J) summed over the batch: [j', j] = expected transitions from position j'
        (real or empty after j') into real j."""
        p0 = self.config.empty_prob
        size = batch.given_len
        emission = self.lexicon[batch.pairs].float()             # (B, I, J+1)
        emission = torch.cat([emission[:, :, :size],
                              emission[:, :, size:].expand(-1, -1, size)], dim=-1)
        trans = self._transitions(size).float()                  # (J, J)
        steps = emission.shape[1]
        valid = batch.valid
        alphas = torch.empty_like(emission)
        scales = torch.ones(emission.shape[:2])
        alpha = torch.cat([emission.new_full((size,), (1 - p0) / size),
                           emission.new_full((size,), p0 / size)]) * emission[:, 0]
        scale = alpha.sum(-1)
        alpha = alpha / scale[:, None].clamp_min(1e-30)
        alphas[:, 0] = alpha
        scales[:, 0] = scale
        for i in range(1, steps):
            previous = alpha[:, :size] + alpha[:, size:]          # (B, J) from position j'
            new = torch.cat([previous @ trans, p0 * previous], dim=-1) * emission[:, i]
            scale = new.sum(-1)
            here = valid[:, i]
            alpha = torch.where(here[:, None], new / scale[:, None].clamp_min(1e-30), alpha)
            scales[:, i] = torch.where(here, scale, torch.ones_like(scale))
            alphas[:, i] = alpha
        betas = torch.empty_like(emission)
        beta = torch.ones_like(emission[:, 0])
        betas[:, -1] = beta
        weighted = torch.zeros_like(emission)                    # E_i · β_i / c_i
        for i in range(steps - 1, 0, -1):
            here = valid[:, i]
            w = emission[:, i] * beta / scales[:, i, None]
            w = torch.where(here[:, None], w, torch.zeros_like(w))
            weighted[:, i] = w
            back = w[:, :size] @ trans.T + p0 * w[:, size:]       # (B, J) at position j'
            back = torch.cat([back, back], dim=-1)
            beta = torch.where(here[:, None], back, beta)
            betas[:, i - 1] = beta
        posterior = alphas * betas * valid[:, :, None]
        log_likelihood = float(scales.double().log().sum())
        if not want_counts:
            return posterior, log_likelihood, None
        previous = alphas[:, :-1, :size] + alphas[:, :-1, size:]  # (B, I-1, J)
        jumps = torch.einsum("bij,bik->jk", previous, weighted[:, 1:, :size]) * trans
        return posterior, log_likelihood, jumps

    def expectations(self) -> Tuple[List[torch.Tensor], torch.Tensor, float]:
        """E-step of the HMM over every batch: the real states' posteriors per batch
        [(B, I, J)], the expected jumps per distance (2 · max_jump + 1,) and the
        log-likelihood."""
        posteriors = []
        jump_counts = torch.zeros_like(self.jumps)
        log_likelihood = 0.0
        reach = self.config.max_jump
        for batch in self.batches:
            posterior, ll, jumps = self.hmm_pass(batch, want_counts=True)
            size = batch.given_len
            log_likelihood += ll
            posteriors.append(posterior[:, :, :size].contiguous())   # (a copy: 2J -> J)
            positions = torch.arange(size)
            distance = (positions[None, :] - positions[:, None]).clamp(-reach, reach) + reach
            jump_counts.index_add_(0, distance.flatten(), jumps.flatten().double())
        return posteriors, jump_counts, log_likelihood

    def maximize(self, posteriors: Sequence[torch.Tensor], jump_counts: torch.Tensor
                 ) -> None:
        """M-step: the lexicon from the real states' posteriors per batch [(B, I, J)] (the
        empty word takes each observed word's mass left over), the jumps from their counts."""
        counts = torch.zeros(self.size + 1, dtype=torch.float64)
        for batch, posterior in zip(self.batches, posteriors):
            size = batch.given_len
            counts.index_add_(0, batch.pairs[:, :, :size].flatten(),
                              posterior.flatten().double())
            empty = (batch.valid.to(posterior) - posterior.sum(-1)).clamp_min(0)
            counts.index_add_(0, batch.pairs[:, :, size].flatten(), empty.flatten().double())
        self.lexicon = self._normalized(counts[:-1])
        self.jumps = jump_counts.clamp_min(1e-6)

    def by_line(self, posteriors: Sequence[torch.Tensor], count: int
                ) -> List[Optional[np.ndarray]]:
        """Per-batch posteriors [(B, I, J)] as one (I observed, J given) float32 array per
        line of the corpus (`count` lines; None for a line with an empty side)."""
        result: List[Optional[np.ndarray]] = [None] * count
        for batch, posterior in zip(self.batches, posteriors):
            array = posterior.to(torch.float32).numpy()
            for row, n in enumerate(batch.lines):
                result[n] = array[row, :int(batch.lengths[row])]
        return result

    def to_batches(self, per_line: Sequence[Optional[np.ndarray]]) -> List[torch.Tensor]:
        """The inverse of :meth:`by_line`: per-line (I, J) arrays as per-batch (B, I, J)
        tensors, zero at padded positions."""
        result = []
        for batch in self.batches:
            steps = batch.pairs.shape[1]
            array = np.zeros((len(batch.lines), steps, batch.given_len), dtype=np.float32)
            for row, n in enumerate(batch.lines):
                array[row, :int(batch.lengths[row])] = per_line[n]
            result.append(torch.from_numpy(array))
        return result

    def soft_alignments(self, count: int) -> List[Optional[np.ndarray]]:
        """Per line (all `count` of them) the posteriors (I observed, J given) of the real
        states; None for a line with an empty side."""
        posteriors = [self.hmm_pass(batch, want_counts=False)[0][:, :, :batch.given_len]
                      for batch in self.batches]
        return self.by_line(posteriors, count)


def _agreed(directions: Dict[str, _Direction], posteriors: Dict[str, List[torch.Tensor]],
            count: int) -> List[Optional[np.ndarray]]:
    """Per line the product of the two directions' link posteriors, (target, source) arrays
    (fwd's layout; None for a line with an empty side): the counts of agreement training.
    Takes the per-batch posteriors out of `posteriors`, so that they are freed here."""
    fwd = directions["fwd"].by_line(posteriors.pop("fwd"), count)     # (target, source)
    rev = directions["rev"].by_line(posteriors.pop("rev"), count)     # (source, target)
    return [None if f is None else f * r.T for f, r in zip(fwd, rev)]


def soft_alignments(source: Sequence[Sequence[str]], target: Sequence[Sequence[str]],
                    config: TeacherConfig = TeacherConfig()
                    ) -> Dict[str, List[np.ndarray]]:
    """Train both directions on the words of every line and return their soft alignments,
    ``{"fwd": [...], "rev": [...]}``: one (source words, target words) array per line, as
    aligner.links.combine.combine takes them; a line the teacher skips (an empty side, over
    ``config.max_words``) gets an array without elements, whatever its length (as in
    aligner.extract.inference.no_alignment)."""
    sides = {"fwd": (target, source), "rev": (source, target)}   # (observed, given)
    directions = {name: _Direction(observed, given, config)
                  for name, (observed, given) in sides.items()}
    for name, direction in directions.items():
        for iteration in range(config.ibm1_iterations):
            ll = direction.ibm1_iteration()
            logger.info("teacher %s IBM-1 iteration %d: log-likelihood %.1f", name,
                        iteration + 1, ll)
    count = len(source)
    for iteration in range(config.hmm_iterations):
        posteriors, jumps = {}, {}
        for name, direction in directions.items():
            posteriors[name], jumps[name], ll = direction.expectations()
            logger.info("teacher %s HMM iteration %d: log-likelihood %.1f", name,
                        iteration + 1, ll)
        if config.agreement:   # each direction's counts: the product, (target, source)
            both = _agreed(directions, posteriors, count)
            directions["fwd"].maximize(directions["fwd"].to_batches(both), jumps["fwd"])
            directions["rev"].maximize(directions["rev"].to_batches(
                [None if b is None else b.T for b in both]), jumps["rev"])
            del both
        else:
            for name, direction in directions.items():
                direction.maximize(posteriors.pop(name), jumps[name])
    result = {}
    for name, (observed, given) in sides.items():
        soft = directions[name].soft_alignments(count)
        for n in range(count):
            if soft[n] is None:
                shape = (len(observed[n]), len(given[n]))
                soft[n] = np.zeros(shape if 0 in shape else (0, 0), dtype=np.float32)
        # fwd: (target, source) -> (source, target); rev is (source, target) already
        result[name] = [m.T if name == "fwd" else m for m in soft]
    return result
