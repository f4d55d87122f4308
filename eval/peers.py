"""Peer word aligners for the side-by-side benchmark (eval/compare_aligners.py).

Peers are optional dependencies of the benchmark only (``pip install -r
eval/requirements-peers.txt``); the ``aligner`` package never imports this file.

Every peer is described by the commands that train it and write two Pharaoh files, ``fwd``
(model p(target | source)) and ``rev`` (model p(source | target)), BOTH in source–target
orientation. The benchmark runs each command in its own child process to measure wall time
and peak memory, then symmetrizes and scores the two files with the project's own library.

* ``eflomal`` (PyPI ``eflomal``): ``eflomal-align -s SRC -t TGT -f FWD -r REV`` with its own
  defaults (IBM1+HMM+fertility, 3 samplers, no priors), as a user runs it. Both output files
  are in source–target order (eflomal README).
* ``fast_align-binary``: a ``fast_align`` binary on PATH (github.com/clab/fast_align, built by
  the user): ``fast_align -i JOINT -d -o -v`` and the same with ``-r`` (the settings its README
  recommends); it prints source–target links in both directions.
* ``fast_align-systran``: PyPI ``systran-align``. Plain ``fast_align`` means the binary when
  one is on PATH, this package otherwise (there is no fast_align binary on PyPI). The package
  trains fast_align in both directions (``generate_alignment_probabilities``) but its aligner
  returns only its own grow-diag-final-and symmetrization. To get the two directions, this
  module reads the two lexical tables it writes and applies fast_align's decision rule (see
  :func:`fast_align_viterbi`). Settings: ``favor_diagonal=True, variational_bayes=True``
  (fast_align ``-d -v``), diagonal tension fixed at fast_align's default 4 (``-o`` is not used
  because the package's aligner always decodes with tension 4 and does not store an optimized
  one), ``p0 = 0.08``, 5 iterations. :func:`check_systran_agreement` re-derives the package's
  grow-diag-final-and output from the decoded directions; the benchmark records the agreement.

Run as a script, this module is the child process of the systran-align peer::

    python eval/peers.py systran-fast-align --input CORPUS.joint --first-line K \\
        --forward FWD --reverse REV --workdir DIR
"""
from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import shutil
import struct
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

Link = Tuple[int, int]
# Lexical table t(e | f) as written by systran-align: {f_id: {e_id: probability}}.
LexTable = Dict[int, Dict[int, float]]

# fast_align constants (src/fast_align.cc, src/ttables.h, src/da.h).
FAST_ALIGN_TENSION = 4.0      # default --diagonal_tension
FAST_ALIGN_P0 = 0.08          # default --prob_align_null
FAST_ALIGN_FLOOR = 1e-9       # TTable::prob of an unseen (f, e) pair
NULL_ID = 1                   # id of "<eps>" (fast_align's Dict numbers words from 1)
SYSTRAN_TABLE_VERSION = 2     # first uint32 of systran-align's probability files

# Peers run by default; "fast_align" is the binary when one is on PATH, else systran-align.
PEER_NAMES = ("eflomal", "fast_align")
# Every accepted name: the two fast_align builds can also be asked for by name (both in one
# table, to compare them).
ALL_PEERS = PEER_NAMES + ("fast_align-binary", "fast_align-systran")
# Written by the systran-align peer: the package's own grow-diag-final-and links of the
# decoded lines, and "AGREE TOTAL" (see check_systran_agreement).
PACKAGE_GDFA = "package.gdfa.txt"
AGREEMENT = "agreement.txt"
PEERS_HINT = "pip install -r eval/requirements-peers.txt"


@dataclass
class Step:
    """One command of a system, run in a child process by the benchmark.

    ``argv`` is run with ``stdout`` redirected to the file ``stdout`` when given (fast_align
    prints its links on stdout), otherwise to the step's log file.
    """

    name: str
    argv: List[str]
    stdout: Optional[str] = None


@dataclass
class PeerRun:
    """What the benchmark runs for one peer and where the two directions end up.

    ``first_line`` is the 0-based corpus line of the first line in ``forward``/``reverse``
    (0 when the files cover the whole corpus). ``notes`` go under the results table.
    """

    label: str
    version: str
    settings: str
    steps: List[Step]
    forward: str
    reverse: str
    first_line: int = 0
    notes: List[str] = field(default_factory=list)
    # Further table columns the system writes itself, already symmetrized: column name ->
    # Pharaoh file starting at corpus line ``first_line`` (e.g. align's soft-average).
    symmetrized: Dict[str, str] = field(default_factory=dict)


def _package_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def eflomal_available() -> Optional[str]:
    """None when eflomal can run here, else the reason it cannot."""
    if _package_version("eflomal") is None or shutil.which("eflomal-align") is None:
        return f"eflomal is not installed ({PEERS_HINT})"
    return None


def fast_align_backend() -> Optional[str]:
    """"binary" (``fast_align`` on PATH), "systran-align" (PyPI package) or None."""
    if shutil.which("fast_align") is not None:
        return "binary"
    if _package_version("systran-align") is not None:
        return "systran-align"
    return None


def _fast_align_build(peer: str) -> Optional[str]:
    """The fast_align build a peer name stands for: "binary", "systran-align" or None."""
    if peer == "fast_align-binary":
        return "binary" if shutil.which("fast_align") else None
    if peer == "fast_align-systran":
        return "systran-align" if _package_version("systran-align") else None
    return fast_align_backend()


def unavailable_reason(peer: str) -> Optional[str]:
    """None when ``peer`` (one of ALL_PEERS) can run here, else why not."""
    if peer == "eflomal":
        return eflomal_available()
    if peer not in ALL_PEERS:
        raise ValueError(f"unknown peer {peer!r}")
    if _fast_align_build(peer) is None:
        return {"fast_align": "neither a fast_align binary on PATH nor the systran-align "
                              f"package is installed ({PEERS_HINT})",
                "fast_align-binary": "no fast_align binary on PATH (build "
                                     "github.com/clab/fast_align)",
                "fast_align-systran": f"systran-align is not installed ({PEERS_HINT})"}[peer]
    return None


def plan_peer(peer: str, source: str, target: str, joint: str, first_gold_line: int,
              workdir: str, extra_args: Sequence[str] = ()) -> PeerRun:
    """The commands that align the corpus with ``peer``; outputs go under ``workdir``.

    ``source``/``target`` are the line-aligned corpus files, ``joint`` the same corpus as
    ``source ||| target`` lines, ``first_gold_line`` the 0-based line where the gold sentences
    start (the systran-align peer decodes only from there). ``extra_args`` are appended to the
    eflomal-align or fast_align command line (the systran-align peer takes none).
    """
    forward = os.path.join(workdir, "fwd.txt")
    reverse = os.path.join(workdir, "rev.txt")
    extra = list(extra_args)
    if peer == "eflomal":
        argv = ["eflomal-align", "-s", source, "-t", target, "-f", forward, "-r", reverse,
                "--overwrite", *extra]
        settings = ("eflomal-align defaults (model 3, 3 samplers, no priors)" if not extra
                    else "eflomal-align " + " ".join(extra))
        return PeerRun(label="eflomal", version=f"eflomal {_package_version('eflomal')}",
                       settings=settings, steps=[Step("align", argv)], forward=forward,
                       reverse=reverse)
    if peer in ALL_PEERS:
        backend = _fast_align_build(peer)
        if backend == "binary":
            binary = shutil.which("fast_align")
            flags = ["-d", "-o", "-v", *extra]
            return PeerRun(
                label="fast_align (binary)", version=f"binary {binary}",
                settings=" ".join(flags),
                steps=[Step("fwd", [binary, "-i", joint, *flags], stdout=forward),
                       Step("rev", [binary, "-i", joint, *flags, "-r"], stdout=reverse)],
                forward=forward, reverse=reverse)
        if backend == "systran-align":
            if extra:
                raise ValueError("fast_align options need a fast_align binary on PATH; the "
                                 "systran-align peer has fixed settings")
            argv = [sys.executable, os.path.abspath(__file__), "systran-fast-align",
                    "--input", joint, "--first-line", str(first_gold_line),
                    "--forward", forward, "--reverse", reverse, "--workdir", workdir]
            return PeerRun(
                label="fast_align (systran-align)",
                version=f"systran-align {_package_version('systran-align')}",
                settings=f"-d -v, tension {FAST_ALIGN_TENSION:g}, p0 {FAST_ALIGN_P0:g}, "
                         "5 iterations; directions decoded from its tables",
                steps=[Step("train+decode", argv)], forward=forward, reverse=reverse,
                first_line=first_gold_line)
        raise ValueError(unavailable_reason(peer))
    raise ValueError(f"unknown peer {peer!r}")


# --------------------------------------------------------------------------------------------
# systran-align: its probability files and fast_align's decision rule


def read_systran_table(path: str, given_words: Optional[Set[str]] = None
                       ) -> Tuple[Dict[str, int], LexTable]:
    """Read a probability file written by ``systran_align.generate_alignment_probabilities``.

    Layout (little-endian): uint32 version (2), uint32 vocabulary size V, V NUL-terminated
    UTF-8 words (word k of the list has fast_align id k + 1; ``<eps>`` = NULL is id 1), uint32
    number of conditioning words, then until the end of the file records of uint32 ``f``,
    uint32 ``n`` and ``n`` pairs (uint32 ``e``, float32 t(e | f)). The forward file holds
    t(target | source), the backward file t(source | target).

    With ``given_words``, only the rows of those conditioning words (and of NULL) are kept,
    which keeps memory small when only a few sentences are decoded.

    Returns (word → id, table).
    """
    with open(path, "rb") as handle:
        data = handle.read()
    version, size = struct.unpack_from("<II", data, 0)
    if version != SYSTRAN_TABLE_VERSION:
        raise ValueError(f"{path}: unknown systran-align table version {version} "
                         f"(this reader knows {SYSTRAN_TABLE_VERSION})")
    offset = 8
    vocabulary: Dict[str, int] = {}
    for word_id in range(1, size + 1):
        end = data.index(b"\x00", offset)
        vocabulary[data[offset:end].decode("utf-8")] = word_id
        offset = end + 1
    offset += 4  # number of conditioning words; the records themselves are counted below
    keep = None
    if given_words is not None:
        keep = {vocabulary[word] for word in given_words if word in vocabulary} | {NULL_ID}
    table: LexTable = {}
    while offset < len(data):
        given, count = struct.unpack_from("<II", data, offset)
        offset += 8
        if keep is None or given in keep:
            table[given] = dict(struct.iter_unpack("<If", data[offset:offset + 8 * count]))
        offset += 8 * count
    return vocabulary, table


def diagonal_prior(n_given: int, n_generated: int, tension: float = FAST_ALIGN_TENSION,
                   p0: float = FAST_ALIGN_P0) -> List[List[float]]:
    """fast_align's alignment prior p(a_j = i), as a list over generated positions j.

    Row j (0-based) holds ``n_given`` values for i = 0..n_given-1:
    (1 − p0) · h(i, j) / Σ_i' h(i', j) with h(i, j) = exp(−tension · |(i+1)/n_given −
    (j+1)/n_generated|) (DiagonalAlignment in fast_align's da.h). NULL gets p0.
    """
    prior = []
    for j in range(n_generated):
        weights = [math.exp(-tension * abs((i + 1) / n_given - (j + 1) / n_generated))
                   for i in range(n_given)]
        total = sum(weights)
        prior.append([(1.0 - p0) * weight / total for weight in weights])
    return prior


def fast_align_viterbi(given: Sequence[str], generated: Sequence[str],
                       vocabulary: Dict[str, int], table: LexTable,
                       tension: float = FAST_ALIGN_TENSION, p0: float = FAST_ALIGN_P0
                       ) -> Set[Link]:
    """fast_align's alignment of one sentence pair under a trained model p(generated | given).

    Each generated word j picks argmax over NULL and given positions i of
    prior(i, j) · t(generated_j | given_i), with prior p0 · t(e | NULL) for NULL: the rule of
    fast_align's output loop (ties go to NULL, then to the smallest i; an unseen pair has
    probability 1e-9). NULL choices make no link. Returns links ``(i, j)`` =
    (given index, generated index), 0-based.
    """
    links: Set[Link] = set()
    if not given or not generated:
        return links
    given_ids = [vocabulary.get(word, 0) for word in given]
    prior = diagonal_prior(len(given), len(generated), tension, p0)
    null_row = table.get(NULL_ID, {})
    for j, word in enumerate(generated):
        e = vocabulary.get(word, 0)
        best = p0 * null_row.get(e, FAST_ALIGN_FLOOR)
        best_i = -1
        for i, f in enumerate(given_ids):
            score = prior[j][i] * table.get(f, {}).get(e, FAST_ALIGN_FLOOR)
            if score > best:
                best, best_i = score, i
        if best_i >= 0:
            links.add((best_i, j))
    return links


def check_systran_agreement(forward_table: str, backward_table: str,
                            sources: Sequence[Sequence[str]], targets: Sequence[Sequence[str]],
                            forward: Sequence[Set[Link]], reverse: Sequence[Set[Link]]
                            ) -> Tuple[int, List[Set[Link]]]:
    """Compare grow-diag-final-and of our decoded directions with systran-align's own output.

    ``forward``/``reverse`` are source–target link sets for the sentence pairs ``sources`` /
    ``targets``. Returns (number of sentence pairs where the two agree exactly, the package's
    own links per pair). Agreement on all pairs shows the decoding reproduces its model.
    """
    import systran_align  # pylint: disable=import-outside-toplevel

    from aligner.links.symmetrize import symmetrize  # pylint: disable=import-outside-toplevel

    aligner = systran_align.Aligner(forward_table, backward_table)
    agree = 0
    package: List[Set[Link]] = []
    for index, (src, tgt) in enumerate(zip(sources, targets)):
        theirs: Set[Link] = set()
        if src and tgt:
            theirs = {(i, j) for i, j in aligner.align(list(src), list(tgt))["alignments"]}
        package.append(theirs)
        agree += symmetrize(forward[index], reverse[index], "grow-diag-final-and") == theirs
    return agree, package


def run_systran_fast_align(joint: str, first_line: int, forward_path: str, reverse_path: str,
                           workdir: str) -> Tuple[int, int]:
    """Train fast_align with systran-align on ``joint`` and decode lines ``first_line``..end.

    Writes the two directions (source–target Pharaoh, one line per decoded corpus line), the
    package's own grow-diag-final-and links of the same lines (``workdir/package.gdfa.txt``)
    and returns (sentence pairs where our grow-diag-final-and equals the package's, pairs
    decoded); see :func:`check_systran_agreement`.
    """
    import systran_align  # pylint: disable=import-outside-toplevel

    from aligner.formats import (read_lines, tokenize_line,  # pylint: disable=C0415
                                 write_pharaoh)

    forward_table = os.path.join(workdir, "fwd.probs")
    backward_table = os.path.join(workdir, "rev.probs")
    systran_align.generate_alignment_probabilities(
        joint, forward_table, backward_table, favor_diagonal=True, variational_bayes=True,
        optimize_tension=False, diagonal_tension=FAST_ALIGN_TENSION,
        prob_align_null=FAST_ALIGN_P0)
    sources, targets = [], []
    for line in read_lines(joint)[first_line:]:  # written by the benchmark: one '|||' a line
        source, target = line.split(" ||| ")
        sources.append(tokenize_line(source))
        targets.append(tokenize_line(target))
    vocab_f, table_f = read_systran_table(forward_table, {w for s in sources for w in s})
    vocab_r, table_r = read_systran_table(backward_table, {w for t in targets for w in t})
    forward = [fast_align_viterbi(src, tgt, vocab_f, table_f) for src, tgt in zip(sources, targets)]
    reverse = [{(i, j) for j, i in fast_align_viterbi(tgt, src, vocab_r, table_r)}
               for src, tgt in zip(sources, targets)]
    write_pharaoh(forward_path, forward)
    write_pharaoh(reverse_path, reverse)
    agree, package = check_systran_agreement(forward_table, backward_table, sources, targets,
                                             forward, reverse)
    write_pharaoh(os.path.join(workdir, PACKAGE_GDFA), package)
    return agree, len(sources)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Child-process entry point of the systran-align peer (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    systran = sub.add_parser("systran-fast-align", help="train and decode fast_align "
                                                        "with the systran-align package")
    systran.add_argument("--input", required=True, help="corpus as 'source ||| target' lines")
    systran.add_argument("--first-line", type=int, default=0,
                         help="0-based first corpus line to decode (the gold sentences)")
    systran.add_argument("--forward", required=True, help="output: forward links")
    systran.add_argument("--reverse", required=True, help="output: reverse links")
    systran.add_argument("--workdir", required=True, help="folder for the probability tables")
    args = parser.parse_args(argv)
    agree, total = run_systran_fast_align(args.input, args.first_line, args.forward,
                                          args.reverse, args.workdir)
    with open(os.path.join(args.workdir, AGREEMENT), "w", encoding="utf-8") as handle:
        handle.write(f"{agree} {total}\n")
    print(f"systran-align grow-diag-final-and reproduced on {agree} of {total} sentence pairs",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
