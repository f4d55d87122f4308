"""The classical aligner as a model kind (``--model classical``): per direction a first-order
HMM over words (Vogel et al. 1996) with Och & Ney's (2003) empty word, its lexicon a table
t(observed word | given word) over the word pairs seen together in training and its jumps one
distribution s(d) over distances, trained by EM in agreement (Liang et al. 2006;
aligner/training/classical.py). The same model is the recipe's teacher
(aligner/training/teacher.py).

Conventions as every model kind's (aligner/models/base.py): this direction's "source" (the
encoder side, ``src``) is the HMM's *given* side, its states j = 0..J-1; its "target"
(``tgt_out``) is the *observed* side, the time steps i = 0..I-1. The units are words
(a classical model directory has no BPE: ``bpe_merges`` 0). State J + j' stands for "the empty
word, after given word j'", so a jump after an empty word is measured from the last real
position:

    p(j | j', J) = (1 - p0) · s(j - j') / Σ_{j''<J} s(j'' - j'),   p(empty after j' | j') = p0,

the distance clipped to [-max_jump, max_jump]. With ``boundaries`` (the default) each line
is framed by its start and its end, two more positions of both sides that only align to each
other (:func:`with_boundaries`): the first word's position is a jump from the start, and the
last word's position is followed by a jump to the end, so a line's ends pull its first and
last words towards the other side's (sentence-final punctuation in particular), where
without them the first position is uniform and the last is free
(eval/results/boundaries.md). A pair of words never seen together in training (an unknown
word, in particular) has the lexicon probability ``unseen_prob`` instead of 0, as fast_align
gives an unseen pair a small floor: an unknown word then takes its link from its neighbours'
positions through the jumps, or none.

The forward–backward (:func:`forward_backward`) runs in float32, scaled per position, on
batches of lines of any lengths (padded positions masked), one (J, J) transition matrix per
line; training counts are float64. ``hmm-posterior`` gives p(word i aligned to j | both
sentences): rows sum to p(i aligned) ≤ 1, the rest is the empty word's.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import torch

from aligner import constants as C
from aligner.config import ModelConfig
from aligner.models.base import AlignmentModel, DecodeState
from aligner.utils import AlignerError, check_condition


@dataclasses.dataclass
class ClassicalConfig(ModelConfig):
    """The classical HMM's settings (config.json). src_vocab_size / tgt_vocab_size: the word
    vocabularies (given / observed side of fwd). ibm1_iterations, hmm_iterations: EM iterations
    of IBM Model 1 (whose lexicon starts the HMM) and of the HMM. empty_prob: p0, fixed.
    max_jump: longer jumps share one weight. boundaries: the lines' start and end are states
    of the HMM (:func:`with_boundaries`; a config.json written before this key has none).
    agreement: the two directions' lexicon counts are the product of their posteriors (Liang
    et al. 2006). unseen_prob: t(o | g) of a pair never seen together in training.
    max_positions: words + 1 of the longest side aligned (longer lines get no links).
    batch_cells: given × observed words × lines per batch in training, its unit of memory."""

    #: a model directory written before ``boundaries`` existed has none
    LEGACY_DEFAULTS = {"boundaries": False}

    src_vocab_size: int
    tgt_vocab_size: int
    ibm1_iterations: int = 5
    hmm_iterations: int = 5
    empty_prob: float = 0.1
    max_jump: int = 100
    boundaries: bool = True
    agreement: bool = True
    unseen_prob: float = 1e-7
    max_positions: int = 1024
    batch_cells: int = 1_000_000

    def __post_init__(self) -> None:
        check_condition(self.ibm1_iterations >= 0 and self.hmm_iterations >= 0,
                        "ibm1_iterations and hmm_iterations must be >= 0")
        check_condition(0.0 < self.empty_prob < 1.0, f"empty_prob must be in (0, 1): "
                                                     f"{self.empty_prob}")
        check_condition(self.max_jump >= 1, f"max_jump must be >= 1: {self.max_jump}")
        check_condition(0.0 < self.unseen_prob < 1.0, f"unseen_prob must be in (0, 1): "
                                                      f"{self.unseen_prob}")
        check_condition(self.max_positions >= 2, "max_positions must be >= 2")
        check_condition(self.batch_cells >= 1, "batch_cells must be >= 1")


#: Knuth's multiplicative hashing constant (2^64 / golden ratio), as a signed int64
_HASH_MULTIPLIER = -7046029254386353131
#: keys a :class:`KeyIndex` places at a time (its build's temporaries: some 60 bytes a key)
BUILD_CHUNK = 1 << 20


class KeyIndex:
    """Positions of int64 keys in an array of unique keys, by an open-addressing hash table
    with linear probing (load factor at most 1/2): a lookup reads one or two slots where a
    binary search over millions of keys reads about twenty, scattered (2x torch.searchsorted's
    speed on 5M random lookups among 4M keys). Slots are int32 below 2^31 keys.

    keys (N,) int64 unique. :meth:`find` gives each query's position in `keys`, or -1.

    The table is filled `chunk` keys at a time (:data:`BUILD_CHUNK`), so that the build's
    temporaries (each key's home slot, the keys still to place, ...) stay the size of a chunk:
    built in one go on the 5.9M keys of a 407k-line teacher, they held about 0.5 GB more than
    the table, a peak that a process whose freed memory stays with it keeps
    (aligner/malloc.py; eval/results/extract_memory.md). `chunk` 0: BUILD_CHUNK. Which slot a
    key gets can depend on the chunks; what :meth:`find` returns cannot."""

    def __init__(self, keys: torch.Tensor, chunk: int = 0):
        self.keys = keys
        bits = max(10, int(2 * max(1, len(keys)) - 1).bit_length())
        self.mask = (1 << bits) - 1
        index_type = torch.int32 if len(keys) < 2 ** 31 else torch.long   # half the memory
        self.slots = torch.full((self.mask + 1,), -1, dtype=index_type, device=keys.device)
        chunk = chunk or BUILD_CHUNK
        for start in range(0, len(keys), chunk):
            self._place(start, keys[start:start + chunk])

    def _place(self, start: int, keys: torch.Tensor) -> None:
        """Put `keys` (positions start, start + 1, ... of the index's keys) into free slots:
        round k places, in the k-th slot after its home, what it can (one claim per slot
        wins; the others go on to the next slot)."""
        pending = torch.arange(len(keys), device=keys.device)
        home = self._hash(keys)
        probe = 0
        while len(pending):
            slot = (home[pending] + probe) & self.mask
            free = self.slots[slot] == -1
            claim, at = pending[free], slot[free]
            self.slots[at] = (claim + start).to(self.slots.dtype)
            won = torch.zeros(len(keys), dtype=torch.bool, device=keys.device)
            won[claim[self.slots[at].long() - start == claim]] = True
            pending = pending[~won[pending]]
            probe += 1

    def _hash(self, keys: torch.Tensor) -> torch.Tensor:
        return ((keys * _HASH_MULTIPLIER) >> 20) & self.mask

    def find(self, queries: torch.Tensor) -> torch.Tensor:
        """Positions (same shape as `queries`) in `keys`, -1 for a key not there."""
        flat = queries.reshape(-1)
        result = torch.full_like(flat, -1)
        if len(self.keys) == 0:
            return result.reshape(queries.shape)
        active = torch.arange(len(flat), device=flat.device)
        slot = self._hash(flat)
        while len(active):   # a key is in the first slots after its home, before a free one
            # (index_select: 4x the speed of indexing with a tensor on the CPU)
            position = self.slots.index_select(0, slot).long()
            filled = position >= 0
            hit = filled & (self.keys.index_select(0, position.clamp_min(0)) == flat[active])
            result[active[hit]] = position[hit]
            going_on = filled & ~hit
            active, slot = active[going_on], (slot[going_on] + 1) & self.mask
        return result.reshape(queries.shape)


class Lexicon:
    """t(observed | given) over the word pairs seen together in training.

    keys (N,) int64, sorted: given · n_observed + observed, the empty word being given id
    ``n_given``; probs (N,) float: their probabilities. :meth:`lookup` gives ``floor`` for a
    pair not in the table."""

    def __init__(self, keys: torch.Tensor, probs: torch.Tensor, n_given: int, n_observed: int,
                 floor: float, index: Optional[KeyIndex] = None):
        self.keys, self.probs = keys, probs
        self.n_given, self.n_observed, self.floor = n_given, n_observed, floor
        self.index = index if index is not None else KeyIndex(keys)

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """The probabilities of `keys` (any shape, int64), float32, ``floor`` where absent."""
        if len(self.keys) == 0:
            return torch.full(keys.shape, self.floor, dtype=torch.float32, device=keys.device)
        position = self.index.find(keys)
        found = self.probs.index_select(0, position.clamp_min(0).reshape(-1))
        return torch.where(position >= 0, found.view(position.shape).float(),
                           torch.tensor(self.floor, dtype=torch.float32, device=keys.device))

    def emissions(self, given: torch.Tensor, observed: torch.Tensor
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(real (B, I, J): t(observed i | given j), empty (B, I): t(observed i | empty)) for
        given ids (B, J) and observed ids (B, I) (padding: any id, masked by the caller)."""
        real = self.lookup(given[:, None, :] * self.n_observed + observed[:, :, None])
        empty = self.lookup(self.n_given * self.n_observed + observed)
        return real, empty


def jump_index(size: int, max_jump: int, device: torch.device) -> torch.Tensor:
    """(J, J) long: at [j', j] the index of the jump j - j' in a jump table, the distance
    clipped to [-max_jump, max_jump] and shifted by max_jump."""
    positions = torch.arange(size, device=device)
    return (positions[None, :] - positions[:, None]).clamp(-max_jump, max_jump) + max_jump


def jump_weights(jumps: torch.Tensor, size: int, max_jump: int) -> torch.Tensor:
    """(J, J) s(j - j') at [j', j]; jumps (2·max_jump + 1,) holds s(d) at d + max_jump."""
    return jumps.float()[jump_index(size, max_jump, jumps.device)]


def transitions(jumps: torch.Tensor, given_mask: torch.Tensor, empty_prob: float,
                max_jump: int) -> torch.Tensor:
    """(B, J, J) p(real j | previous position j') per line, rows j' summing to 1 - p0 over
    the line's real positions (0 into padded j). jumps (2·max_jump + 1,): s(d) at
    d + max_jump; given_mask (B, J) bool. (:func:`forward_backward` never builds it: it
    factors it into one shared (J, J) matrix and a normalizer per line.)"""
    weights = jump_weights(jumps, given_mask.shape[1], max_jump)[None] \
        * given_mask[:, None, :].float()                                  # (B, J', J)
    return (1 - empty_prob) * weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)


def with_boundaries(real: torch.Tensor, empty: torch.Tensor, observed_mask: torch.Tensor,
                    given_mask: torch.Tensor
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The lines of a batch framed by their start and end (ClassicalConfig.boundaries): one
    more position before and after each side's words (after its last real one, so at a
    different place per line), the start observed only from the start given, the end only
    from the end given (emission 1; 0 from anything else, the empty word included), so every
    path starts at the start and ends at the end. Same arguments as :func:`forward_backward`;
    returns them framed: real (B, I + 2, J + 2), empty (B, I + 2), the masks (B, I + 2) and
    (B, J + 2). The words' posteriors of the framed batch are ``[:, 1:I + 1, 1:J + 1]``."""
    batch, steps, size = real.shape
    lines = torch.arange(batch, device=real.device)
    observed_length, given_length = observed_mask.sum(1), given_mask.sum(1)        # (B,)
    framed = real.new_zeros(batch, steps + 2, size + 2)
    framed[:, 1:steps + 1, 1:size + 1] = real * (observed_mask[:, :, None]
                                                 & given_mask[:, None, :])
    framed[:, 0, 0] = 1.0
    framed[lines, observed_length + 1, given_length + 1] = 1.0
    framed_empty = empty.new_zeros(batch, steps + 2)
    framed_empty[:, 1:steps + 1] = empty * observed_mask
    positions = torch.arange(steps + 2, device=real.device)
    framed_observed = positions[None, :] < (observed_length + 2)[:, None]
    positions = torch.arange(size + 2, device=real.device)
    framed_given = positions[None, :] < (given_length + 2)[:, None]
    return framed, framed_empty, framed_observed, framed_given


def forward_backward(real: torch.Tensor, empty: torch.Tensor, observed_mask: torch.Tensor,
                     given_mask: torch.Tensor, jumps: torch.Tensor, empty_prob: float,
                     max_jump: int, want_jumps: bool = False, boundaries: bool = False
                     ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The scaled forward–backward of a batch of lines of any lengths; with `boundaries`,
    of the lines framed by their start and end (:func:`with_boundaries`: the posteriors are
    the words', the expected jumps count those from the start and to the end too).

    real (B, I, J): emissions of the real states; empty (B, I): the empty word's;
    observed_mask (B, I), given_mask (B, J) bool: real positions (a prefix of each row, at
    least one of each). Returns (posteriors (B, I, J) of the real states, 0 at padding;
    log-likelihood (B,) float64 of each line; with `want_jumps`, the expected jumps per
    distance (2·max_jump + 1,) float64 summed over the batch, else None).

    Line b's transitions (:func:`transitions`) are (1 - p0) · W[j', j] · m_b[j] / Z_b[j']
    with W the shared (J, J) jump weights, m_b its real positions and Z_b[j'] = Σ_j W[j', j]
    m_b[j]: so every step is one (B, J) × (J, J) product for the whole batch."""
    if boundaries:
        steps, size = real.shape[1:]
        posterior, log_likelihood, counts = forward_backward(
            *with_boundaries(real, empty, observed_mask, given_mask), jumps, empty_prob,
            max_jump, want_jumps)
        # less the start's own first step (uniform over the J + 2 positions, real: 1 - p0)
        start = torch.log((1 - empty_prob) / (given_mask.sum(1).double() + 2))
        # (a shorter line's end lands on a padded cell: masked)
        words = observed_mask[:, :, None] & given_mask[:, None, :]
        return (posterior[:, 1:steps + 1, 1:size + 1] * words, log_likelihood - start,
                counts)
    p0 = empty_prob
    batch, steps, size = real.shape
    given = given_mask.float()                                             # m (B, J)
    valid = observed_mask
    distance = jump_index(size, max_jump, real.device)                     # (J, J)
    weights = jumps.float()[distance]                                      # W (J, J)
    inverse_normalizer = 1.0 / (given @ weights.T).clamp_min(1e-30)        # 1 / Z (B, J')
    # E_i with the step's constant factors folded in: (1 - p0) for a real state, p0 for an
    # empty one; 0 at padded states and padded positions. Position-major, (I, B, 2J), so
    # that each step reads and writes contiguous rows
    real_part = real.float().transpose(0, 1) * (given * (1 - p0))           # (I, B, J)
    empty_part = empty.float().t()[:, :, None] * (given * p0)               # (I, B, J)
    emission = torch.cat([real_part, empty_part], dim=-1)                   # (I, B, 2J)
    emission *= valid.t()[:, :, None]
    n_given = given.sum(-1, keepdim=True).clamp_min(1)
    alphas = torch.empty_like(emission)                                    # (I, B, 2J)
    scales = torch.empty(steps, batch, 1, device=real.device)              # c_i
    torch.mul(given.repeat(1, 2) / n_given, emission[0], out=alphas[0])    # p0, 1 - p0 in E_0
    for i in range(steps):   # α_i written in place, then normalized by c_i = Σ α_i
        if i > 0:
            previous = alphas[i - 1, :, :size] + alphas[i - 1, :, size:]   # (B, J) from j'
            torch.mul((previous * inverse_normalizer) @ weights, emission[i, :, :size],
                      out=alphas[i, :, :size])
            torch.mul(previous, emission[i, :, size:], out=alphas[i, :, size:])
        torch.sum(alphas[i], dim=-1, keepdim=True, out=scales[i])
        # a padded position has E = 0, so α = 0 there (γ is masked; nothing reads it on)
        alphas[i].div_(scales[i].clamp_min(1e-30))
    scales = torch.where(valid.t(), scales[:, :, 0], torch.ones_like(scales[:, :, 0]))  # (I, B)
    weighted = emission.div_(scales[:, :, None])                           # E_i / c_i
    # β of the real states equals the empty ones' (both move to j' alike): (I, B, J); 1 at
    # and after a line's last position, where E = 0 makes the product 0 and `padded` adds 1
    padded = (~valid).t().float()[:, :, None]                              # (I, B, 1)
    betas = torch.empty(steps, batch, size, device=real.device)
    betas[-1] = 1.0
    for i in range(steps - 1, 0, -1):
        w_real = weighted[i, :, :size].mul_(betas[i])        # E_i · β_i / c_i
        w_empty = weighted[i, :, size:].mul_(betas[i])
        # β_{i-1}(j') = Σ_j p(j | j') w(j) + p0 w(empty j')
        torch.addcmul(w_empty + padded[i], w_real @ weights.T, inverse_normalizer,
                      out=betas[i - 1])
    posterior = ((alphas[:, :, :size] * betas).transpose(0, 1)
                 * valid[:, :, None] * given[:, None, :])                   # (B, I, J)
    log_likelihood = scales.double().log().sum(0)
    if not want_jumps:
        return posterior, log_likelihood, None
    # [j', j] = Σ_b Σ_i α_i(j') · E_{i+1}(j) β_{i+1}(j) / c_{i+1} · p_b(j | j')
    previous = (alphas[:-1, :, :size] + alphas[:-1, :, size:]) * inverse_normalizer
    # ((1 - p0) is in the weighted E already)
    expected = weights * torch.einsum("ibj,ibk->jk", previous, weighted[1:, :, :size])
    counts = torch.zeros(2 * max_jump + 1, dtype=torch.float64, device=real.device)
    counts.index_add_(0, distance.flatten(), expected.flatten().double())
    return posterior, log_likelihood, counts


class ClassicalHMM(AlignmentModel):
    """One direction of the classical aligner: its lexicon table and jump weights, read from
    the weights file's extra state (they have no gradient: EM trains them,
    aligner/training/classical.py). It aligns; it does not translate."""

    METHODS = ("hmm-posterior",)
    config_class = ClassicalConfig
    #: trained by EM over the corpus (aligner/training/classical.py), not by the training loop
    TRAINED_BY_EM = True
    TRANSLATES = False
    #: measured on en-fr dev (eval/results/classical_enfr.md)
    BEST_HEURISTIC = "soft-average"
    #: its (B, I, J) tensors are small and each step of the forward–backward is a few
    #: operations on the whole batch, so larger batches only save dispatch: `align extract`
    #: 1.37x as fast as at the networks' 500 positions (eval/results/teacher_batches.md)
    CPU_MAX_TOKENS = 8000

    def __init__(self, config: ClassicalConfig):
        super().__init__()
        self.config = config
        self.register_buffer("lexicon_keys", torch.zeros(0, dtype=torch.long), persistent=False)
        self.register_buffer("lexicon_probs", torch.zeros(0), persistent=False)
        self.register_buffer("jumps", torch.ones(2 * config.max_jump + 1), persistent=False)
        self._index: Optional[KeyIndex] = None

    def set_tables(self, keys: torch.Tensor, probs: torch.Tensor, jumps: torch.Tensor) -> None:
        """The trained tables: keys (N,) int64 sorted (:class:`Lexicon`), probs (N,), jumps
        (2·max_jump + 1,)."""
        check_condition(keys.shape == probs.shape and keys.ndim == 1,
                        "lexicon keys and probabilities differ in shape")
        check_condition(jumps.shape == (2 * self.config.max_jump + 1,),
                        f"jump table of {tuple(jumps.shape)}, max_jump {self.config.max_jump}")
        device = self.jumps.device
        self.lexicon_keys = keys.to(device=device, dtype=torch.long)
        self.lexicon_probs = probs.to(device=device, dtype=torch.float32)
        self.jumps = jumps.to(device=device, dtype=torch.float32)

    def extra_state(self) -> Dict:
        return {"lexicon_keys": self.lexicon_keys.cpu(), "lexicon_probs": self.lexicon_probs.cpu(),
                "jumps": self.jumps.cpu()}

    def load_extra_state(self, state: Dict) -> None:
        check_condition(all(name in state for name in ("lexicon_keys", "lexicon_probs",
                                                       "jumps")),
                        "a classical model's weights file without its lexicon and jump tables")
        self.set_tables(state["lexicon_keys"], state["lexicon_probs"], state["jumps"])

    def lexicon(self) -> Lexicon:
        """The lexicon of the tables (its hash index built at the first call after
        :meth:`set_tables`)."""
        if self._index is None or self._index.keys is not self.lexicon_keys:
            self._index = KeyIndex(self.lexicon_keys)
        return Lexicon(self.lexicon_keys, self.lexicon_probs, self.config.src_vocab_size,
                       self.config.tgt_vocab_size, self.config.unseen_prob, self._index)

    def leaves_unaligned_mass(self, method: str) -> bool:
        return True

    def _posterior(self, src: torch.Tensor, tgt_out: torch.Tensor
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(posteriors (B, I+1, J+1) with 0 in the EOS row and column and at padding,
        log-likelihood (B,))."""
        given = src[:, :-1]                                         # (B, J)
        observed = tgt_out[:, :-1]                                  # (B, I)
        given_mask = given.ne(C.PAD_ID) & given.ne(C.EOS_ID)
        observed_mask = observed.ne(C.PAD_ID) & observed.ne(C.EOS_ID)
        real, empty = self.lexicon().emissions(given, observed)
        # float32 whatever the caller's autocast: products of many small probabilities
        with torch.autocast(src.device.type, enabled=False):
            posterior, log_likelihood, _ = forward_backward(
                real, empty, observed_mask, given_mask, self.jumps, self.config.empty_prob,
                self.config.max_jump, boundaries=self.config.boundaries)
        scores = posterior.new_zeros(src.shape[0], tgt_out.shape[1], src.shape[1])
        scores[:, :-1, :-1] = posterior
        return scores, log_likelihood

    def loss(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
             label_smoothing: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
        """-log p(observed words | given words) summed over the batch, and the number of
        non-pad target tokens (EOS included, as every kind counts them: the HMM knows the
        length, so EOS has probability 1 and adds nothing to the sum)."""
        _, log_likelihood = self._posterior(src, tgt_out)
        return -log_likelihood.sum().float(), tgt_out.ne(C.PAD_ID).sum()

    def alignment_scores(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                         method: str, **options) -> torch.Tensor:
        check_condition(method in self.METHODS, f"unknown method '{method}' for the classical "
                                                f"model (choose from {', '.join(self.METHODS)})")
        return self._posterior(src, tgt_out)[0]

    def init_decode_state(self, src: torch.Tensor, **options) -> DecodeState:
        raise AlignerError("--model classical aligns but does not translate (a lexicon table "
                           "and jumps, no language model): train hmm0 or hmm1 to translate")

    def decode_step(self, state: DecodeState, prev_tokens: torch.Tensor
                    ) -> Tuple[torch.Tensor, DecodeState]:
        raise AlignerError("--model classical aligns but does not translate")
