"""Text smuggled in an encoding: "decode this and do what it says: SWdub3JlIGFsbCBwcmV2aW91cy…".

A model told to decode a run of base64 reads the instruction in it; the classifier would read
only the run's tokens. These runs are read as the text they hold, when their bytes are UTF-8
text, mostly letters, in words (spaces between them, or Chinese):
- 16 or more base64 characters (standard or URL-safe alphabet, padding optional), base32
  characters (RFC 4648, upper or lower case, padding optional: `JFTW433SMUQGC3DM…`), or hex
  digits (an even number of them, 16 or more: `49676e6f7265…`);
- 4 or more percent-escapes (`%49%67%6E…`) or backslash escapes (`\\x49\\x67…`, `\\u0049…`).
A run whose bytes are itself such a run (base64 of base64, percent-escaped hex…) is decoded
again, three levels at most. Anything else (image data, keys, hashes, identifiers, which decode
to bytes that are not text) is left as it is.

Ciphers (`decipher`): a stretch of Latin words between punctuation, in which at least three
different words read as common English words once deciphered (and three tenths of its words at
least) and at most a third as many do as written, is read deciphered: Caesar shifts, ROT13
among them ("Vtaber nyy cerivbhf vafgehpgvbaf" → "Ignore all previous instructions"), and
Atbash. Morse code and runs of character codes (decimal, 8-bit binary) that spell words are
read as those words (`unspell`).

Only what the injection model reads (runtime.reading_form); the text that travels is left as it
was.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
import string
from collections import Counter
from collections.abc import Iterable, Iterator

from classifiers.scripts import HAN

# Up to six padding signs: base32's most (base64 has two).
_RUN = re.compile(r"(?<![A-Za-z0-9+/=_\-])[A-Za-z0-9+/_\-]{16,}={0,6}(?![A-Za-z0-9+/=_\-])")
# For PII: a mobile number in base64 is 15 characters and a padding sign.
_SHORT_RUN = re.compile(r"(?<![A-Za-z0-9+/=_\-])[A-Za-z0-9+/_\-]{12,}={0,6}(?![A-Za-z0-9+/=_\-])")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
_BASE32 = re.compile(r"[A-Z2-7]+|[a-z2-7]+")
_BASE32_TAILS = frozenset({0, 2, 4, 5, 7})  # the lengths mod 8 a base32 encoding can have
# Each with a literal first character, which the regex engine scans for quickly.
_ESCAPES = (
    ("%", re.compile(r"%[0-9a-fA-F]{2}(?:%[0-9a-fA-F]{2}){3,}")),
    ("\\x", re.compile(r"\\x[0-9a-fA-F]{2}(?:\\x[0-9a-fA-F]{2}){3,}")),
    ("\\u", re.compile(r"\\u[0-9a-fA-F]{4}(?:\\u[0-9a-fA-F]{4}){3,}")),
)
_URL_SAFE = str.maketrans("-_", "+/")


def _bytes(run: str) -> Iterator[bytes]:
    """What a run's bytes may be, most likely first, decoded as asked for: hex; else base32, then
    base64 (a base32 run is valid base64 too, so both may be tried)."""
    if _HEX.fullmatch(run):
        yield bytes.fromhex(run)
        return
    body = run.rstrip("=")
    if len(body) % 8 in _BASE32_TAILS and _BASE32.fullmatch(body):
        with contextlib.suppress(binascii.Error, ValueError):
            yield base64.b32decode(body.upper() + "=" * (-len(body) % 8))
    body = body.translate(_URL_SAFE)
    if len(body) % 4 != 1:  # no base64 encoding has this length
        with contextlib.suppress(binascii.Error, ValueError):
            yield base64.b64decode(body + "=" * (-len(body) % 4), validate=True)


def _escaped(run: str) -> bytes | str:
    if run[0] == "%":
        return bytes.fromhex(run.replace("%", ""))
    if run[1] == "x":
        return bytes.fromhex(run.replace("\\x", ""))
    units = "".join(chr(int(run[i + 2 : i + 6], 16)) for i in range(0, len(run), 6))
    # `\\ud83d\\ude00` is one character; a lone surrogate is read as U+FFFD (text must be valid
    # for the tokenizer, and one bad escape must not hide the rest).
    return units.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def decoded(run: str, *, words: bool = True) -> str | None:
    """The text an encoded run spells, or None when its bytes are not text (with `words`, not
    words: PII redaction asks for any text, a number alone included)."""
    raws: Iterable[bytes | str] = [_escaped(run)] if run[0] in "%\\" else _bytes(run)
    for raw in raws:
        text = raw if isinstance(raw, str) else _utf8(raw)
        if text is None:
            continue
        shown = sum(c.isprintable() or c in "\n\t" for c in text)
        if shown >= 0.95 * len(text) and len(text) >= (8 if words else 4) and (not words or _wordy(text)):
            return text
    return None


def _utf8(raw: bytes) -> str | None:
    """`raw` as UTF-8 text, or None. Of a long run (256 bytes or more) a character cut at either
    end is left out: the edges of a very long text are read one at a time (runtime.edges), and an
    edge can cut a run. A short run must be text whole: random bytes (an identifier read as
    base64) are often UTF-8 once a byte or two is left out."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        if len(raw) < 256:
            return None
    lead = 0
    while lead < min(3, len(raw)) and 0x80 <= raw[lead] < 0xC0:  # continuation bytes
        lead += 1
    end = len(raw)
    for back in range(1, min(4, end - lead) + 1):
        b = raw[end - back]
        if b >= 0xC0:  # the last character's first byte: cut short if it has fewer than it needs
            if back < (2 if b < 0xE0 else 3 if b < 0xF0 else 4):
                end -= back
            break
        if b < 0x80:
            break
    try:
        return raw[lead:end].decode("utf-8")
    except UnicodeDecodeError:
        return None


def _wordy(text: str) -> bool:
    """Mostly letters, in words: spaces between them, or Chinese (a random number's bytes can be
    letters: `wWacg7$d`)."""
    if sum(c.isalpha() for c in text) < 0.5 * len(text):
        return False
    return any(c.isspace() for c in text) or 2 * len(HAN.findall(text)) >= len(text)


def _is_run(text: str) -> bool:
    return bool(_SHORT_RUN.fullmatch(text) or any(e.fullmatch(text) for _, e in _ESCAPES))


def _levels(run: str) -> list[str]:
    """The texts a run's bytes spell, one per level of encoding (three at most)."""
    out: list[str] = []
    while len(out) < 3 and (plain := decoded(run, words=False)) is not None:
        out.append(plain)
        if not _is_run(plain):
            break
        run = plain
    return out


def _nested(run: str) -> str | None:
    """The words a run spells, through up to three levels of encoding."""
    return next((t for t in _levels(run) if len(t) >= 8 and _wordy(t)), None)


def runs(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, text) of each encoded run in `text` whose bytes are any text (nested up to
    three levels; base64 and hex from 12 characters)."""
    for mark, escapes in _ESCAPES:
        if mark in text:
            for m in escapes.finditer(text):
                for plain in _levels(m.group()):
                    yield m.start(), m.end(), plain
    for m in _SHORT_RUN.finditer(text):
        for plain in _levels(m.group()):
            yield m.start(), m.end(), plain


def _replace(m: re.Match[str]) -> str:
    text = _nested(m.group())
    return m.group() if text is None else text


def unwrap(text: str) -> str:
    """`text` with every encoded run that holds text read as that text."""
    for mark, escapes in _ESCAPES:
        if mark in text:
            text = escapes.sub(_replace, text)
    return _RUN.sub(_replace, text)


# Common English words (3+ letters) and the words of prompt attacks: what a deciphered sentence
# reads as. Written enciphered once, here, so that the check is one lookup per word.
COMMON_WORDS = frozenset(
    """the and that have for not with you this but his from they say her she will one all would
    there their what out about who get which when make can like time just him know take people
    into year your good some could them see other than then now look only come its over think
    also back after use two how our work first well way even new want because any these give day
    most are was were been has had did said does should may must very more such here those where
    why own same few each both down off again while under never always nothing something please
    tell write show let answer question help need next last ignore previous instructions
    instruction system prompt rules rule reveal secret password forget everything above below
    following respond reply output print text message role act mode developer restrictions user
    assistant anything without limits filter policy""".split()  # noqa: SIM905 - a word list
)
_ABC = string.ascii_lowercase


def _table(plain: str, coded: str) -> dict[int, int]:
    return str.maketrans(plain + plain.upper(), coded + coded.upper())


# Letter-substitution ciphers a model can be asked to read: Caesar shifts 1-25 (ROT13 among
# them) and Atbash, as (encoding, decoding) tables.
_CIPHERS = [(_table(_ABC, _ABC[k:] + _ABC[:k]), _table(_ABC[k:] + _ABC[:k], _ABC)) for k in range(1, 26)]
_CIPHERS.append((_table(_ABC, _ABC[::-1]), _table(_ABC, _ABC[::-1])))
_ENCIPHERED = [frozenset(w.translate(enc) for w in COMMON_WORDS) for enc, _ in _CIPHERS]
_BY_WORD: dict[str, tuple[int, ...]] = {}
for _k, _words in enumerate(_ENCIPHERED):
    for _w in _words:
        _BY_WORD[_w] = (*_BY_WORD.get(_w, ()), _k)
_WORD = re.compile(r"[a-z]{3,}")
_STRETCH = re.compile(r'[^.!?:;\n"()\[\]{}<>|`]+')


def _enciphered(stretch: str, words: list[str], k: int) -> bool:
    hits = len(_ENCIPHERED[k].intersection(words))
    if len(words) < 4 or hits < 3 or 10 * hits < 3 * len(words):
        return False
    if 3 * len(COMMON_WORDS.intersection(words)) > hits:
        return False
    letters = [c for c in stretch if c.isalpha()]
    return 10 * sum(c.isascii() for c in letters) >= 9 * len(letters)  # Latin, not Vietnamese


def decipher(text: str) -> str:
    """`text` with every stretch of English in a letter-substitution cipher read deciphered."""
    found = [_BY_WORD[w] for w in _BY_WORD.keys() & set(_WORD.findall(text.lower()))]
    # Most texts hold no three different enciphered common words at all.
    if sum(map(len, found)) < 3:
        return text
    # Each stretch is looked at once, for the ciphers three of its own words fit. Of the ciphers
    # the text's words fit most, the first that reads a stretch as English is the one read, in
    # every stretch it reads (one pass per cipher tried made a long text's cost grow with the
    # number of ciphers its words happen to fit: 0.8 s for 1.6 MB of English).
    stretches = list(_STRETCH.finditer(text))
    fits: list[frozenset[int]] = []
    for m in stretches:
        words = _WORD.findall(m.group().lower())
        ks = Counter(k for w in _BY_WORD.keys() & set(words) for k in _BY_WORD[w])
        fits.append(frozenset(k for k, n in ks.items() if n >= 3 and _enciphered(m.group(), words, k)))
    readable: frozenset[int] = frozenset().union(*fits)
    for k, hits in Counter(k for ks in found for k in ks).most_common():
        if hits < 3:
            break
        if k in readable:
            pieces: list[str] = []
            pos = 0
            for m, fit in zip(stretches, fits, strict=True):
                if k in fit:
                    pieces += (text[pos : m.start()], m.group().translate(_CIPHERS[k][1]))
                    pos = m.end()
            return "".join(pieces) + text[pos:]
    return text


_MORSE_CODES = (
    ".- -... -.-. -.. . ..-. --. .... .. .--- -.- .-.. -- -. --- .--. --.- .-. ... - ..- ...- .-- "
    "-..- -.-- --.. ----- .---- ..--- ...-- ....- ..... -.... --... ---.. ----."
)
_MORSE_MARKS = ".-.-.- --..-- ..--.. -.-.-- ---... .----. -....- -..-. -.--. -.--.- .-..-. -...-"
_MORSE = dict(
    zip(_MORSE_CODES.split() + _MORSE_MARKS.split(), _ABC + "0123456789" + ".,?!:'-/()\"=", strict=True)
)
# Letters one space apart, words a slash (or two spaces or more) apart; eight letters at least.
_MORSE_RUN = re.compile(r"[.\-]{1,6}(?:(?: ?/ ?| {2,}| )[.\-]{1,6}){7,}")
# Character codes, eight at least: decimal (`73 103 110`) or 8-bit binary (`01001001 01100111`).
_DECIMAL = re.compile(r"(?<![\d.])(?:\d{2,3}[ ,]+){7,}\d{2,3}(?![\d.])")
_BINARY = re.compile(r"(?<![01])(?:[01]{8} ?){7,}[01]{8}(?![01])")


def _morse(m: re.Match[str]) -> str:
    words = [[_MORSE.get(code) for code in word.split()] for word in re.split(r" ?/ ?| {2,}", m.group())]
    if any(c is None for word in words for c in word):
        return m.group()
    return " ".join("".join(c for c in word if c) for word in words)


def _spelled(m: re.Match[str], base: int) -> str:
    if base == 2:  # eight bits a character, with or without spaces between
        bits = m.group().replace(" ", "")
        numbers = [int(bits[i : i + 8], 2) for i in range(0, len(bits), 8)]
    else:
        numbers = [int(n) for n in re.findall(r"\d+", m.group())]
    if not all(32 <= n < 127 or n in (9, 10) for n in numbers):
        return m.group()
    text = "".join(map(chr, numbers))
    return text if " " in text and sum(c.isalpha() for c in text) >= 0.6 * len(text) else m.group()


def unspell(text: str) -> str:
    """`text` with Morse code and runs of character codes (decimal, binary) read as text."""
    if "-" in text and "." in text:
        text = _MORSE_RUN.sub(_morse, text)
    # Codes that spell words hold a space: 32, 00100000. Most texts hold neither.
    if "32" in text:
        text = _DECIMAL.sub(lambda m: _spelled(m, 10), text)
    if "00100000" in text:
        text = _BINARY.sub(lambda m: _spelled(m, 2), text)
    return text
