"""The classical aligner (aligner/models/classical.py, aligner/training/classical.py): its
forward–backward against an enumeration of every state path on a padded batch of lines of
different lengths, EM counts against hand-computed ones, agreement against a line-by-line
computation, blocks and two processes (gloo) against one, and the model kind from the command
line: train, align new text with unknown words, stream from a pipe."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from aligner.models.classical import (ClassicalConfig, KeyIndex, Lexicon, forward_backward,
                                      transitions)
from aligner.training.classical import posteriors, train_tables
from conftest import ROOT
from synthetic import one_swap_corpus as _synthetic, write_lines as _write

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
ALIGN = [sys.executable, "-m", "aligner"]


def _paths(real, empty, trans, p0, length, size):
    """Every state path of one line (I = `length` observed words, J = `size` given words) of
    the HMM as aligner/models/classical.py defines it (empty state J + j' continues from j'):
    yields (path, its joint probability with the observed words, its moves (j', j) into real
    states)."""
    for path in itertools.product(range(2 * size), repeat=length):
        p, position, moves = 1.0, None, []
        for i, state in enumerate(path):
            is_real = state < size
            if i == 0:
                step = (1 - p0) / size if is_real else p0 / size
            elif is_real:
                step = float(trans[position, state])
                moves.append((position, state))
            else:
                step = p0 if state - size == position else 0.0
            position = state if is_real else state - size
            p *= step * float(real[i, state] if is_real else empty[i])
        yield path, p, moves


def _random_batch(seed):
    """Three lines of (I, J) = (3, 2), (2, 3), (1, 1), padded to (3, 3): random emissions
    (padding cells random too: the masks must keep them out)."""
    generator = torch.Generator().manual_seed(seed)
    real = torch.rand(3, 3, 3, generator=generator) + 0.05
    empty = torch.rand(3, 3, generator=generator) + 0.05
    lengths = [(3, 2), (2, 3), (1, 1)]
    observed = torch.tensor([[i < n for i in range(3)] for n, _ in lengths])
    given = torch.tensor([[j < m for j in range(3)] for _, m in lengths])
    return real, empty, observed, given, lengths


def test_forward_backward_equals_the_enumeration_of_every_path():
    p0, max_jump = 0.3, 1
    real, empty, observed, given, lengths = _random_batch(0)
    jumps = torch.tensor([0.2, 0.5, 0.3])
    posterior, log_likelihood, counts = forward_backward(real, empty, observed, given, jumps,
                                                         p0, max_jump, want_jumps=True)
    trans = transitions(jumps, given, p0, max_jump)
    expected_counts = torch.zeros(3, dtype=torch.float64)
    for b, (n, m) in enumerate(lengths):
        total, gamma = 0.0, torch.zeros(n, 2 * m, dtype=torch.float64)
        moves_weight = torch.zeros(m, m, dtype=torch.float64)
        for path, p, moves in _paths(real[b], empty[b], trans[b], p0, n, m):
            total += p
            for i, state in enumerate(path):
                gamma[i, state] += p
            for move in moves:
                moves_weight[move] += p
        torch.testing.assert_close(posterior[b, :n, :m].double(), gamma[:, :m] / total,
                                   rtol=0, atol=1e-6)
        assert float(posterior[b, n:].abs().sum() + posterior[b, :, m:].abs().sum()) == 0.0
        assert float(log_likelihood[b]) == pytest.approx(np.log(total), abs=1e-5)
        for j_from in range(m):
            for j_to in range(m):
                distance = max(-max_jump, min(max_jump, j_to - j_from)) + max_jump
                expected_counts[distance] += moves_weight[j_from, j_to] / total
    torch.testing.assert_close(counts, expected_counts, rtol=0, atol=1e-5)


def _framed_paths(real, empty, framed, p0, length, size):
    """Every state path of one line with its start and end (ClassicalConfig.boundaries):
    `framed` (size + 2, size + 2) holds the line's transitions with the start at position 0,
    the words at 1..size and the end at size + 1. A path starts at the start, moves through
    one state per observed word (real j, or the empty word, which stays at the position it
    came from, the start included) and then to the end. Yields (path, its joint probability,
    its moves (j', j) between framed positions, those from the start and to the end
    included)."""
    for path in itertools.product(range(size + 1), repeat=length):   # size: the empty word
        p, position, moves = 1.0, 0, []
        for i, state in enumerate(path):
            if state < size:
                p *= float(framed[position, state + 1]) * float(real[i, state])
                moves.append((position, state + 1))
                position = state + 1
            else:
                p *= p0 * float(empty[i])
        p *= float(framed[position, size + 1])
        moves.append((position, size + 1))
        yield path, p, moves


def test_forward_backward_with_boundaries_equals_the_enumeration_of_every_path():
    """The lines framed by their start and end: posteriors, likelihood and expected jumps
    (those from the start and into the end included) against every path."""
    p0, max_jump = 0.3, 2
    real, empty, observed, given, lengths = _random_batch(1)
    jumps = torch.tensor([0.1, 0.2, 0.4, 0.2, 0.1])
    posterior, log_likelihood, counts = forward_backward(real, empty, observed, given, jumps,
                                                         p0, max_jump, want_jumps=True,
                                                         boundaries=True)
    assert posterior.shape == real.shape
    expected_counts = torch.zeros(5, dtype=torch.float64)
    for b, (n, m) in enumerate(lengths):
        framed_mask = torch.ones(1, m + 2, dtype=torch.bool)
        framed = transitions(jumps, framed_mask, p0, max_jump)[0]
        total, gamma = 0.0, torch.zeros(n, m, dtype=torch.float64)
        moves_weight = torch.zeros(m + 2, m + 2, dtype=torch.float64)
        for path, p, moves in _framed_paths(real[b], empty[b], framed, p0, n, m):
            total += p
            for i, state in enumerate(path):
                if state < m:
                    gamma[i, state] += p
            for move in moves:
                moves_weight[move] += p
        torch.testing.assert_close(posterior[b, :n, :m].double(), gamma / total,
                                   rtol=0, atol=1e-6)
        assert float(posterior[b, n:].abs().sum() + posterior[b, :, m:].abs().sum()) == 0.0
        assert float(log_likelihood[b]) == pytest.approx(np.log(total), abs=1e-5)
        for j_from in range(m + 2):
            for j_to in range(m + 2):
                distance = max(-max_jump, min(max_jump, j_to - j_from)) + max_jump
                expected_counts[distance] += moves_weight[j_from, j_to] / total
    torch.testing.assert_close(counts, expected_counts, rtol=0, atol=1e-5)


def test_boundaries_pull_the_last_words_together():
    """A line whose last observed word could come from either of two given words with the
    same emission: with boundaries the last given word (next to the end) takes most of it,
    without them the two share it alike; old config.json files (no key) read as none."""
    real = torch.tensor([[[0.9, 0.05, 0.05], [0.05, 0.5, 0.5]]])         # (1, I=2, J=3)
    empty = torch.full((1, 2), 0.01)
    observed, given = torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool)
    jumps = torch.tensor([0.05, 0.05, 0.1, 0.6, 0.2])                      # s(-2..2)
    framed, _, _ = forward_backward(real, empty, observed, given, jumps, 0.2, 2,
                                    boundaries=True)
    plain, _, _ = forward_backward(real, empty, observed, given, jumps, 0.2, 2)
    assert float(framed[0, 1, 2]) > float(framed[0, 1, 1]) + 0.1
    assert float(plain[0, 1, 2]) < float(plain[0, 1, 1])    # the shorter jump from j' = 0
    assert ClassicalConfig.from_dict({"src_vocab_size": 3, "tgt_vocab_size": 3}).boundaries \
        is False
    assert ClassicalConfig(src_vocab_size=3, tgt_vocab_size=3).boundaries is True
    assert ClassicalConfig.recorded_options({})["boundaries"] is True


def test_transitions_rows_sum_to_one_minus_p0_over_the_real_positions():
    given = torch.tensor([[True, True, False], [True, True, True]])
    trans = transitions(torch.tensor([1.0, 2.0, 3.0, 2.0, 1.0]), given, 0.2, 2)
    torch.testing.assert_close(trans.sum(-1), torch.full((2, 3), 0.8))
    assert float(trans[0, :, 2].abs().sum()) == 0.0                  # nothing into padding
    # line 1, from j' = 0: s(0), s(1), s(2) = 3, 2, 1 over 6
    torch.testing.assert_close(trans[1, 0], 0.8 * torch.tensor([3.0, 2.0, 1.0]) / 6)


def _ids(lines):
    """Lines of words as int64 id arrays (ids from 0, first seen first) and the count."""
    vocabulary = {}
    return ([np.array([vocabulary.setdefault(w, len(vocabulary)) for w in line.split()],
                      dtype=np.int64) for line in lines], len(vocabulary))


def test_one_ibm1_iteration_gives_the_hand_computed_lexicon():
    """Line 1 'a' given 'x' (with the empty word e), line 2 'a b' given 'x y', uniform
    start: each observed word's posterior is uniform over its line's given words and e, so
    c(x,a) = 1/2 + 1/3, c(x,b) = 1/3, t(a|x) = 5/7, t(b|x) = 2/7; c(e,a) = 5/6, c(e,b) = 1/3,
    t(a|e) = 5/7; c(y,a) = c(y,b) = 1/3, t(a|y) = 1/2. (fwd: the target 'a b' given the
    source 'x y'.)"""
    source, n_src = _ids(["x", "x y"])          # x = 0, y = 1
    target, n_tgt = _ids(["a", "a b"])          # a = 0, b = 1
    config = ClassicalConfig(n_src, n_tgt, ibm1_iterations=1, hmm_iterations=0)
    keys, probs, _ = train_tables(lambda: [list(zip(source, target))], n_src, n_tgt,
                                  config)["fwd"]
    table = dict(zip(keys.tolist(), probs.tolist()))
    x, y, e, a, b = 0, 1, n_src, 0, 1
    assert table[x * n_tgt + a] == pytest.approx(5 / 7)
    assert table[x * n_tgt + b] == pytest.approx(2 / 7)
    assert table[e * n_tgt + a] == pytest.approx(5 / 7)
    assert table[y * n_tgt + a] == pytest.approx(1 / 2)
    assert len(table) == 6


def test_agreement_counts_the_product_of_both_directions_posteriors():
    """One HMM iteration in agreement equals its M-step computed line by line: the lexicon of
    each direction from the product of the two directions' posteriors (the empty word taking
    each observed word's mass left over), from the tables of the IBM-1 iterations before."""
    source, target, _ = _synthetic(30, seed=1, vocabulary=8)
    src, n_src = _ids(source)
    tgt, n_tgt = _ids(target)
    lines = list(zip(src, tgt))
    config = ClassicalConfig(n_src, n_tgt, ibm1_iterations=2, hmm_iterations=0)
    start = train_tables(lambda: [lines], n_src, n_tgt, config)
    after = train_tables(lambda: [lines], n_src, n_tgt,
                         ClassicalConfig(n_src, n_tgt, ibm1_iterations=2, hmm_iterations=1))
    sizes = {"fwd": (n_src, n_tgt), "rev": (n_tgt, n_src)}
    lexicons = {d: Lexicon(start[d][0], start[d][1], *sizes[d], 1e-7) for d in start}
    soft = posteriors(lines, lexicons, {d: start[d][2] for d in start}, config)
    for direction, (n_given, n_observed) in sizes.items():
        counts = {}
        for (s, t), fwd, rev in zip(lines, soft["fwd"], soft["rev"]):
            both = fwd * rev                    # (source, target): fwd's and rev's posterior
            if direction == "rev":              # rev: given the target, observing the source
                both, s, t = both.T, t, s       # (given, observed) from here on
            for gi, g in enumerate(s):
                for oi, o in enumerate(t):
                    key = g * n_observed + o
                    counts[key] = counts.get(key, 0.0) + both[gi, oi]
            for oi, o in enumerate(t):          # the empty word: each word's mass left over
                key = n_given * n_observed + o
                counts[key] = counts.get(key, 0.0) + max(0.0, 1.0 - both[:, oi].sum())
        totals = {}
        for key, value in counts.items():
            totals[key // n_observed] = totals.get(key // n_observed, 0.0) + value
        keys, probs, _ = after[direction]
        table = dict(zip(keys.tolist(), probs.tolist()))
        assert set(table) == set(counts)
        for key, value in counts.items():
            assert table[key] == pytest.approx(value / totals[key // n_observed], abs=1e-5)


def test_blocks_give_the_tables_of_one_block(tmp_path):
    """Blocks, with the lexicon positions looked up anew in every pass, kept in memory or
    kept in a file per block: the tables of the whole corpus in one block (and those kept in
    memory, the tables of positions looked up anew, exactly)."""
    source, target, _ = _synthetic(120, seed=2)
    src, n_src = _ids(source)
    tgt, n_tgt = _ids(target)
    lines = list(zip(src, tgt))
    config = ClassicalConfig(n_src, n_tgt, ibm1_iterations=2, hmm_iterations=2)
    whole = train_tables(lambda: [lines], n_src, n_tgt, config)

    reads = []

    def blocks():
        reads.append(1)
        return [lines[k:k + 25] for k in range(0, 120, 25)]

    variants = [train_tables(blocks, n_src, n_tgt, config),
                train_tables(blocks, n_src, n_tgt, config, keep_batches=True)]
    reads.clear()
    variants.append(train_tables(blocks, n_src, n_tgt, config, positions_dir=str(tmp_path)))
    assert sorted(os.listdir(tmp_path)) == [f"block{n}.npy" for n in range(5)]
    # the files hold the real cells' positions only: I·(J + 1) of fwd and J·(I + 1) of rev
    # per line, after a header of the batch count, each batch's line count and the lengths
    stored = [np.load(tmp_path / f"block{n}.npy") for n in range(5)]
    headers = sum(1 + int(part[0]) + 2 * int(part[1:1 + int(part[0])].sum())
                  for part in stored)
    real = sum(len(t) * (len(s) + 1) + len(s) * (len(t) + 1) for s, t in lines)
    assert sum(part.size for part in stored) - headers == real
    # the lines are read for the word pairs and in the first pass only; the later passes
    # take their batches from the block files
    assert len(reads) == 2
    for parts in variants:
        for direction in whole:
            assert torch.equal(whole[direction][0], parts[direction][0])
            for a, b in zip(whole[direction][1:], parts[direction][1:]):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # the same blocks, positions looked up in every pass or kept (the real cells' only, put
    # back in place in every pass): the same tables, bit for bit
    for direction in whole:
        for anew, kept in zip(variants[0][direction], variants[1][direction]):
            assert torch.equal(anew, kept)


def test_a_batch_keeps_the_positions_of_its_real_cells_only():
    """A batch of lines of different lengths keeps each direction's lexicon positions of its
    real cells only (one per observed word by each given word and the empty word), and gives
    back the whole (B, I, J + 1) positions: those looked up, the padding entry elsewhere."""
    from aligner.training.classical import _Table, batches_of, lexicon_keys

    lines = [(np.array([0, 1, 2]), np.array([0])), (np.array([3]), np.array([1, 2, 3, 4])),
             (np.array([1, 4]), np.array([2, 0]))]
    config = ClassicalConfig(5, 5)
    keys = lexicon_keys(lambda: [lines], 5, 5, config, 1023)
    [batch] = list(batches_of(lines, 5, 5, 10 ** 6, 1023))
    for direction, (given, observed) in {"fwd": (5, 5), "rev": (5, 5)}.items():
        table = _Table(keys[direction], given, observed)
        real = batch.cells(direction)
        whole = torch.cat([batch.keys[direction], batch.empty_keys[direction][:, :, None]], -1)
        index = table.index(whole, real)
        assert int(real.sum()) == sum(len(t) * (len(s) + 1) if direction == "fwd"
                                      else len(s) * (len(t) + 1) for s, t in lines) < real.numel()
        batch.kept[direction] = torch.masked_select(index, real).int()
        back = batch.positions(direction, len(table.keys))
        assert back.dtype == torch.long and torch.equal(back, index)
        assert bool((back[~real] == len(table.keys)).all())
        assert bool((back[real] < len(table.keys)).all())   # every real cell's key is there


def _train_in_a_group(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """One rank of the gloo test: train on the synthetic corpus in 5 blocks, rank 0 saves
    the tables."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        source, target, _ = _synthetic(120, seed=2)
        src, n_src = _ids(source)
        tgt, n_tgt = _ids(target)
        lines = list(zip(src, tgt))
        config = ClassicalConfig(n_src, n_tgt, ibm1_iterations=2, hmm_iterations=2)
        tables = train_tables(lambda: [lines[k:k + 25] for k in range(0, 120, 25)], n_src,
                              n_tgt, config)
        if rank == 0:
            torch.save(tables, os.path.join(out_dir, "tables.pt"))
    finally:
        dist.destroy_process_group()


def test_two_processes_train_the_tables_of_one(tmp_path):
    """Under a gloo group of 2, each rank takes every other block and the counts are summed
    (all_reduce): the tables of one process, within float tolerance."""
    import torch.multiprocessing as mp

    mp.spawn(_train_in_a_group, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    shared = torch.load(tmp_path / "tables.pt")
    source, target, _ = _synthetic(120, seed=2)
    src, n_src = _ids(source)
    tgt, n_tgt = _ids(target)
    config = ClassicalConfig(n_src, n_tgt, ibm1_iterations=2, hmm_iterations=2)
    alone = train_tables(lambda: [list(zip(src, tgt))], n_src, n_tgt, config)
    for direction in alone:
        assert torch.equal(alone[direction][0], shared[direction][0])
        for a, b in zip(alone[direction][1:], shared[direction][1:]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_an_unseen_pair_gets_the_floor():
    lexicon = Lexicon(torch.tensor([3, 7, 12]), torch.tensor([0.5, 0.25, 0.125]), 3, 4, 1e-7)
    found = lexicon.lookup(torch.tensor([[7, 8], [12, 0]]))
    torch.testing.assert_close(found, torch.tensor([[0.25, 1e-7], [0.125, 1e-7]]))
    assert float(Lexicon(torch.zeros(0, dtype=torch.long), torch.zeros(0), 3, 4,
                         0.5).lookup(torch.tensor([1]))) == 0.5


@pytest.mark.parametrize("chunk", [0, 1, 7, 1000])
def test_the_key_index_finds_every_key_and_nothing_else(chunk):
    """KeyIndex against a dictionary: 1,000 random keys placed `chunk` at a time (0: the
    default) in a table of 2,048 slots, with keys made to share their home slots; every key is
    found at its position, whatever the chunks, and keys not there are -1."""
    generator = torch.Generator().manual_seed(3)
    keys = torch.randperm(50_000, generator=generator)[:1000].long().sort().values
    keys[::10] = keys[::10] // 4096 * 4096 + 4096 * torch.arange(100)   # crowded homes
    keys = keys.unique()
    index = KeyIndex(keys, chunk=chunk)
    assert index.mask + 1 == 2048 and int((index.slots >= 0).sum()) == len(keys)
    position = {int(key): k for k, key in enumerate(keys)}
    queries = torch.cat([keys.flip(0), torch.arange(-5, 60_000, 7)])
    queries = queries[:len(queries) // 2 * 2].reshape(2, -1)   # any shape
    expected = torch.tensor([position.get(int(q), -1) for q in queries.reshape(-1)])
    assert torch.equal(index.find(queries), expected.reshape(queries.shape))


def test_align_train_and_extract_with_model_classical(tmp_path):
    """`align train --model classical` writes a model directory whose `align extract` aligns
    new text: the synthetic links found, a line of unknown words given an output line, one
    direction with --direction fwd, link probabilities, and the same links streamed from a
    pipe (-i -)."""
    source, target, gold = _synthetic(400, seed=3)
    src = _write(tmp_path / "train.src", source)
    tgt = _write(tmp_path / "train.tgt", target)
    model = str(tmp_path / "model")
    done = subprocess.run([*ALIGN, "train", "--model", "classical", "-s", src, "-t", tgt, "-o",
                           model, "-q"], env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    new_source, new_target, new_gold = _synthetic(20, seed=4)
    new_source.append("q1 q2 q3")                    # unknown on both sides
    new_target.append("r1 r2")
    new_src = _write(tmp_path / "new.src", new_source)
    new_tgt = _write(tmp_path / "new.tgt", new_target)
    out = tmp_path / "new.align"
    done = subprocess.run([*ALIGN, "extract", model, "-s", new_src, "-t", new_tgt, "-o",
                           str(out), "--link-probs", str(tmp_path / "probs"), "-q"],
                          env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 21
    links = [{tuple(map(int, link.split("-"))) for link in line.split()} for line in lines]
    found = sum(len(a & g) for a, g in zip(links, new_gold))
    assert found / sum(map(len, links[:20])) > 0.9 and found / sum(map(len, new_gold)) > 0.9
    assert all(s < 3 and t < 2 for s, t in links[20])  # in range, whatever the jumps make of it
    probs = (tmp_path / "probs").read_text().splitlines()
    assert [len(p.split()) for p in probs] == [len(line) for line in links]
    fwd = tmp_path / "fwd.align"
    done = subprocess.run([*ALIGN, "extract", model, "-s", new_src, "-t", new_tgt, "-o",
                           str(fwd), "--direction", "fwd", "-q"], env=ENV, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert len(fwd.read_text().splitlines()) == 21
    joint = "".join(f"{s} ||| {t}\n" for s, t in zip(new_source, new_target))
    done = subprocess.run([*ALIGN, "extract", model, "-i", "-", "-q"], input=joint, env=ENV,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == lines
    # a line's posteriors do not depend on its batch: batches of one line (8 positions) give
    # the bytes of the default's one batch of every line (ClassicalHMM.CPU_MAX_TOKENS)
    done = subprocess.run([*ALIGN, "extract", model, "-s", new_src, "-t", new_tgt, "-o",
                           str(tmp_path / "small.align"), "--link-probs",
                           str(tmp_path / "small.probs"), "--max-tokens", "8", "-q"],
                          env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "small.align").read_text() == out.read_text()
    assert (tmp_path / "small.probs").read_text() == (tmp_path / "probs").read_text()


def test_the_classical_aligner_takes_larger_batches_on_a_cpu():
    """With no --max-tokens a CPU batch holds ClassicalHMM.CPU_MAX_TOKENS positions (a few
    operations per step on the whole batch: dispatch, not arithmetic) and a network's
    inference.CPU_MAX_TOKENS (its (B, I, J+1, J) tensors stay in cache); a GPU's are alike."""
    from aligner.extract import inference
    from aligner.models.classical import ClassicalHMM
    from aligner.models.direct_hmm import DirectHMMConfig, FirstOrderHMM

    classical = ClassicalHMM(ClassicalConfig(src_vocab_size=10, tgt_vocab_size=10))
    network = FirstOrderHMM(DirectHMMConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=8,
                                            n_heads=2, enc_layers=1, dec_layers=1, d_ff=8))
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert inference.default_max_tokens(cpu, classical) == ClassicalHMM.CPU_MAX_TOKENS == 8000
    assert inference.default_max_tokens(cpu, network) == inference.CPU_MAX_TOKENS == 500
    assert inference.default_max_tokens(cpu) == inference.CPU_MAX_TOKENS
    assert (inference.default_max_tokens(gpu, classical)
            == inference.default_max_tokens(gpu, network) == inference.DEFAULT_MAX_TOKENS)


def test_align_run_with_model_classical(tmp_path):
    source, target, gold = _synthetic(300, seed=5)
    src = _write(tmp_path / "c.src", source)
    tgt = _write(tmp_path / "c.tgt", target)
    out = tmp_path / "c.align"
    done = subprocess.run([*ALIGN, "run", "--model", "classical", "-s", src, "-t", tgt, "-o",
                           str(out), "--model-dir", str(tmp_path / "m"), "-q"], env=ENV,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    links = [{tuple(map(int, link.split("-"))) for link in line.split()}
             for line in out.read_text().splitlines()]
    assert len(links) == 300
    # the boundaries are written into config.json (a directory without the key has none)
    recorded = json.loads((tmp_path / "m" / "config.json").read_text())["models"]
    assert recorded["fwd"]["boundaries"] is True and recorded["rev"]["boundaries"] is True
    found = sum(len(a & g) for a, g in zip(links, gold))
    # a swap of a line's first or last two words costs a jump from its start or to its end
    # (ClassicalConfig.boundaries), so some are missed: over corpus seeds 0-5 (empty_prob
    # 0.1), precision 0.994-0.998, recall 0.948-0.990 (seed 5: 0.994 / 0.950)
    assert found / sum(map(len, links)) > 0.95 and found / sum(map(len, gold)) > 0.90
    # --resume of the finished run: nothing to train (EM keeps no training state), same bytes
    again = tmp_path / "again.align"
    done = subprocess.run([*ALIGN, "run", "--model", "classical", "-s", src, "-t", tgt, "-o",
                           str(again), "--model-dir", str(tmp_path / "m"), "--resume", "-q"],
                          env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert again.read_bytes() == out.read_bytes()
    refused = subprocess.run([*ALIGN, "run", "--model", "classical", "--rounds", "2", "-s",
                              src, "-t", tgt, "-o", str(tmp_path / "x")], env=ENV,
                             capture_output=True, text=True)
    assert refused.returncode != 0
    assert refused.stderr.count("\n") == 1 and "--rounds 2" in refused.stderr


def test_model_classical_lowercases_its_words_by_default(tmp_path):
    """`align run --model classical` lowercases both sides' words by default
    (recipe.CLASSICAL_LOWERCASE): on a bitext whose words come in two cases it writes the bytes
    that --no-lowercase writes on the same text lowercased, and its model directory aligns the
    cased text as the run did; --no-lowercase keeps the cases apart (other links)."""
    import random

    source, target, _ = _synthetic(300, seed=6)
    rng = random.Random(7)
    cased = [" ".join(w.upper() if rng.random() < 0.4 else w for w in line.split())
             for line in source]
    assert cased != source and [line.lower() for line in cased] == source
    paths = {"cased": _write(tmp_path / "cased.src", cased),
             "lower": _write(tmp_path / "lower.src", source)}
    tgt = _write(tmp_path / "c.tgt", target)

    def run(name, src, *flags):
        out = tmp_path / f"{name}.align"
        done = subprocess.run([*ALIGN, "run", "--model", "classical", "-s", src, "-t", tgt,
                               "-o", str(out), "--model-dir", str(tmp_path / name), "-q",
                               *flags], env=ENV, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        prep = json.loads((tmp_path / name / "prep.json").read_text())
        return out.read_bytes(), prep["lowercase"]

    default, lowercased = run("default", paths["cased"])
    assert lowercased
    assert run("lower", paths["lower"], "--no-lowercase") == (default, False)
    kept, lowercased = run("kept", paths["cased"], "--no-lowercase")
    assert not lowercased and kept != default
    again = tmp_path / "again.align"
    done = subprocess.run([*ALIGN, "extract", str(tmp_path / "default"), "-s", paths["cased"],
                           "-t", tgt, "-o", str(again), "-q"], env=ENV, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert again.read_bytes() == default


def test_network_options_are_refused_for_model_classical(tmp_path):
    """A network's setting given with --model classical is refused in one line (their
    defaults do not apply to it); its own settings pass through -M."""
    src = _write(tmp_path / "c.src", ["a b", "b c"])
    tgt = _write(tmp_path / "c.tgt", ["x y", "y z"])
    refused = subprocess.run([*ALIGN, "train", "--model", "classical", "--d-model", "64", "-s",
                              src, "-t", tgt, "-o", str(tmp_path / "m")], env=ENV,
                             capture_output=True, text=True)
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1
    assert "d_model" in refused.stderr and not (tmp_path / "m").exists()
    done = subprocess.run([*ALIGN, "train", "--model", "classical", "-M", "hmm_iterations=1",
                           "-s", src, "-t", tgt, "-o", str(tmp_path / "m"), "-q"], env=ENV,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    import json

    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["model_kind"] == "classical"
    assert config["models"]["fwd"]["hmm_iterations"] == 1
