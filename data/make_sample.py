#!/usr/bin/env python3
"""Rebuild data/sample/ from the shared WPT03 English-French data (deterministic).

    python data/make_sample.py [--shared-data ../shared/data] [--out data/sample] \
                               [--train-pairs 3000]

Writes, byte for byte as in the source files:
  train.en / train.fr   the FIRST --train-pairs lines of enfr/train.src / enfr/train.tgt
                        (Canadian Hansards 36.2, WPT03 training data)
  trial.en / trial.fr   the 37-pair WPT03 trial set (enfr/trial.src / trial.tgt)
  trial.talp            its gold alignments (0-based, i-j sure, ipj possible)
Every file is validated first (UTF-8, equal line counts, every gold index inside its sentence)
and written atomically. The script prints the table of line counts, token counts and SHA-256
checksums that data/README.md records. Only WPT03 data is used: the RWTH de-en gold set and
Multi30k must not be redistributed.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from aligner.formats import (check_alignments_against_bitext, read_bitext,  # noqa: E402
                             read_gold)
from aligner.utils import AlignerError, atomic_output  # noqa: E402

# output name -> (file under the shared data folder, number of lines to keep; None = all)
FILES = {
    "train.en": ("enfr/train.src", "train"),
    "train.fr": ("enfr/train.tgt", "train"),
    "trial.en": ("enfr/trial.src", None),
    "trial.fr": ("enfr/trial.tgt", None),
    "trial.talp": ("enfr/trial.talp", None),
}


def first_lines(path: Path, count: int | None) -> bytes:
    """The first ``count`` lines of ``path`` (all when None), bytes unchanged."""
    data = path.read_bytes()
    if count is None:
        return data
    lines = data.split(b"\n")
    if len(lines) - (1 if data.endswith(b"\n") else 0) < count:
        raise AlignerError(f"{path}: fewer than {count} lines")
    return b"".join(line + b"\n" for line in lines[:count])


def validate(out: Path) -> None:
    """Check the written sample with the package's own readers (raises AlignerError)."""
    read_bitext(str(out / "train.en"), str(out / "train.fr"))
    trial = read_bitext(str(out / "trial.en"), str(out / "trial.fr"))
    gold = read_gold(str(out / "trial.talp"))
    check_alignments_against_bitext([g.possible for g in gold], str(out / "trial.talp"), trial)


def describe(out: Path) -> str:
    """Markdown table: file, lines, tokens, SHA-256."""
    rows = ["| file | lines | tokens | sha256 |", "|---|---|---|---|"]
    for name in FILES:
        data = (out / name).read_bytes()
        text = data.decode("utf-8")
        lines = text.count("\n")
        tokens = "–" if name.endswith(".talp") else f"{len(text.split()):,}"
        rows.append(f"| {name} | {lines:,} | {tokens} | `{hashlib.sha256(data).hexdigest()}` |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared-data", type=Path, default=ROOT.parent / "shared" / "data",
                        help="folder with enfr/{train,trial}.* (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "sample",
                        help="output folder (default: %(default)s)")
    parser.add_argument("--train-pairs", type=int, default=3000,
                        help="number of leading training pairs to keep (default: %(default)s)")
    args = parser.parse_args()
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, (relative, count) in FILES.items():
            source = args.shared_data / relative
            if not source.is_file():
                raise AlignerError(f"{source}: no such file")
            data = first_lines(source, args.train_pairs if count == "train" else None)
            with atomic_output(str(args.out / name), "wb") as handle:
                handle.write(data)
        validate(args.out)
    except AlignerError as error:
        print(f"make_sample: error: {error}", file=sys.stderr)
        return 1
    print(describe(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
