"""Redact streamed text without leaking and without stalling.

Per stream key (a choice, an output field), text that could still grow into PII is held back:
the trailing run of characters an entity can contain (digits, letters, `@._%+-:()/#`) and the
digit groups before it (`6222 0000 …`, `+86 138 …`, `DE89 3704 …`). Everything before it is
released now, redacted with the last released characters as context, so Chinese prose and
finished words flow at once while `1380013` waits for the rest of the number. Released text is
never retracted, and a cut never falls inside a detected entity.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from classifiers.invisible import FOLD
from classifiers.pii.engine import (
    CN_NUMERALS,
    DIGIT_WORDS,
    REPEAT_WORDS,
    PiiEngine,
    Replacer,
    Span,
    apply,
    normalize,
)
from classifiers.pii.recognizers import (
    CONTEXT_WINDOW,
    EMAIL_PUNCTUATION,
    EMAIL_RUN,
    LABEL_DIGITS,
    LABEL_REACH,
    MAX_ENTITY_CHARS,
    PHONE_RUN,
    SPELLED_AT,
    SPELLED_DOT,
)
from classifiers.scripts import HAN

# Characters an entity can be made of (after NFKC), and the gaps allowed between digit groups.
# The full-width full stop too: it stays as it is (Chinese punctuation) but is a dot in an e-mail.
_ENTITY_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@._%+-:()/#_\uff0e")
# An unbroken run of such characters (a hash, base64, a long number) is held until it ends, up
# to this many characters; past that it is released in parts, and an entity that only a later
# replacement next to it would expose can then slip out (documented in docs/pii.md).
HOLD_LIMIT = 1024
_GAPS = frozenset(" \u00a0\u3000")
# Released characters kept as context for the next release: look-behinds and context words.
_TAIL = CONTEXT_WINDOW + 16


def _entity_char(ch: str) -> bool:
    if ch in _ENTITY_CHARS:
        return True
    if ch.isascii():
        return False
    if ord(ch) in CN_NUMERALS:  # a number dictated in Chinese numerals may still be arriving
        return True
    if ord(ch) in FOLD:  # invisible: an entity may go on past it, so it is held with it
        return True
    n, _ = normalize(ch)
    return len(n) == 1 and n in _ENTITY_CHARS


def _has_digit(s: str) -> bool:
    return any(c.isdigit() or ord(c) in CN_NUMERALS for c in s)


# How far back a number spelled in words can reach: 19 digits of up to five letters and a gap
# each, up to 6.5 characters a digit with `double seven ` (2 digits in 13), and gaps.
_SPELLED_CHARS = 19 * 7 + 8
# What separates the words of a token (`(four`, `2-five`, `five-five-five`).
_PIECES = re.compile("[" + re.escape("".join(c for c in _ENTITY_CHARS if not c.isalpha())) + "]+")


def _spelled(token: str) -> bool:
    """Whether `token` spells a digit in words (`three`, `(four`, `2-five`, `five-five-five`), or
    is the `double` of a `double five`."""
    return any(w.lower() in DIGIT_WORDS or w.lower() in REPEAT_WORDS for w in _PIECES.split(token))


def safe_cut(text: str, names: tuple[str, ...] = ()) -> int:
    """How much of `text` can be released: everything before what could still grow into PII.

    With names on, also the capitalized words before the last one (`John Sm…`) and, for Chinese,
    the last four Han characters (a name still arriving).
    """
    i = len(text)
    if "zh" in names:
        while i > 0 and len(text) - i < 4 and HAN.match(text[i - 1]):
            i -= 1
    while i > 0 and _entity_char(text[i - 1]):
        i -= 1
    # Walk back over digit groups joined by single gaps: one grouped number may still be arriving
    # (with English names on, capitalized words too: one name may still be arriving). How far
    # back an entity can reach: further once digits spelled in words are among them.
    reach = _SPELLED_CHARS if _spelled(text[i:]) else MAX_ENTITY_CHARS
    while i > 0 and text[i - 1] in _GAPS:
        k = j = i - 1
        while k > 0 and _entity_char(text[k - 1]):
            k -= 1
        token = text[k:j]
        words = _spelled(token)
        # A lone X may be an ID's check character written apart (`… 7 8 X`).
        grows = words or _has_digit(token) or token in ("X", "x") or ("en" in names and token[:1].isupper())
        if k == j or not grows:
            break
        if words:
            reach = _SPELLED_CHARS
        if len(text) - k > reach:
            # A long run before the gap: hold as far back as an entity could reach into it.
            i = min(i, max(k, len(text) - reach))
            break
        i = k
    spelled = _spelled_email_start(text)
    if spelled is not None:
        i = min(i, spelled)
    return max(i, len(text) - HOLD_LIMIT)


def _digit(ch: str) -> bool:
    return ch.isdigit() or ord(ch) in CN_NUMERALS


def _phone_char(ch: str) -> bool:
    if ch in PHONE_RUN or _digit(ch) or ord(ch) in FOLD:
        return True
    n, _ = normalize(ch)
    return len(n) == 1 and n in PHONE_RUN


def label_hold(text: str, cut: int, found: Callable[[int, int], bool]) -> int:
    """`cut`, or the start of a number before it that may still get a label: LABEL_DIGITS digits
    or more that fewer than LABEL_REACH characters (as the recognizers read them) follow, unless
    `found(first, last)` says a finding already covers its digits. Its label (`… 2626 office`)
    may yet arrive, and whole-text redaction reads it (recognizers.labelled)."""
    p = cut
    while True:
        d = p - 1
        while d >= 0 and not _digit(text[d]):
            d -= 1
        if d < 0 or len(normalize(text[d + 1 :])[0]) >= LABEL_REACH:
            return cut
        r = d
        while r > 0 and _phone_char(text[r - 1]):
            r -= 1
        first = next(k for k in range(r, d + 1) if _digit(text[k]))
        if sum(_digit(c) for c in text[r : d + 1]) >= LABEL_DIGITS and not found(first, d + 1):
            cut = r
        p = r


# An e-mail address with its separators spelled out (`john [at] example [dot] com`) has spaces
# and brackets in it, which end the runs held above: while one may still be arriving (the text
# ends inside or after such a separator), it is held from its first word.
_SPELLED_MAX = 320  # characters: a whole address (254) with its separators
_SEPARATOR = f"(?:{SPELLED_AT}|{SPELLED_DOT})"
# From the last opening bracket to the end: a separator, then maybe a word; or a separator begun.
_SPELLED_TAIL = re.compile(
    rf"{_SEPARATOR}[ \t]{{0,3}}[{EMAIL_RUN}]*[ \t]{{0,3}}|[\[({{][ \t]{{0,3}}(?:[Aa][Tt]?|[Dd](?:[Oo][Tt]?)?)?[ \t]{{0,3}}"
)
_SEPARATOR_BEFORE = re.compile(rf"{_SEPARATOR}[ \t]{{0,3}}\Z")
_RUN_CHARS = frozenset(string.ascii_letters + string.digits + EMAIL_PUNCTUATION)


def _spelled_email_start(text: str) -> int | None:
    """Where a spelled-out e-mail address that may still be arriving starts, or None."""
    low = max(0, len(text) - _SPELLED_MAX)
    tail = text[low:]
    if not text.endswith((" ", "\t", "\u3000")) and not any(c in tail for c in "[({［（｛"):
        return None
    seg, back = normalize(tail)  # full-width `［ａｔ］` is read as `[at]`, as the recognizer does
    start = _spelled_start(seg)
    if start is None:
        return None
    return low + (back[start] if back is not None else start)


def _spelled_start(s: str) -> int | None:
    p = max(s.rfind(c) for c in "[({")
    if p < 0 or not _SPELLED_TAIL.fullmatch(s, p):
        # A word and a space at the very end: its `[at]` may come next.
        p = len(s)
        while p > 0 and s[p - 1] in " \t" and len(s) - p < 3:
            p -= 1
        if p == len(s):
            return None
        k = p
        while k > 0 and s[k - 1] in _RUN_CHARS:
            k -= 1
        return k if k < p else None
    start = None
    sep = p  # the separator whose word before it is looked for
    while True:
        j = sep
        while j > 0 and s[j - 1] in " \t" and sep - j < 3:
            j -= 1
        k = j
        while k > 0 and s[k - 1] in _RUN_CHARS:
            k -= 1
        if k == j:  # no word before the separator: not an address (or not this far back)
            return start
        start = k
        m = _SEPARATOR_BEFORE.search(s, max(0, k - 16), k)
        if m is None:
            return start
        sep = m.start()


@dataclass(slots=True)
class _Stream:
    pending: str = ""
    tail: str = ""  # the last released original characters
    tail_out: str = ""  # the last released characters as the client got them


@dataclass(slots=True)
class StreamRedactor:
    """Feed deltas per key; get back the redacted text that can be released now."""

    engine: PiiEngine
    replace: Replacer
    streams: dict[Hashable, _Stream] = field(default_factory=dict)
    found: Counter[str] = field(default_factory=Counter)  # entities redacted, over all streams

    def push(self, key: Hashable, delta: str) -> str:
        """Add `delta` to stream `key`; return what may be released now (possibly "")."""
        st = self.streams.setdefault(key, _Stream())
        st.pending += delta
        cut = safe_cut(st.pending, self.engine.names)
        if cut <= 0:
            return ""
        return self._release(st, cut, final=False)

    def flush(self, key: Hashable) -> str:
        """End of stream `key` (finish reason, [DONE], end of body): release everything held."""
        st = self.streams.get(key)
        if st is None or not st.pending:
            return ""
        return self._release(st, len(st.pending), final=True)

    def held(self, key: Hashable) -> int:
        """Characters of stream `key` held back right now."""
        st = self.streams.get(key)
        return len(st.pending) if st else 0

    def _render(self, text: str, ctx: int, stop: int, spans: list[Span]) -> tuple[str, list[Span], list[int]]:
        """The released part `text[ctx:stop]` with its findings replaced; the findings; and for
        each character of the result, the index in `text` it came from (replacements map to the
        start of what they replace)."""
        mine = [
            Span(max(s.start, ctx), s.end, s.entity, s.score)
            for s in spans
            if s.end > ctx and s.start < stop and s.end <= stop
        ]
        out: list[str] = []
        origin: list[int] = []
        pos = ctx
        for sp in mine:
            out.append(text[pos : sp.start])
            origin += range(pos, sp.start)
            rep = self.replace(sp, text[sp.start : sp.end])
            out.append(rep)
            origin += [sp.start] * len(rep)
            pos = sp.end
        out.append(text[pos:stop])
        origin += range(pos, stop)
        return "".join(out), mine, origin

    def _release(self, st: _Stream, cut: int, *, final: bool) -> str:
        ctx = st.tail
        text = ctx + st.pending
        spans = [s for s in self.engine.analyze(text) if s.end > len(ctx)]
        if not final:
            base = len(ctx)
            cut = label_hold(
                st.pending,
                cut,
                lambda a, b: any(s.start <= base + a and base + b <= s.end for s in spans),
            )
            if cut <= 0:
                return ""
        stop = len(ctx) + cut
        if not final:
            # Never cut inside an entity: move the cut before it (or past it, if it ends in time).
            for s in spans:
                if s.start < stop < s.end:
                    stop = s.start if s.start > len(ctx) else s.end
        out, mine, origin = self._render(text, len(ctx), stop, spans)
        while not final and (spans or st.tail_out != st.tail):
            # A replacement can expose a neighbour that was no entity before (its boundary was a
            # digit, now it is a placeholder). Never cut inside such a neighbour either.
            seen = st.tail_out + out
            # Look ahead at the rest as it would read once redacted too.
            look = seen + self._render(text, stop, len(text), spans)[0]
            crossing = [
                s for s in self.engine.analyze(look) if len(st.tail_out) <= s.start < len(seen) < s.end
            ]
            if not crossing:
                break
            new_stop = origin[crossing[0].start - len(st.tail_out)]
            if not len(ctx) <= new_stop < stop:
                break
            stop = new_stop
            out, mine, origin = self._render(text, len(ctx), stop, spans)
        released = text[len(ctx) : stop]
        if not released:
            return ""
        self.found.update(s.entity for s in mine)
        if mine or st.tail_out != st.tail:
            # As in PiiEngine.redact: a replacement (here or just before) can expose a neighbour.
            for _ in range(3):
                seen = st.tail_out + out
                more = [s for s in self.engine.analyze(seen) if s.start >= len(st.tail_out)]
                if not more:
                    break
                out = apply(seen, more, self.replace)[len(st.tail_out) :]
        if not final and any(s.end > stop for s in spans):
            # A finding still held back will be replaced, and that can expose a neighbour in what
            # goes out now (`…0002.` before a phone number): read it as it will read then.
            later = self._render(text, stop, len(text), spans)[0]
            for _ in range(3):
                seen = st.tail_out + out
                more = self.engine.analyze(seen + later)
                here = [s for s in more if s.start >= len(st.tail_out) and s.end <= len(seen)]
                there = [
                    Span(s.start - len(seen), s.end - len(seen), s.entity, s.score)
                    for s in more
                    if s.start >= len(seen)
                ]
                if not here and not there:
                    break
                out = apply(seen, here, self.replace)[len(st.tail_out) :]
                later = apply(later, there, self.replace)
        st.pending = st.pending[len(released) :]
        st.tail = text[:stop][-_TAIL:]
        st.tail_out = (st.tail_out + out)[-_TAIL:]
        return out
