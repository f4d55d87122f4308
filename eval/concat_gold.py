"""Long sentence pairs with a gold alignment: consecutive pairs of a gold set joined into one.

The hand-aligned sets we have (WPT03 en-fr dev / trial, RWTH de-en) hold no pair longer than
40 words, so they cannot show how an aligner does on the long sentences of a real corpus. This
joins every N consecutive pairs of a gold set into one pair (source words after source words,
target after target) and shifts each part's links by the lengths before it: the gold of the
joined pair is the union of its parts' golds, with no link across parts (which is right: the
parts are separate sentences)::

    D=../shared/data/enfr
    python eval/concat_gold.py --gold dev $D/dev.src $D/dev.tgt $D/dev.talp \\
        --group 3 --output runs/dev3
    align extract MODEL -s runs/dev3.src -t runs/dev3.tgt -o runs/dev3.align
    align score-aer -g runs/dev3.talp -a runs/dev3.align

writes runs/dev3.src, .tgt and .talp (a last group of fewer than N pairs is kept as it is).
Sure links stay sure (``i-j``), possible ones possible (``ipj``). The gold set is given as
every eval/ script takes one (``--gold NAME SRC TGT GOLD``, eval/gold_sets.py; one here).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gold_sets import add_gold_argument, exit_on_error, load_gold_sets  # noqa: E402

from aligner.utils import atomic_output, check_condition  # noqa: E402


def join_groups(sources, targets, golds, group: int):
    """Yield (source words, target words, sure links, possible-only links) of every `group`
    consecutive pairs joined; links are (source index, target index), 0-based."""
    for start in range(0, len(sources), group):
        source, target, sure, possible = [], [], set(), set()
        for k in range(start, min(start + group, len(sources))):
            shift_i, shift_j = len(source), len(target)
            source.extend(sources[k])
            target.extend(targets[k])
            sure |= {(i + shift_i, j + shift_j) for i, j in golds[k].sure}
            possible |= {(i + shift_i, j + shift_j) for i, j in golds[k].possible}
        yield source, target, sure, possible - sure


def _positive(text: str) -> int:
    """argparse type: an integer of 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer of 1 or more, got {text!r}")
    return int(text)


@exit_on_error("concat_gold.py")
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gold_argument(parser, use="one, whose pairs are joined")
    parser.add_argument("--group", type=_positive, default=3, metavar="N",
                        help="pairs joined into one (1 or more)")
    parser.add_argument("--output", required=True, help="prefix of OUTPUT.src/.tgt/.talp")
    args = parser.parse_args(argv)
    check_condition(len(args.gold) == 1, f"--gold: give one gold set, got {len(args.gold)}")
    gold_set = load_gold_sets(args.gold)[0]
    joined = list(join_groups(gold_set.sources, gold_set.targets, gold_set.golds, args.group))
    with atomic_output(args.output + ".src") as src, \
            atomic_output(args.output + ".tgt") as tgt, \
            atomic_output(args.output + ".talp") as talp:
        for source, target, sure, possible in joined:
            src.write(" ".join(source) + "\n")
            tgt.write(" ".join(target) + "\n")
            links = [f"{i}-{j}" for i, j in sorted(sure)] + \
                    [f"{i}p{j}" for i, j in sorted(possible)]
            talp.write(" ".join(links) + "\n")
    longest = max(max(len(s), len(t)) for s, t, _, _ in joined)
    print(f"{args.output}.src/.tgt/.talp: {gold_set.name}'s {gold_set.size} pairs in "
          f"{len(joined)}, each of up to {args.group} joined, "
          f"longest side {longest} words", file=sys.stderr)


if __name__ == "__main__":
    main()
