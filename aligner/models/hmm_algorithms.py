"""HMM algorithms on batched tensors in log space (pure functions, no parameters).

Used by the direct-HMM models (aligner/models/direct_hmm.py); knows nothing of models or data.

Conventions (all functions):

* Target positions i = 0..I-1 are the HMM's time steps, source positions j = 0..J-1 its states.
* ``log_emission``   (B, I, J): log p(e_i | state j) (any real scores work; nothing here
  assumes normalization).
* ``log_initial``    (B, J): log p(b_0 = j | start state).
* ``log_transition`` (B, I, J, J): ``log_transition[b, i, j', j]`` = log p(b_i = j | b_{i-1} = j'),
  the step *into* position i. Entry i = 0 is never read (position 0 uses ``log_initial``); it is
  kept so that the tensor lines up with ``log_emission``. Where noted, a function also takes a
  :data:`TransitionFn` instead: ``fn(start, stop)`` returns the slice
  ``log_transition[:, start:stop]`` (B, stop - start, J, J), computed on demand, so that the
  whole (B, I, J, J) tensor (cubic in sentence length) never exists; ``chunk`` target
  positions are asked for at a time.
* ``target_lengths`` (B,) long, 1 <= length <= I: positions i >= length are padding. They do not
  enter any score; a sentence's log Z is read at its own last position.
* ``source_mask``    (B, J) bool, True at real states: padded states get probability 0 (their
  emissions are replaced by a very negative constant, so no path through them counts).

-inf inputs are allowed (e.g. from a masked log_softmax): every input is clamped to ``NEG``, a
finite stand-in for log 0, so that gradients never become NaN (0 · inf) in the masked corners.

Posteriors are not hand-written: γ(i, j) = p(b_i = j | e) = ∂ log Z / ∂ log_emission[i, j]
(forward–backward is backprop; Eisner 2016), see :func:`posteriors`.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple, Union

import torch
from torch.utils.checkpoint import checkpoint

#: finite stand-in for log 0 (exp underflows to exactly 0 in float32 and float64)
NEG = -1e30

#: ``fn(start, stop) -> (B, stop - start, J, J)`` log transitions into positions start..stop-1
TransitionFn = Callable[[int, int], torch.Tensor]
Transitions = Union[torch.Tensor, TransitionFn]


def _transition_fn(log_transition: Transitions) -> TransitionFn:
    """A :data:`TransitionFn` for either form of the transitions."""
    if callable(log_transition):
        return log_transition
    return lambda start, stop: log_transition[:, start:stop]


def _chunks(start: int, stop: int, chunk: Optional[int]):
    """[(a, b), ...] covering start..stop-1 in pieces of `chunk` positions (None = one piece);
    a shorter remainder comes first, so that the last piece is a whole one (the
    forward–backward keeps the last piece of its forward pass for its backward pass)."""
    size = max(1, chunk) if chunk else max(1, stop - start)
    edges = list(range(stop, start, -size)) + [start]      # from the right: stop, stop-size, ...
    edges.reverse()
    return list(zip(edges[:-1], edges[1:]))


def _clamp(scores: torch.Tensor) -> torch.Tensor:
    """Replace -inf (and anything below NEG) by NEG; gradient 0 there, identity elsewhere."""
    return scores.clamp_min(NEG)


def _prepare(log_emission: torch.Tensor, target_lengths: Optional[torch.Tensor],
             source_mask: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Clamped emissions with padded states at NEG (B, I, J), and the target lengths (B,)."""
    batch, steps, states = log_emission.shape
    emission = _clamp(log_emission)
    if source_mask is not None:
        emission = emission.masked_fill(~source_mask[:, None, :], NEG)
    if target_lengths is None:
        target_lengths = torch.full((batch,), steps, dtype=torch.long, device=emission.device)
    return emission, target_lengths


def _zero_order_joint(log_alignment: torch.Tensor, log_emission: torch.Tensor,
                      source_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """log α(j|i) + log p(e_i|j) (B, I, J), clamped, NEG at padded source positions."""
    joint = _clamp(log_alignment) + _clamp(log_emission)
    if source_mask is not None:
        joint = joint.masked_fill(~source_mask[:, None, :], NEG)
    return joint


def zero_order_log_likelihood(log_alignment: torch.Tensor, log_emission: torch.Tensor,
                              source_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Zero-order (mixture) log-likelihood per target position.

    log p(e_i) = log Σ_j exp(log_alignment[i, j] + log_emission[i, j]).

    Args:
        log_alignment: (B, I, J) log α(j | i).
        log_emission: (B, I, J) log p_lex(e_i | j).
        source_mask: (B, J) bool, True at real source positions (others get α = 0).
    Returns:
        (B, I) log p(e_i | e_<i, f). The caller masks padded target positions.
    """
    return torch.logsumexp(_zero_order_joint(log_alignment, log_emission, source_mask), dim=-1)


def zero_order_posterior(log_alignment: torch.Tensor, log_emission: torch.Tensor,
                         source_mask: Optional[torch.Tensor] = None,
                         log_link: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Zero-order posterior p(b_i = j | e_i) ∝ α(j | i) · p_lex(e_i | j), (B, I, J).

    Sums to 1 over real source positions j; exactly 0 at padded ones. ``log_link`` (B, I, J):
    the part of each emission that counts as a link (an emission that mixes in an empty word,
    aligner/models/direct_hmm.py): then α(j|i)·exp(log_link) / Σ_j' α(j'|i)·p(e_i|j'), rows
    summing to p(e_i aligned). None, or ``log_emission`` itself: all of it.
    """
    if log_link is None or log_link is log_emission:      # no empty word: one softmax
        return torch.softmax(_zero_order_joint(log_alignment, log_emission, source_mask),
                             dim=-1)
    return zero_order_log_posterior(log_alignment, log_emission, source_mask, log_link).exp()


def zero_order_log_posterior(log_alignment: torch.Tensor, log_emission: torch.Tensor,
                             source_mask: Optional[torch.Tensor] = None,
                             log_link: Optional[torch.Tensor] = None) -> torch.Tensor:
    """log of :func:`zero_order_posterior`, (B, I, J) (about -1e30 at padded positions)."""
    joint = _zero_order_joint(log_alignment, log_emission, source_mask)
    if log_link is None or log_link is log_emission:      # no empty word: one log-softmax
        return torch.log_softmax(joint, dim=-1)
    link = _zero_order_joint(log_alignment, log_link, source_mask)
    return link - torch.logsumexp(joint, dim=-1, keepdim=True)


def forward_step(forward: torch.Tensor, log_transition: torch.Tensor) -> torch.Tensor:
    """One step of the first-order forward recursion, before the emission is added:
    log Σ_j' exp(forward[j'] + log_transition[j', j]).

    forward (B, J') log scores of the previous position's states, log_transition (B, J', J)
    -> (B, J). Nothing is clamped here (the callers clamp where they need to). Used by
    :func:`forward_log_z` and :func:`forward_log_z_parallel`, and by the direct HMM's
    incremental decoding (aligner/models/direct_hmm.py: the alignment prior of the next
    output position from the normalized forward state).
    """
    return torch.logsumexp(forward.unsqueeze(2) + log_transition, dim=1)


def forward_log_z(log_emission: torch.Tensor, log_initial: torch.Tensor,
                  log_transition: Transitions, target_lengths: Optional[torch.Tensor] = None,
                  source_mask: Optional[torch.Tensor] = None,
                  chunk: Optional[int] = None) -> torch.Tensor:
    """First-order HMM: log Z = log Σ_paths p(path, e), by the forward recursion (a loop over I).

    Q(0, j) = log_initial[j] + log_emission[0, j]
    Q(i, j) = log Σ_j' exp(Q(i-1, j') + log_transition[i, j', j]) + log_emission[i, j]
    log Z   = log Σ_j exp(Q(length-1, j))

    Shapes as in the module docstring; ``log_transition`` may be a :data:`TransitionFn`. With
    ``chunk`` (target positions per piece) smaller than I - 1, the transitions of one piece are
    computed, used and dropped, and in backward recomputed (activation checkpointing), so only
    (B, chunk, J, J) of them is alive at once; without it the whole tensor is used at once.
    Returns (B,). Differentiable (autograd gives the backward pass; see :func:`posteriors`).
    """
    emission, lengths = _prepare(log_emission, target_lengths, source_mask)
    transition_fn = _transition_fn(log_transition)
    # one unbind per tensor, not transition[:, i] in the loop: the backward of each indexing
    # fills a zero tensor of the whole input, I times (O(I^2 J^2); 60 % of a training step)
    emissions = emission.unbind(1)                                       # I x (B, J)
    forward = _clamp(log_initial) + emissions[0]                         # (B, J)
    pieces = _chunks(1, len(emissions), chunk)

    def run(forward: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        transitions = _clamp(transition_fn(start, stop)).unbind(1)       # (stop-start) x (B, J', J)
        for i in range(start, stop):
            step = forward_step(forward, transitions[i - start]) + emissions[i]
            forward = torch.where((i < lengths).unsqueeze(1), step, forward)  # padding: carry Q
        return forward

    for start, stop in pieces:
        if len(pieces) > 1 and torch.is_grad_enabled():
            forward = checkpoint(run, forward, start, stop, use_reentrant=False)
        else:
            forward = run(forward, start, stop)
    return torch.logsumexp(forward, dim=-1)


def _normalized(vector: torch.Tensor) -> torch.Tensor:
    """`vector` divided by its sum over the last dimension (a zero row stays zero)."""
    return vector / vector.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(vector.dtype).tiny)


@torch.no_grad()
def forward_backward(log_emission: torch.Tensor, log_initial: torch.Tensor,
                     log_transition: Transitions, target_lengths: Optional[torch.Tensor] = None,
                     source_mask: Optional[torch.Tensor] = None,
                     chunk: Optional[int] = None,
                     transition_probs: Optional[TransitionFn] = None) -> torch.Tensor:
    """State posteriors γ(i, j) = p(b_i = j | e), (B, I, J), by an explicit scaled
    forward–backward.

    The same values as :func:`posteriors` of :func:`forward_log_z` (to float rounding), without
    autograd: probability space with per-step normalization (Rabiner 1989),
    α_i = (α_{i-1} · A_i) ⊙ e_i / c_i,  β_i = A_{i+1} · (e_{i+1} ⊙ β_{i+1}) / d_i,
    γ_i ∝ α_i ⊙ β_i, where A_i = exp(log_transition[i]) and
    e_i = exp(log_emission[i] - max_j log_emission[i]).
    Each step is one batched matrix–vector product. ``log_transition`` may be a
    :data:`TransitionFn`; it is asked for ``chunk`` target positions at a time, twice (forward
    and backward pass) except for the last piece, whose matrices serve both passes (one call
    when one chunk holds every position), so memory beyond O(B·I·J) is (B, chunk, J, J). Rows are 0 at padded
    target positions and padded states. Not differentiable (runs under no_grad).
    ``transition_probs``: a TransitionFn giving A_i itself (exp of ``log_transition``, e.g. a
    softmax where ``log_transition`` is a log_softmax), used instead of exponentiating.
    """
    emission, lengths = _prepare(log_emission, target_lengths, source_mask)
    batch, steps, states = emission.shape
    dtype = torch.promote_types(emission.dtype, torch.float32)
    log_transition_fn = _transition_fn(log_transition)

    def transition_matrices(start: int, stop: int) -> torch.Tensor:
        """A_i for i in start..stop-1: (B, c, J', J)."""
        if transition_probs is not None:
            return transition_probs(start, stop).to(dtype)
        return log_transition_fn(start, stop).to(dtype).exp()

    emission = emission.to(dtype)
    scaled = (emission - emission.amax(dim=-1, keepdim=True)).exp()          # (B, I, J) in [0, 1]
    active = torch.arange(steps, device=emission.device).unsqueeze(0) < lengths.unsqueeze(1)

    initial = _clamp(log_initial).to(dtype).exp()                           # (B, J)
    pieces = _chunks(1, steps, chunk)
    if len(pieces) == 1:   # every transition matrix at once: both passes in one loop
        matrices = transition_matrices(1, steps) if steps > 1 else None
        return _forward_backward_at_once(scaled, initial, matrices, active).to(
            log_emission.dtype)
    alphas = [_normalized(initial * scaled[:, 0])]
    matrices = None        # at the end: the last piece's, which the backward pass starts with
    for start, stop in pieces:
        matrices = transition_matrices(start, stop)                        # (B, c, J', J)
        for i in range(start, stop):
            step = _normalized(_bmm(alphas[-1].unsqueeze(1), matrices[:, i - start])
                              .squeeze(1) * scaled[:, i])
            alphas.append(torch.where(active[:, i:i + 1], step, alphas[-1]))
    betas = [torch.ones(batch, states, dtype=dtype, device=emission.device)]
    for number, (start, stop) in enumerate(reversed(pieces)):
        if number > 0:     # the last piece's matrices are still those of the forward pass
            matrices = transition_matrices(start, stop)
        for i in range(stop - 1, start - 1, -1):                            # β_{i-1} from β_i
            # β_{i-1} = A_i · (e_i ⊙ β_i), as a row vector times A_iᵀ (a view): several
            # times faster than a matrix times a column vector in torch.bmm on the CPU
            step = _normalized(_bmm((scaled[:, i] * betas[-1]).unsqueeze(1),
                                   matrices[:, i - start].transpose(-1, -2)).squeeze(1))
            # positions at or after the sentence's last one keep β = 1
            betas.append(torch.where(active[:, i:i + 1], step, betas[-1]))
    gamma = torch.stack(alphas, dim=1) * torch.stack(betas[::-1], dim=1)    # (B, I, J)
    gamma = _normalized(gamma) * active.unsqueeze(-1)
    return gamma.to(log_emission.dtype)


def _forward_backward_at_once(scaled: torch.Tensor, initial: torch.Tensor,
                              matrices: Optional[torch.Tensor], active: torch.Tensor
                              ) -> torch.Tensor:
    """γ (B, I, J) of :func:`forward_backward` when all transition matrices fit at once: the
    forward and the backward pass advance together, as one batch of 2B vectors, so each of
    the I - 1 steps is two row-vector-by-matrix products and one normalization for both (the
    per-step cost is dispatch, not arithmetic).

    scaled (B, I, J): emissions e_i in [0, 1]; initial (B, J): p(b_0 = j); matrices
    (B, I-1, J, J): A_1..A_{I-1} (None when I = 1); active (B, I) bool: real target positions.
    Both halves follow x_t = norm((x_{t-1} · M_t) ⊙ E_t):
      forward  (rows :B):  α_t = norm((α_{t-1} · A_t) ⊙ e_t), t = 1..I-1;
      backward (rows B:):  β̃_{i-1} = norm((β̃_i · A_iᵀ) ⊙ e_{i-1}), i = I - t, where
                           β̃_i = e_i ⊙ β_i (so β̃ = e at a sentence's last position, and at
                           padded positions, where β = 1).
    γ_0 ∝ p(b_0) ⊙ β̃_0 and γ_t ∝ (α_{t-1} · A_t) ⊙ β̃_t (both equal α ⊙ β), normalized per
    position; rows at padded target positions are 0. The same values as the two-loop path
    to float rounding.
    """
    batch, steps, states = scaled.shape

    backward_tilde = [scaled[:, steps - 1]]      # β̃_{I-1}, then β̃_{I-2}, ... (unnormalized ok)
    forward_messages = [initial]                  # p(b_0), then α_{t-1} · A_t for t = 1..I-1
    if steps > 1:
        # step t (1..I-1) of the forward half uses A_t, e_t, active_t; of the backward half
        # A_iᵀ, e_{i-1}, active_i with i = I - t
        step_emissions = torch.cat([scaled[:, 1:], scaled[:, :-1].flip(1)])        # (2B, I-1, J)
        step_active = torch.cat([active[:, 1:], active[:, 1:].flip(1)]).unsqueeze(-1)
        # where a step is padding: forward rows 0 (masked in γ), backward rows β̃ = e (β = 1)
        fallback = torch.cat([torch.zeros_like(scaled[:, 1:]), step_emissions[batch:]])
        vectors = torch.cat([_normalized(initial * scaled[:, 0]), scaled[:, steps - 1]])  # (2B, J)
        with torch.autocast(device_type=scaled.device.type, enabled=False):
            for t in range(steps - 1):
                # a row vector times a matrix (or a transposed view): several times faster
                # than a matrix times a column vector in torch.bmm on the CPU
                product = torch.cat([
                    torch.bmm(vectors[:batch].unsqueeze(1), matrices[:, t]),
                    torch.bmm(vectors[batch:].unsqueeze(1),
                              matrices[:, steps - 2 - t].transpose(-1, -2))]).squeeze(1)
                forward_messages.append(product[:batch])
                vectors = torch.where(step_active[:, t],
                                      _normalized(product * step_emissions[:, t]), fallback[:, t])
                backward_tilde.append(vectors[batch:])
    gamma = torch.stack(forward_messages, dim=1) * torch.stack(backward_tilde[::-1], dim=1)
    return _normalized(gamma) * active.unsqueeze(-1)


def _bmm(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """torch.bmm outside autocast, in the inputs' dtype: under bf16 autocast a plain bmm would
    round α, β and the transition matrices to 8 significant bits at every one of the I steps."""
    with torch.autocast(device_type=left.device.type, enabled=False):
        return torch.bmm(left, right)


def log_matmul(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Matrix product in the log semiring.

    out[.., a, c] = log Σ_b exp(left[.., a, b] + right[.., b, c]).

    Computed as a real matrix product of shifted exponentials (one BLAS call instead of a
    (.., A, B, C) broadcast): entries are shifted by their row maximum of ``left`` and column
    maximum of ``right``; the product runs outside autocast, in the inputs' precision. A term
    underflows to 0 when its two factors together lie more than ~87 nats (float32) below the
    two maxima; an output entry made only of such terms comes out as ~log(tiny) + maxima, a
    lower bound, where the exact value is far below the dominant entries of its row and column.
    For log Z that is negligible in practice (tests compare with the loop at realistic sizes).
    Shapes: left (.., A, K), right (.., K, C) -> (.., A, C).
    """
    left_max = left.amax(dim=-1, keepdim=True).detach()                 # (.., A, 1)
    right_max = right.amax(dim=-2, keepdim=True).detach()               # (.., 1, C)
    with torch.autocast(device_type=left.device.type, enabled=False):  # never in bf16/fp16
        product = torch.matmul((left - left_max).exp(), (right - right_max).exp())
    tiny = torch.finfo(product.dtype).tiny
    return product.clamp_min(tiny).log() + left_max + right_max


def forward_log_z_parallel(log_emission: torch.Tensor, log_initial: torch.Tensor,
                           log_transition: torch.Tensor,
                           target_lengths: Optional[torch.Tensor] = None,
                           source_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Same value as :func:`forward_log_z`, by a tree reduction in O(log I) sequential steps.

    Each step i >= 1 is a (J', J) matrix M_i[j', j] = log_transition[i, j', j] + log_emission[i, j];
    log Z = logsumexp(Q(0) ⊗ M_1 ⊗ ... ⊗ M_{I-1}) in the log semiring (⊗ = :func:`log_matmul`).
    The product is associative, so neighbouring matrices are multiplied pairwise, halving the
    count each round. Padded positions (i >= length) become the semiring identity (0 on the
    diagonal, log 0 elsewhere). Work is O(I J^3) instead of the loop's O(I J^2), but with
    ceil(log2 I) rounds of batched matmuls instead of I small steps.
    Shapes as in the module docstring. Returns (B,).
    """
    emission, lengths = _prepare(log_emission, target_lengths, source_mask)
    batch, steps, states = emission.shape
    start = _clamp(log_initial) + emission[:, 0]                          # (B, J)
    if steps == 1:
        return torch.logsumexp(start, dim=-1)
    matrices = _clamp(log_transition[:, 1:]) + emission[:, 1:].unsqueeze(2)  # (B, I-1, J', J)
    identity = torch.full((states, states), NEG, dtype=emission.dtype, device=emission.device)
    identity.fill_diagonal_(0.0)
    positions = torch.arange(1, steps, device=emission.device)
    padded = (positions.unsqueeze(0) >= lengths.unsqueeze(1))[:, :, None, None]  # (B, I-1, 1, 1)
    matrices = torch.where(padded, identity, matrices)
    while matrices.shape[1] > 1:
        count = matrices.shape[1]
        paired = log_matmul(matrices[:, 0:count - 1:2], matrices[:, 1:count:2])
        if count % 2:
            paired = torch.cat([paired, matrices[:, -1:]], dim=1)
        matrices = paired
    final = forward_step(start, matrices[:, 0])                           # (B, J)
    return torch.logsumexp(final, dim=-1)


def posteriors(log_z: torch.Tensor, log_emission: torch.Tensor,
               create_graph: bool = False) -> torch.Tensor:
    """State posteriors γ(i, j) = p(b_i = j | e, f) = ∂ log Z / ∂ log_emission[i, j], (B, I, J).

    ``log_z`` (B,) must have been computed from ``log_emission`` (which must require grad).
    Rows sum to 1 at real target positions and are 0 at padded ones — when ``log_emission``
    is the whole emission; for a part of it (the link part of a direct HMM's empty-word
    mixture) they sum to that part's share.
    """
    (gradient,) = torch.autograd.grad(log_z.sum(), log_emission, create_graph=create_graph)
    return gradient


def viterbi(log_emission: torch.Tensor, log_initial: torch.Tensor, log_transition: Transitions,
            target_lengths: Optional[torch.Tensor] = None,
            source_mask: Optional[torch.Tensor] = None,
            chunk: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Best state path (max-product with back-pointers).

    Shapes as in the module docstring; ``log_transition`` may be a :data:`TransitionFn`, asked
    for ``chunk`` target positions at a time. Returns (path (B, I) long, score (B,)): path[b, i]
    is the state of position i on the best path, -1 at padded positions; score is its log
    probability.
    """
    emission, lengths = _prepare(log_emission, target_lengths, source_mask)
    transition_fn = _transition_fn(log_transition)
    batch, steps, states = emission.shape
    best = _clamp(log_initial) + emission[:, 0]                          # (B, J)
    stay = torch.arange(states, device=emission.device).expand(batch, states)
    pointers = []                                                        # per i >= 1: (B, J)
    for start, stop in _chunks(1, steps, chunk):
        transition = _clamp(transition_fn(start, stop))                  # (B, c, J', J)
        for i in range(start, stop):
            candidates = best.unsqueeze(2) + transition[:, i - start]     # (B, J', J)
            step_best, step_pointer = candidates.max(dim=1)
            active = (i < lengths).unsqueeze(1)
            best = torch.where(active, step_best + emission[:, i], best)
            pointers.append(torch.where(active, step_pointer, stay))     # padding: stay put
    score, state = best.max(dim=-1)                                      # (B,)
    path = [state]
    for pointer in reversed(pointers):
        state = pointer.gather(1, state.unsqueeze(1)).squeeze(1)
        path.append(state)
    path_tensor = torch.stack(path[::-1], dim=1)                         # (B, I)
    positions = torch.arange(steps, device=emission.device).unsqueeze(0)
    path_tensor = path_tensor.masked_fill(positions >= lengths.unsqueeze(1), -1)
    return path_tensor, score
