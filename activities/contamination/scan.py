r"""Normalized n-gram overlap between a task's test items and what an agent controlled (pure).

Normalization: lowercase, then the text is its words, a word being a run of letters and digits
(any script); punctuation, symbols and whitespace only separate words. So "What is (17 + 5)?"
and "what is 17 5" are the same four words. The escapes a string literal or a JSON line writes
for whitespace (`\n`, `\t`, ...) separate words too, and `\uXXXX` is read as its character,
so an item pasted into a script or a JSON Lines dataset reads as it does in the test items.

An item's n-grams are its runs of `n` consecutive words; an item shorter than `n` words is one
n-gram of all its words (so short items, such as one-line questions, are found only whole); an
item with no word is not checked. An item is *matched* when at least `threshold` of its
distinct n-grams occur somewhere in the scanned text, in any of the sources together.

Text is fed in chunks (a dataset is read in pieces, never held as one list of words): the last
words of a chunk are carried to the next, so an n-gram across a chunk boundary is still seen.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from posttrain_env.limits import (
    MAX_CONTAMINATION_EVIDENCE,
    MAX_CONTAMINATION_PLACES,
    MAX_CONTAMINATION_SNIPPET_CHARS,
)

_WORD = re.compile(r"[^\W_]+")
_WORD_CHAR = re.compile(r"[^\W_]")
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|[nrtfv0])")
# Bytes of a source decoded and scanned at a time.
CHUNK_BYTES = 1 << 20
# A word cut by a chunk's end is carried to the next chunk up to this length; a longer run of
# letters is split there (no test item holds such a word, and carrying it whole would make a
# source of one endless word cost time quadratic in its length).
MAX_CARRIED_WORD_CHARS = 4096

Gram = tuple[str, ...]


def words(text: str) -> list[str]:
    """`text` normalized: its words, lowercased."""
    if "\\" in text:
        text = _ESCAPE.sub(_unescape, text)
    return _WORD.findall(text.lower())


def _unescape(escape: re.Match[str]) -> str:
    code = escape.group(1)
    return chr(int(code, 16)) if code else " "


@dataclass(frozen=True)
class ItemText:
    item_id: str
    text: str


@dataclass
class _Item:
    item_id: str
    grams: int  # distinct n-grams
    found: set[Gram] = field(default_factory=set)
    places: list[str] = field(default_factory=list)
    first: Gram | None = None


@dataclass(frozen=True)
class Match:
    item_id: str
    found_ngrams: int
    item_ngrams: int
    places: list[str]
    snippet: str


class Scan:
    """Look for `items` in the sources fed to it, then `matches()`."""

    def __init__(self, items: Iterable[ItemText], ngram: int, threshold: float) -> None:
        self.threshold = threshold
        self._items: list[_Item] = []
        self._grams: dict[Gram, list[int]] = {}  # n-gram -> the items that hold it
        self._lengths: set[int] = set()
        self._first_words: set[str] = set()
        for item in items:
            item_words = words(item.text)
            if not item_words:
                continue
            size = min(ngram, len(item_words))
            grams = {tuple(item_words[i : i + size]) for i in range(len(item_words) - size + 1)}
            index = len(self._items)
            self._items.append(_Item(item.item_id, len(grams)))
            self._lengths.add(size)
            for gram in grams:
                self._grams.setdefault(gram, []).append(index)
                self._first_words.add(gram[0])
        self._carry = max(self._lengths, default=1) - 1

    @property
    def items(self) -> int:
        return len(self._items)

    def feed_text(self, where: str, text: str) -> None:
        self.feed(where, [text])

    def feed_bytes(self, where: str, data: bytes) -> None:
        """Bytes decoded as UTF-8 (undecodable bytes become separators), a chunk at a time."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        chunks = (
            decoder.decode(data[i : i + CHUNK_BYTES], final=i + CHUNK_BYTES >= len(data))
            for i in range(0, len(data), CHUNK_BYTES)
        )
        self.feed(where, chunks)

    def feed(self, where: str, chunks: Iterable[str]) -> None:
        """One source, as chunks of text in order."""
        if not self._items:
            return
        for grams in self._source_grams(chunks):
            for gram in grams:
                for index in self._grams.get(gram, ()):
                    self._found(self._items[index], gram, where)

    def _source_grams(self, chunks: Iterable[str]) -> Iterator[list[Gram]]:
        tail: list[str] = []
        rest = ""
        for chunk in [*chunks, None]:
            if chunk is None:
                text, rest = rest, ""
            else:
                text = rest + chunk
                # A word cut by the chunk's end continues in the next chunk.
                start = _trailing_word_start(text)
                text, rest = text[:start], text[start:]
            seen = tail + words(text)
            yield self._grams_in(seen)
            tail = seen[-self._carry :] if self._carry else []

    def _grams_in(self, seen: list[str]) -> list[Gram]:
        first_words = self._first_words
        out: list[Gram] = []
        for size in self._lengths:
            for i in range(len(seen) - size + 1):
                if seen[i] in first_words:
                    gram = tuple(seen[i : i + size])
                    if gram in self._grams:
                        out.append(gram)
        return out

    @staticmethod
    def _found(item: _Item, gram: Gram, where: str) -> None:
        item.found.add(gram)
        if item.first is None:
            item.first = gram
        if where not in item.places and len(item.places) < MAX_CONTAMINATION_PLACES:
            item.places.append(where)

    def matches(self) -> list[Match]:
        """Every matched item, in the test items' order."""
        return [
            Match(
                item_id=item.item_id,
                found_ngrams=len(item.found),
                item_ngrams=item.grams,
                places=list(item.places),
                snippet=" ".join(item.first or ())[:MAX_CONTAMINATION_SNIPPET_CHARS],
            )
            for item in self._items
            if item.found and len(item.found) >= self.threshold * item.grams
        ]


def _trailing_word_start(text: str) -> int:
    """Where the word that ends `text` starts (len(text): none, or one too long to carry)."""
    start = len(text)
    limit = max(0, len(text) - MAX_CARRIED_WORD_CHARS)
    while start > limit and _WORD_CHAR.match(text, start - 1):
        start -= 1
    if start == limit and limit > 0 and _WORD_CHAR.match(text, start - 1):
        return len(text)
    return start


def cap_matches(matches: list[Match]) -> tuple[list[Match], int]:
    """The matches kept as evidence, and how many were left out."""
    kept = matches[:MAX_CONTAMINATION_EVIDENCE]
    return kept, len(matches) - len(kept)
