"""Characters that change what a text says without showing: the classifiers read past them.

Zero-width spaces and joiners, bidi controls, soft hyphens and byte-order marks (Unicode's
format characters) split an attack's words or a card number's digits into pieces that neither
the injection model nor a PII pattern recognizes, while the text looks the same on screen:
dropped. Variation selectors carry no text, only bytes smuggled past a reader: dropped; a run of
four or more of them whose bytes are UTF-8 text ("emoji smuggling": VS1–VS16 are bytes 0–15,
VS17–VS256 bytes 16–255, hung on one emoji) is read by the injection model as that text
(`unhide`), as an encoded run is, and by PII redaction (`hidden_texts`). Tag characters spell
ASCII invisibly ("ASCII smuggling") and a model may still read them: folded to the letters they
spell. Only what the checks read; the text
that travels is left as it was.
"""

from __future__ import annotations

import itertools
import re
import unicodedata

# A run of variation selectors: one follows an emoji or a CJK character to choose its glyph; four
# or more in a row choose nothing.
_SELECTORS = re.compile("[\ufe00-\ufe0f\U000e0100-\U000e01ef]{4,}")


def unhide(text: str) -> str:
    """`text` with each run of variation selectors whose bytes are text read as that text,
    between spaces; any other run is left (and dropped by FOLD)."""
    return _SELECTORS.sub(lambda m: f" {t} " if (t := _text(m.group())) is not None else m.group(), text)


def hidden_texts(text: str) -> list[tuple[int, int, str]]:
    """(start, end, text) of each run of variation selectors in `text` whose bytes are text."""
    if text.isascii():
        return []
    return [(m.start(), m.end(), t) for m in _SELECTORS.finditer(text) if (t := _text(m.group())) is not None]


def in_selectors(text: str) -> str:
    """`text`'s UTF-8 bytes as variation selectors, as emoji smuggling writes them (what
    `hidden_texts` reads; for tests and benches)."""
    return "".join(chr(0xFE00 + b) if b < 16 else chr(0xE0100 + b - 16) for b in text.encode())


def _text(run: str) -> str | None:
    raw = bytes(ord(c) - 0xFE00 if ord(c) < 0xFE10 else ord(c) - 0xE0100 + 16 for c in run)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if sum(c.isprintable() or c in "\n\t" for c in text) < 0.95 * len(text):
        return None
    return text


def _table() -> dict[int, str | None]:
    table: dict[int, str | None] = {}
    for cp in itertools.chain(range(0x3000), range(0xFE00, 0x10000), range(0x1D100, 0x1D200)):
        if unicodedata.category(chr(cp)) == "Cf":
            table[cp] = None
    table.update(dict.fromkeys(itertools.chain(range(0xFE00, 0xFE10), range(0xE0100, 0xE01F0))))
    table.update({cp: chr(cp - 0xE0000) for cp in range(0xE0020, 0xE007F)})
    table.update(dict.fromkeys((0xE0001, 0xE007F)))
    return table


# For str.translate: code point → its folded form (None: dropped).
FOLD: dict[int, str | None] = _table()
