"""Symmetrization on hand-drawn grids, invariants on random grids, and fast_align's atools output.

Grids: row i = source word, column j = target word. In an input grid ``F`` marks a forward-only
link, ``R`` a reverse-only link, ``B`` a link in both, ``.`` nothing. In an expected grid ``x``
marks a link of the result. Every expected grid was worked out by hand from the rules in
aligner/links/symmetrize.py (the reasoning is in the comments).
"""
from __future__ import annotations

import random

import pytest

from aligner.formats import read_pharaoh
from aligner.links.symmetrize import HEURISTICS, symmetrize, symmetrize_corpus
from aligner.utils import AlignerError


def parse_input(drawing: str):
    """(forward, reverse) link sets from a grid of F/R/B/. characters."""
    forward, reverse = set(), set()
    for i, row in enumerate(drawing.split()):
        for j, cell in enumerate(row):
            assert cell in "FRB.", cell
            if cell in "FB":
                forward.add((i, j))
            if cell in "RB":
                reverse.add((i, j))
    return forward, reverse


def parse_result(drawing: str):
    """Link set from a grid of x/. characters."""
    return {(i, j) for i, row in enumerate(drawing.split()) for j, cell in enumerate(row)
            if cell == "x"}


# G1. Intersection {0-0}; candidates in ascending order 0-1, 1-0, 1-1.
#   0-1: target 1 unaligned, touches 0-0 -> added.  1-0: source 1 unaligned -> added.
#   1-1: both words now aligned -> rejected (added links count at once, within the pass;
#   visiting 1-1 first, or checking against the alignment at the start of the pass, would
#   add 1-1 instead or as well). The final steps find 1-1 with both words aligned.
G1 = ("""
BF
RF
""", {
    "intersect": "x. ..",
    "union": "xx xx",
    "grow-diag": "xx x.",
    "grow-diag-final": "xx x.",
    "grow-diag-final-and": "xx x.",
})

# G2. Intersection {0-0, 1-1}; no other link touches it, so grow-diag adds nothing.
#   final: forward 2-4 (both unaligned) and 3-0 (source 3 unaligned), reverse 4-3.
#   final-and: 3-0 is refused because target 0 is aligned.
G2 = ("""
B....
.B...
....F
F....
...R.
""", {
    "intersect": "x.... .x... ..... ..... .....",
    "union": "x.... .x... ....x x.... ...x.",
    "grow-diag": "x.... .x... ..... ..... .....",
    "grow-diag-final": "x.... .x... ....x x.... ...x.",
    "grow-diag-final-and": "x.... .x... ....x ..... ...x.",
})

# G3. Growth over several passes. Intersection {3-3}. Pass 1 (order 0-3, 1-1, 2-2):
#   0-3 touches nothing, 1-1 touches nothing yet, 2-2 touches 3-3 -> added.
#   Pass 2: 1-1 now touches 2-2 -> added; 0-3 still touches nothing. Pass 3 adds nothing.
#   final: reverse 0-3 has source 0 unaligned -> added; final-and: target 3 aligned -> no.
G3 = ("""
...R
.F..
..R.
...B
""", {
    "intersect": ".... .... .... ...x",
    "union": "...x .x.. ..x. ...x",
    "grow-diag": ".... .x.. ..x. ...x",
    "grow-diag-final": "...x .x.. ..x. ...x",
    "grow-diag-final-and": ".... .x.. ..x. ...x",
})

# G4. Empty intersection: nothing to grow from. The forward pass comes before the reverse
#   pass: final-and takes forward 0-0, then reverse 0-1 finds source 0 aligned.
G4 = ("""
FR
..
""", {
    "intersect": ".. ..",
    "union": "xx ..",
    "grow-diag": ".. ..",
    "grow-diag-final": "xx ..",
    "grow-diag-final-and": "x. ..",
})

# G5. Links whose two words are both aligned are never added. Intersection {0-0, 2-2}.
#   0-2: source 0 and target 2 aligned -> rejected. 1-1: both unaligned, touches 0-0
#   diagonally -> added. 2-0: both words aligned -> rejected. The final steps meet 2-0
#   (forward) and 0-2 (reverse) with both words aligned and add nothing.
G5 = ("""
B.R
.F.
F.B
""", {
    "intersect": "x.. ... ..x",
    "union": "x.x .x. x.x",
    "grow-diag": "x.. .x. ..x",
    "grow-diag-final": "x.. .x. ..x",
    "grow-diag-final-and": "x.. .x. ..x",
})

# G6. Order inside one direction: the forward pass visits 0-0 before 0-1, so final-and takes
#   0-0 and then refuses 0-1 (source 0 aligned); final takes both (target 1 is unaligned).
G6 = ("""
FF
..
""", {
    "intersect": ".. ..",
    "union": "xx ..",
    "grow-diag": ".. ..",
    "grow-diag-final": "xx ..",
    "grow-diag-final-and": "x. ..",
})

GRIDS = {"G1": G1, "G2": G2, "G3": G3, "G4": G4, "G5": G5, "G6": G6}


@pytest.mark.parametrize("grid", sorted(GRIDS))
@pytest.mark.parametrize("heuristic", sorted(HEURISTICS))
def test_hand_drawn_grids(grid, heuristic):
    drawing, expected = GRIDS[grid]
    forward, reverse = parse_input(drawing)
    assert symmetrize(forward, reverse, heuristic) == parse_result(expected[heuristic])


def test_every_heuristic_is_distinguished_by_some_grid():
    results = {h: [symmetrize(*parse_input(g[0]), h) for g in GRIDS.values()]
               for h in HEURISTICS}
    names = sorted(HEURISTICS)
    for a in names:
        for b in names:
            if a < b:
                assert results[a] != results[b], (a, b)


def test_identical_directions_are_returned_unchanged():
    rng = random.Random(3)
    for _ in range(50):
        links = {(rng.randrange(6), rng.randrange(6)) for _ in range(rng.randrange(10))}
        for heuristic in HEURISTICS:
            assert symmetrize(links, set(links), heuristic) == links


def random_pair(rng: random.Random):
    size_i, size_j = rng.randint(1, 7), rng.randint(1, 7)
    density = rng.random() * 0.5
    cells = [(i, j) for i in range(size_i) for j in range(size_j)]
    return ({c for c in cells if rng.random() < density},
            {c for c in cells if rng.random() < density})


def test_invariants_on_random_grids():
    """intersect ⊆ grow-diag ⊆ gdfa, gdf ⊆ union, and what each growth step may add.

    (gdfa ⊆ gdf does not hold: a link that gdf adds early can block a later one that gdfa adds.)
    """
    rng = random.Random(7)
    for _ in range(300):
        forward, reverse = random_pair(rng)
        inter, uni = forward & reverse, forward | reverse
        gd = symmetrize(forward, reverse, "grow-diag")
        gdfa = symmetrize(forward, reverse, "grow-diag-final-and")
        gdf = symmetrize(forward, reverse, "grow-diag-final")
        assert symmetrize(forward, reverse, "intersect") == inter
        assert symmetrize(forward, reverse, "union") == uni
        assert inter <= gd <= gdfa <= uni and gd <= gdf <= uni
        # every grown link has a neighbour in grow-diag (it touched the alignment when added)
        for i, j in gd - inter:
            assert any((i + di, j + dj) in gd for di in (-1, 0, 1) for dj in (-1, 0, 1)
                       if (di, dj) != (0, 0))
        # grow-diag is saturated: a union link left out has both words aligned or no neighbour
        src = {i for i, _ in gd}
        tgt = {j for _, j in gd}
        for i, j in uni - gd:
            touches = any((i + di, j + dj) in gd for di in (-1, 0, 1) for dj in (-1, 0, 1)
                          if (di, dj) != (0, 0))
            assert (i in src and j in tgt) or not touches
        # final-and adds links whose two words were unaligned: no two added links share a word
        added = sorted(gdfa - gd)
        assert len({i for i, _ in added}) == len(added) == len({j for _, j in added})
        assert all(i not in src and j not in tgt for i, j in added)
        # after grow-diag-final, both words of every directional link are aligned
        final_src, final_tgt = {i for i, _ in gdf}, {j for _, j in gdf}
        assert all(i in final_src and j in final_tgt for i, j in uni)


def test_unknown_heuristic():
    with pytest.raises(AlignerError, match="unknown symmetrization heuristic 'grow'"):
        symmetrize(set(), set(), "grow")


def test_corpus_lengths_must_match():
    assert symmetrize_corpus([{(0, 0)}, set()], [{(0, 0)}, {(1, 1)}], "union") == \
        [{(0, 0)}, {(1, 1)}]
    with pytest.raises(AlignerError, match="differ in length"):
        symmetrize_corpus([set()], [set(), set()], "union")


@pytest.mark.parametrize("system", ["giza", "fastalign"])
@pytest.mark.parametrize("heuristic", sorted(HEURISTICS))
def test_matches_fast_align_atools(shared_data, system, heuristic):
    """Line for line (as link sets) what `atools -c HEURISTIC` printed for real 508-line files."""
    reference = shared_data / "reference"
    forward = read_pharaoh(str(reference / f"{system}.deen.talp"))
    reverse = read_pharaoh(str(reference / f"{system}.deen.reverse.talp"), reverse=True)
    assert reverse == read_pharaoh(str(reference / "atools" /
                                       f"{system}.deen.reverse.src-tgt.talp"))
    expected = read_pharaoh(str(reference / "atools" / f"{system}.deen.{heuristic}.talp"))
    result = symmetrize_corpus(forward, reverse, heuristic)
    assert len(result) == len(expected) == 508
    mismatches = [k + 1 for k, (a, b) in enumerate(zip(result, expected)) if a != b]
    assert mismatches == []


def grid_reference(forward, reverse, heuristic):
    """The heuristics written a second way, on boolean matrices scanned row by row.

    Independent of aligner.links.symmetrize's set-based code (no shared helpers): a full scan of the
    (I, J) grid in row-major order per pass, which is ascending (i, j) order.
    """
    links = forward | reverse
    size_i = 1 + max((i for i, _ in links), default=-1)
    size_j = 1 + max((j for _, j in links), default=-1)
    fwd = [[(i, j) in forward for j in range(size_j)] for i in range(size_i)]
    rev = [[(i, j) in reverse for j in range(size_j)] for i in range(size_i)]
    out = [[fwd[i][j] and rev[i][j] for j in range(size_j)] for i in range(size_i)]
    if heuristic == "union":
        out = [[fwd[i][j] or rev[i][j] for j in range(size_j)] for i in range(size_i)]
    row_aligned = [any(out[i]) for i in range(size_i)]
    col_aligned = [any(out[i][j] for i in range(size_i)) for j in range(size_j)]

    def cell(i, j):
        return 0 <= i < size_i and 0 <= j < size_j and out[i][j]

    def align(i, j):
        out[i][j] = row_aligned[i] = col_aligned[j] = True

    if heuristic.startswith("grow-diag"):
        pending = [[(fwd[i][j] or rev[i][j]) and not out[i][j] for j in range(size_j)]
                   for i in range(size_i)]
        changed = True
        while changed:
            changed = False
            for i in range(size_i):
                for j in range(size_j):
                    if pending[i][j] and not (row_aligned[i] and col_aligned[j]) and any(
                            cell(i + di, j + dj) for di in (-1, 0, 1) for dj in (-1, 0, 1)):
                        align(i, j)
                        pending[i][j] = False
                        changed = True
    if heuristic in ("grow-diag-final", "grow-diag-final-and"):
        for matrix in (fwd, rev):
            for i in range(size_i):
                for j in range(size_j):
                    if not matrix[i][j] or out[i][j]:
                        continue
                    if heuristic == "grow-diag-final":
                        ok = not (row_aligned[i] and col_aligned[j])
                    else:
                        ok = not row_aligned[i] and not col_aligned[j]
                    if ok:
                        align(i, j)
    return {(i, j) for i in range(size_i) for j in range(size_j) if out[i][j]}


def test_agrees_with_a_grid_formulation_on_random_grids():
    rng = random.Random(5)
    for _ in range(400):
        forward, reverse = random_pair(rng)
        for heuristic in HEURISTICS:
            assert symmetrize(forward, reverse, heuristic) == \
                grid_reference(forward, reverse, heuristic), (forward, reverse, heuristic)
