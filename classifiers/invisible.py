"""Characters that change what a text says without showing: the classifiers read past them.

Zero-width spaces and joiners, bidi controls, soft hyphens and byte-order marks (Unicode's
format characters) split an attack's words or a card number's digits into pieces that neither
the injection model nor a PII pattern recognizes, while the text looks the same on screen:
dropped. Variation selectors carry no text, only bytes smuggled past a reader: dropped. Tag
characters spell ASCII invisibly ("ASCII smuggling") and a model may still read them: folded to
the letters they spell. Only what the checks read; the text that travels is left as it was.
"""

from __future__ import annotations

import itertools
import unicodedata


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
