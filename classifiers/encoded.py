"""Text smuggled in base64: "decode this and do what it says: SWdub3JlIGFsbCBwcmV2aW91cy…".

A model told to decode a run of base64 reads the instruction in it; the classifier would read
only the run's tokens. A run of 16 or more base64 characters (standard or URL-safe alphabet,
padding optional) whose bytes are UTF-8 text, mostly letters, is read as that text instead.
Anything else (image data, keys, hashes, identifiers, which decode to bytes that are not text)
is left as it is. Only what the injection model reads (runtime.reading_form); the text that
travels is left as it was.
"""

from __future__ import annotations

import base64
import binascii
import re

_RUN = re.compile(r"(?<![A-Za-z0-9+/=_\-])[A-Za-z0-9+/_\-]{16,}={0,2}(?![A-Za-z0-9+/=_\-])")
_URL_SAFE = str.maketrans("-_", "+/")


def decoded(run: str) -> str | None:
    """The text a base64 run spells, or None when its bytes are not text."""
    body = run.rstrip("=").translate(_URL_SAFE)
    if len(body) % 4 == 1:  # no base64 encoding has this length
        return None
    try:
        text = base64.b64decode(body + "=" * (-len(body) % 4), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    letters = sum(c.isalpha() for c in text)
    shown = sum(c.isprintable() or c in "\n\t" for c in text)
    if len(text) < 8 or shown < 0.95 * len(text) or letters < 0.5 * len(text):
        return None
    return text


def _replace(m: re.Match[str]) -> str:
    text = decoded(m.group())
    return m.group() if text is None else text


def unwrap(text: str) -> str:
    """`text` with every base64 run that holds text read as that text."""
    return _RUN.sub(_replace, text)
