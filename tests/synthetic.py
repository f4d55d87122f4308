"""Seeded synthetic parallel corpora with known alignments, for training tests.

A "monotone dictionary" corpus: source word ``s<k>`` always translates to target word ``t<k>``
and the target sentence is the word-by-word translation, so the gold alignment is the
diagonal ``i-i``. Optional ``swap_rate`` swaps adjacent target words (gold follows the swap).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import List, Set, Tuple

Link = Tuple[int, int]


def monotone_corpus(n_pairs: int, vocab: int = 12, min_len: int = 2, max_len: int = 6,
                    seed: int = 0, swap_rate: float = 0.0
                    ) -> Tuple[List[List[str]], List[List[str]], List[Set[Link]]]:
    """(source sentences, target sentences, gold links) of `n_pairs` synthetic pairs."""
    rng = random.Random(seed)
    sources, targets, golds = [], [], []
    for _ in range(n_pairs):
        length = rng.randint(min_len, max_len)
        words = [rng.randrange(vocab) for _ in range(length)]
        order = list(range(length))
        for i in range(length - 1):
            if rng.random() < swap_rate and order[i] == i and order[i + 1] == i + 1:
                order[i], order[i + 1] = order[i + 1], order[i]
        sources.append([f"s{w}" for w in words])
        targets.append([f"t{words[order[j]]}" for j in range(length)])
        golds.append({(order[j], j) for j in range(length)})
    return sources, targets, golds


def one_swap_corpus(lines: int, seed: int, vocabulary: int = 40
                    ) -> Tuple[List[str], List[str], List[Set[Link]]]:
    """(source lines, target lines, each line's true links): source words sK and target words
    tK in the same order, an adjacent pair swapped in about half the lines (3-9 words)."""
    rng = random.Random(seed)
    source, target, gold = [], [], []
    for _ in range(lines):
        words = [rng.randrange(vocabulary) for _ in range(rng.randint(3, 9))]
        order = list(range(len(words)))
        if rng.random() < 0.5:
            k = rng.randrange(len(words) - 1)
            order[k], order[k + 1] = order[k + 1], order[k]
        source.append(" ".join(f"s{w}" for w in words))
        target.append(" ".join(f"t{words[k]}" for k in order))
        gold.append({(k, j) for j, k in enumerate(order)})
    return source, target, gold


def write_lines(path: Path, lines: List[str]) -> str:
    """Write `lines` to `path`, one per line (UTF-8); returns the path as a string."""
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def write_corpus(directory: Path, name: str, sources: List[List[str]], targets: List[List[str]],
                 golds: List[Set[Link]] = None) -> Tuple[Path, Path, Path]:
    """Write NAME.src / NAME.tgt (and NAME.talp with golds) into `directory`."""
    src, tgt, gold = (directory / f"{name}.src", directory / f"{name}.tgt",
                      directory / f"{name}.talp")
    src.write_text("".join(" ".join(s) + "\n" for s in sources), encoding="utf-8")
    tgt.write_text("".join(" ".join(t) + "\n" for t in targets), encoding="utf-8")
    if golds is not None:
        gold.write_text("".join(" ".join(f"{i}-{j}" for i, j in sorted(g)) + "\n"
                                for g in golds), encoding="utf-8")
    return src, tgt, gold
