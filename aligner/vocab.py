"""Vocabulary: subword <-> id maps, saved as JSON in the model directory. No torch.

Ids 0..3 are always the special tokens of ``constants.SPECIAL_TOKENS`` (PAD, BOS, EOS, UNK);
the other tokens follow by descending frequency, ties broken by the token string, so the same
corpus always gives the same ids.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Dict, Iterable, List, Optional, Sequence

from aligner import constants as C
from aligner.utils import AlignerError, atomic_output, check_condition

VOCAB_FORMAT = "aligner-vocabulary"


class Vocabulary:
    """A list of tokens; a token's id is its position. Build with :meth:`build` or :meth:`load`."""

    def __init__(self, tokens: Sequence[str]):
        tokens = list(tokens)
        if tuple(tokens[:len(C.SPECIAL_TOKENS)]) != C.SPECIAL_TOKENS:
            raise ValueError(f"a vocabulary must start with {C.SPECIAL_TOKENS}")
        if len(set(tokens)) != len(tokens):
            raise ValueError("a vocabulary must not repeat a token")
        self._tokens: List[str] = tokens
        self._ids: Dict[str, int] = {token: i for i, token in enumerate(tokens)}

    @classmethod
    def build(cls, token_lists: Iterable[Iterable[str]], min_count: int = 1,
              max_size: Optional[int] = None) -> "Vocabulary":
        """Vocabulary of the tokens in `token_lists` (e.g. BPE-segmented sentences).

        Keeps tokens seen at least `min_count` times; `max_size` caps the size *including*
        the 4 specials (None = no cap). Tokens equal to a special token map to the special.
        """
        counts: Counter = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        return cls.from_counts(counts, min_count, max_size)

    @classmethod
    def from_counts(cls, counts: Counter, min_count: int = 1,
                    max_size: Optional[int] = None) -> "Vocabulary":
        """:meth:`build` from token counts (``counts[token]`` = occurrences): the same
        vocabulary, ranked by count, ties by the token."""
        check_condition(min_count >= 1, "min_count must be >= 1")
        check_condition(max_size is None or max_size >= len(C.SPECIAL_TOKENS),
                        f"max_size must be at least {len(C.SPECIAL_TOKENS)} (the special tokens)")
        counts = Counter(counts)
        for special in C.SPECIAL_TOKENS:
            counts.pop(special, None)
        ranked = sorted((token for token, n in counts.items() if n >= min_count),
                        key=lambda token: (-counts[token], token))
        if max_size is not None:
            ranked = ranked[:max_size - len(C.SPECIAL_TOKENS)]
        return cls(list(C.SPECIAL_TOKENS) + ranked)

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: str) -> bool:
        return token in self._ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self._tokens == other._tokens

    def token_id(self, token: str) -> int:
        """Id of one token (UNK_ID when unknown)."""
        return self._ids.get(token, C.UNK_ID)

    def encode(self, tokens: Iterable[str]) -> List[int]:
        """Ids of `tokens`; unknown tokens become UNK_ID. No BOS/EOS is added."""
        get = self._ids.get
        return [get(token, C.UNK_ID) for token in tokens]

    def decode(self, ids: Iterable[int]) -> List[str]:
        """Tokens of `ids` (specials included as their strings)."""
        return [self._tokens[int(i)] for i in ids]

    @property
    def tokens(self) -> List[str]:
        """All tokens in id order (a copy)."""
        return list(self._tokens)

    def save(self, path: str) -> None:
        """Write the vocabulary as JSON (atomically)."""
        with atomic_output(path) as out:
            json.dump({"format": VOCAB_FORMAT, "version": C.MODEL_FORMAT_VERSION,
                       "tokens": self._tokens}, out, ensure_ascii=False, indent=0)
            out.write("\n")

    @classmethod
    def load(cls, path: str) -> "Vocabulary":
        """Read a vocabulary written by :meth:`save`; AlignerError naming the file if bad."""
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            raise AlignerError(f"{path}: missing (model directory incomplete)") from None
        except (ValueError, UnicodeDecodeError) as error:
            raise AlignerError(f"{path}: not a valid vocabulary file ({error})") from None
        check_condition(isinstance(data, dict) and data.get("format") == VOCAB_FORMAT
                        and isinstance(data.get("tokens"), list),
                        f"{path}: not a vocabulary file of this toolkit")
        bad = [token for token in data["tokens"] if not isinstance(token, str)]
        if bad:
            raise AlignerError(f"{path}: a token must be a string, not {bad[0]!r}")
        try:
            return cls(data["tokens"])
        except ValueError as error:
            raise AlignerError(f"{path}: {error}") from None
