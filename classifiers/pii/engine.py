"""The PII engine: presidio's AnalyzerEngine with our recognizers, pattern-only, built once.

`analyze` NFKC-normalizes the text (full-width digits become ASCII), runs the explicit
recognizer list at an explicit score threshold, keeps the best of overlapping findings and maps
offsets back to the original text. `redact` replaces what was found.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import string
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from presidio_analyzer import AnalyzerEngine, RecognizerRegistry, RecognizerResult
from presidio_analyzer.nlp_engine import NoOpNlpEngine

from classifiers import encoded
from classifiers.invisible import FOLD, hidden_texts
from classifiers.pii.recognizers import (
    BUILTIN_ENTITIES,
    PERSON,
    SPELLED_AT,
    PatternRecognizer,
    PersonRecognizer,
    ZtRecognizer,
    builtin,
)


@dataclass(frozen=True, slots=True)
class Span:
    """A finding in the original text: `text[start:end]` is the entity."""

    start: int
    end: int
    entity: str
    score: float


@dataclass(frozen=True, slots=True)
class CustomPattern:
    """A policy-defined entity: a regex and how sure a match is."""

    entity: str
    regex: str
    score: float = 0.8
    context: tuple[str, ...] = ()


class Replacement(StrEnum):
    """How a finding is replaced."""

    MASK = "mask"  # [REDACTED]
    ENTITY = "entity"  # <CN_RESIDENT_ID>
    HASH = "hash"  # <CN_RESIDENT_ID:3f2a9c1b0d>, keyed: equal values give equal tokens


Replacer = Callable[[Span, str], str]
_SEPARATORS = re.compile(r"[\s\-().]")


def replacer(mode: Replacement, key: bytes = b"") -> Replacer:
    """The function that turns a finding and its text into its replacement."""
    if mode is Replacement.MASK:
        return lambda span, value: "[REDACTED]"
    if mode is Replacement.ENTITY:
        return lambda span, value: f"<{span.entity}>"
    if not key:
        raise ValueError("hash replacement needs a key")

    def hashed(span: Span, value: str) -> str:
        # Keyed so tokens cannot be reversed by hashing guesses; separators dropped so one card
        # written two ways gets one token.
        canon = _SEPARATORS.sub("", unicodedata.normalize("NFKC", value)).lower()
        digest = hmac.new(key, f"{span.entity}\0{canon}".encode(), hashlib.sha256).hexdigest()
        return f"<{span.entity}:{digest[:10]}>"

    return hashed


# Chinese clause punctuation stays as it is: NFKC would make `，` a comma, and `1380013800，2`
# would read as one number with a thousands separator.
_CJK_PUNCTUATION = frozenset("，。：；、．")


class _Folds(dict[int, str]):
    """Code point → what the recognizers read instead (str.translate's table), filled as
    characters are met: NFKC per character, invisible characters (classifiers.invisible)
    dropped or spelled out, ASCII and Chinese clause punctuation as they are."""

    def __init__(self) -> None:
        super().__init__()
        self.odd: set[str] = set()  # characters met that do not read as one character
        # The odd characters as one class, with how many there were: rebuilt when more are
        # met (threads share the table; the set only grows, so a stale pattern shows by count).
        self._odd_re: tuple[int, re.Pattern[str]] = (0, re.compile("(?!)"))

    def __missing__(self, cp: int) -> str:
        ch = chr(cp)
        if cp < 128 or ch in _CJK_PUNCTUATION:
            n = ch
        elif cp in FOLD:  # a zero-width space inside a number must not hide it
            n = FOLD[cp] or ""
        else:
            n = unicodedata.normalize("NFKC", ch)
        if len(self) < 1 << 16:
            self[cp] = n
            if len(n) != 1:
                self.odd.add(ch)
        return n

    def shifts(self, text: str) -> bool:
        """Whether `text` (already translated once) holds a character that moves offsets."""
        count, pattern = self._odd_re
        if count != len(self.odd):
            odd = sorted(self.odd)
            pattern = re.compile("[" + "".join(re.escape(c) for c in odd) + "]")
            self._odd_re = (len(odd), pattern)
        return pattern.search(text) is not None


_FOLDS = _Folds()

# Numbers written digit by digit in Chinese numerals (`幺三八零零幺三八零零零`, financial `壹贰叁`),
# as people dictate a phone or card number: read as digits in runs of seven or more, so that the
# recognizers (and their check digits) judge them; one character for one, so offsets stay put.
CN_NUMERALS: dict[int, str] = {
    ord(c): str(d)
    for d, chars in enumerate(
        ("〇零", "一壹幺", "二贰两", "三叁", "四肆", "五伍", "六陆", "七柒", "八捌", "九玖")
    )
    for c in chars
}
_CN_CLASS = "[" + "".join(chr(c) for c in CN_NUMERALS) + "]"
_CN_DIGIT_RUN = re.compile(f"{_CN_CLASS}(?:[ -]?{_CN_CLASS}){{6,}}")


def _cn_digits(m: re.Match[str]) -> str:
    return m.group().translate(CN_NUMERALS)


def normalize(text: str) -> tuple[str, list[int] | None]:
    """The text as the recognizers read it; with the original index of every character of it
    (plus one past the end), or None when every character maps to one character in place."""
    if text.isascii():
        return text, None
    norm = text.translate(_FOLDS)
    if _CN_DIGIT_RUN.search(norm):
        norm = _CN_DIGIT_RUN.sub(_cn_digits, norm)
    # Characters past the table's size limit are never remembered as odd: then compare lengths.
    if len(norm) == len(text) and not _FOLDS.shifts(text) and len(_FOLDS) < 1 << 16:
        return norm, None
    back: list[int] = []
    for i, ch in enumerate(text):
        back += [i] * len(_FOLDS[ord(ch)])
    back.append(len(text))
    return norm, back


# What `replacer` writes. Recognizers see a placeholder as a run of letters, i.e. as the entity
# characters it replaced, so the text around it reads as before: `…0002(415) 555-2671` is no
# phone number before the ID is replaced, nor after (redaction stays idempotent).
_PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*(?::[0-9a-f]{10})?>|\[REDACTED\]")

# A word with one run of digits and letters only around it (`ID110000…`, `tel13800138000`,
# `…2671x`): the recognizers need a non-alphanumeric neighbour, so such a number is also read with
# a space between its digits and its letters. Only where it can be PII: seven digits or more, or
# one group of a grouped number (`tel138 0013 8000`, `555-2671x`); `sha256`, `h264` or `file2023`
# cost no second reading. Hashes and base64 mix letters and digits more than once in a word and
# are read as written only.
_DIGIT_RUN = re.compile(r"[0-9][0-9][0-9]+")  # (faster than \d{3,} or look-arounds)
_LETTERS = frozenset(string.ascii_letters)
_ALNUM = frozenset(string.ascii_letters + string.digits)
_GROUP_AFTER = re.compile(r"[ .()-][0-9]")
_GROUP_BEFORE = re.compile(r"[0-9][ .()-]")


def unglued(text: str) -> tuple[str, list[int]] | None:
    """`text` with a space between the digits and the letters of each glued word, and for every
    character of it (plus one past the end) the index in `text` of the character it is or, for
    an added space, of the character after it; None when no word is glued."""
    cuts: list[int] = []
    n = len(text)
    for m in _DIGIT_RUN.finditer(text):
        a, b = m.span()
        i, j = a, b
        while i > 0 and text[i - 1] in _LETTERS:
            i -= 1
        while j < n and text[j] in _LETTERS:
            j += 1
        pre, post = i < a, b < j
        if not (pre or post) or (i > 0 and text[i - 1] in _ALNUM) or (j < n and text[j] in _ALNUM):
            continue  # not glued, or not the word's only run of digits
        if b - a < 7 and not (
            (pre and not post and _GROUP_AFTER.match(text, b))
            or (post and not pre and a >= 2 and _GROUP_BEFORE.match(text, a - 2))
        ):
            continue
        if pre:
            cuts.append(a)
        # A resident ID's check character X stays with its digits (17, or a last group of 3).
        if post and text[b] in "Xx" and b - a in (3, 17):
            b += 1
        if b < j:
            cuts.append(b)
    if not cuts:
        return None
    parts: list[str] = []
    back: list[int] = []
    pos = 0
    for c in cuts:
        parts += [text[pos:c], " "]
        back += [*range(pos, c), c]
        pos = c
    parts.append(text[pos:])
    back += [*range(pos, len(text) + 1)]
    return "".join(parts), back


# Digits spelled out in English words (`one three eight zero …`, `five-five-five`, `double
# five` for 55 as numbers are dictated), as a model told to "write the number in words" answers:
# a run of seven or more (a `double five` is one) is also read as the digits it spells, so the
# same recognizers and checks judge it. The digits stand where the run starts and spaces fill
# the rest of it, so every other character keeps its place and context words stay as near as
# they are. Only single spaces or hyphens between the words: a streamed answer holds such a run
# back as it holds digit groups.
DIGIT_WORDS = {
    "zero": "0", "oh": "0", "one": "1", "two": "2", "three": "3", "four": "4",
    "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9",
}  # fmt: skip
REPEAT_WORDS = {"double": 2, "triple": 3}
_DIGIT_WORD = "(?:" + "|".join(DIGIT_WORDS) + ")"
_UNIT = "(?:(?:" + "|".join(REPEAT_WORDS) + rf")[ -])?{_DIGIT_WORD}"
# Searched in the lowered text (case-sensitive is 2.4x faster than (?i) here), or with (?i)
# where lowering changes the length (a few non-ASCII letters).
_SPELLED_RUN = re.compile(rf"(?<![A-Za-z]){_UNIT}(?:[ -]{_UNIT}){{6,}}(?![A-Za-z])")
_SPELLED_RUN_CI = re.compile(_SPELLED_RUN.pattern, re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z]+")


def _spelled_runs(text: str) -> Iterator[re.Match[str]]:
    low = text.lower()
    if len(low) == len(text):
        return _SPELLED_RUN.finditer(low)
    return _SPELLED_RUN_CI.finditer(text)


def spelled_digits(text: str) -> tuple[str, list[int]] | None:
    """`text` with each run of spelled digits written as digits (then spaces, to the run's
    length), and for every character of it (plus one past the end) the index in `text` it
    stands for: a digit its word's start (the first of a `double five` the start of `double`),
    a filling space the run's end; None when there is no such run."""
    view = list(text)
    back = list(range(len(text) + 1))
    found = False
    for m in _spelled_runs(text):
        found = True
        at = m.start()
        repeat: tuple[int, int] | None = None  # (times, where the repeat word starts)
        for w in _WORD.finditer(m.group()):
            word = w.group().lower()
            if word in REPEAT_WORDS:
                repeat = (REPEAT_WORDS[word], m.start() + w.start())
                continue
            times, first = repeat or (1, m.start() + w.start())
            for k in range(times):
                view[at] = DIGIT_WORDS[word]
                back[at] = first if k == 0 else m.start() + w.start()
                at += 1
            repeat = None
        for k in range(at, m.end()):
            view[k] = " "
            back[k] = m.end()
    return ("".join(view), back) if found else None


# Every built-in entity contains a digit, an '@' (e-mail, or spelled `[at]`) or a ':' (IPv6):
# text without any of them skips analysis altogether, which is most streamed prose.
_MAYBE_PII = re.compile(rf"[0-9@:]|{SPELLED_AT}")


class PiiEngine:
    """Find and redact PII; build once per worker and share (it holds no per-call state)."""

    def __init__(
        self,
        entities: Sequence[str] = BUILTIN_ENTITIES,
        threshold: float = 0.5,
        patterns: Sequence[CustomPattern] = (),
        phone_regions: Sequence[str] = ("US", "CN"),
        names: Sequence[str] = (),
    ) -> None:
        known = {*BUILTIN_ENTITIES, *(p.entity for p in patterns), *([PERSON] if names else [])}
        unknown = sorted(set(entities) - known)
        if unknown:
            raise ValueError(f"unknown entities {unknown}")
        recognizers: list[ZtRecognizer] = builtin(entities, phone_regions)
        recognizers += [PatternRecognizer(p.entity, p.regex, p.score, p.context) for p in patterns]
        ents = [*entities, *(p.entity for p in patterns)]
        if names:
            recognizers.append(PersonRecognizer(names))
            ents.append(PERSON)
        self.entities = tuple(dict.fromkeys(ents))
        self.names = tuple(names)
        self.threshold = threshold
        self._priority = {
            e: i for i, e in enumerate([*BUILTIN_ENTITIES, *(p.entity for p in patterns), PERSON])
        }
        # Names and custom patterns need no digit: only the built-in entities allow the shortcut.
        self._prefilter = None if patterns or names else _MAYBE_PII
        self._analyzer = AnalyzerEngine(
            registry=RecognizerRegistry(recognizers=recognizers, supported_languages=["en"]),
            nlp_engine=NoOpNlpEngine(models=[{"lang_code": "en", "model_name": "none"}]),
            supported_languages=["en"],
            default_score_threshold=threshold,
        )

    def warm(self) -> None:
        """Load lazily built parts (phone metadata per region) now, not on the first request."""
        self.analyze("warm-up: +1 415-555-2671, 13800138000, a@b.co, 4111111111111111, 1.2.3.4")

    def _encoded(self, norm: str) -> list[RecognizerResult]:
        """Runs of base64, base32, hex or escapes whose text holds PII, each found whole as its best entity."""
        out: list[RecognizerResult] = []
        for start, end, plain in encoded.runs(norm):
            if (best := self._best(plain, encoded_runs=False)) is not None:
                out.append(RecognizerResult(best.entity, start, end, best.score))
        return out

    def _best(self, plain: str, *, encoded_runs: bool = True) -> Span | None:
        """The strongest finding in a run's decoded text, which stands for the whole run."""
        return max(self.analyze(plain, encoded_runs=encoded_runs), key=lambda s: s.score, default=None)

    def _smuggled(self, text: str) -> list[Span]:
        """Runs of variation selectors whose bytes are text that holds PII ("emoji smuggling"),
        each found whole as its best entity, at its place in `text` (they read as nothing in the
        normalized text)."""
        out: list[Span] = []
        for start, end, plain in hidden_texts(text):
            if (best := self._best(plain)) is not None:
                out.append(Span(start, end, best.entity, best.score))
        return out

    def _recognize(self, norm: str) -> list[RecognizerResult]:
        return self._analyzer.analyze(
            norm, language="en", entities=list(self.entities), score_threshold=self.threshold
        )

    def analyze(self, text: str, *, encoded_runs: bool = True) -> list[Span]:
        """Findings in `text` at or above the threshold, non-overlapping, in text order; PII
        inside a run of base64, base32, hex or escapes (up to three levels), or in the bytes of a
        run of variation selectors, is found as the whole run."""
        if not text:
            return []
        smuggled = self._smuggled(text)
        norm, back = normalize(text)
        plain = self._prefilter is None or self._prefilter.search(norm) is not None
        hidden = self._encoded(norm) if encoded_runs else []
        words = next(_spelled_runs(norm), None) is not None
        if not plain and not hidden and not words:
            return smuggled
        held: list[tuple[int, int]] = []
        if "<" in norm or "[" in norm:
            held = [m.span() for m in _PLACEHOLDER.finditer(norm)]
            for a, b in held:
                # Next to a letter, a space at that end: the placeholder stands for digits that
                # were read apart from the letters (unglued), so the word there reads as before.
                fill = (" " if a and norm[a - 1] in _LETTERS else "z") + "z" * (b - a - 2)
                fill += " " if b < len(norm) and norm[b] in _LETTERS else "z"
                norm = norm[:a] + fill + norm[b:]
        results = self._recognize(norm) if plain else []
        # The same text read again where digits are glued to letters or spelled in words.
        for apart in (unglued(norm) if plain else None, spelled_digits(norm) if words else None):
            if apart is not None:
                view, at = apart
                results += [
                    RecognizerResult(r.entity_type, at[r.start], at[r.end], r.score)
                    for r in self._recognize(view)
                ]
        results += hidden
        if held:
            results = [r for r in results if not any(r.start < b and a < r.end for a, b in held)]
        # The best finding wins an overlap: higher score, then entity priority, then longer.
        ranked = sorted(
            results,
            key=lambda r: (-r.score, self._priority.get(r.entity_type, 99), r.start - r.end),
        )
        kept: list[Span] = []
        for r in ranked:
            overlap = [k for k in kept if r.start < k.end and k.start < r.end]
            if not overlap:
                kept.append(Span(r.start, r.end, r.entity_type, round(float(r.score), 4)))
                continue
            # The weaker finding still covers text: the winner grows over it, or the part left
            # outside would be redacted on its own next time (redaction must be idempotent).
            for k in overlap:
                kept.remove(k)
            best = overlap[0]
            start = min(r.start, *(k.start for k in overlap))
            end = max(r.end, *(k.end for k in overlap))
            kept.append(Span(start, end, best.entity, best.score))
        if back is not None:
            kept = [Span(back[s.start], back[s.end], s.entity, s.score) for s in kept]
        return _merged(kept + smuggled) if smuggled else sorted(kept, key=lambda s: s.start)

    def redact(self, text: str, replace: Replacer) -> tuple[str, list[Span]]:
        """`text` with every finding replaced, and the findings (offsets into `text`)."""
        spans = self.analyze(text)
        out = apply(text, spans, replace)
        # A replacement can turn its neighbour into an entity (`2001:db8::0a@b.co` → the address
        # left of `[REDACTED]` now ends cleanly): redact until nothing more is found.
        for _ in range(3):
            more = self.analyze(out) if spans else []
            if not more:
                break
            out = apply(out, more, replace)
        return out, spans


def _merged(spans: list[Span]) -> list[Span]:
    """`spans` in text order, overlapping ones made one (the higher score's entity): a finding
    read in the normalized text can reach over a run of selectors, which reads as nothing there."""
    out: list[Span] = []
    for s in sorted(spans, key=lambda s: s.start):
        if out and s.start < out[-1].end:
            k = out[-1]
            best = k if k.score >= s.score else s
            out[-1] = Span(k.start, max(k.end, s.end), best.entity, best.score)
        else:
            out.append(s)
    return out


def apply(text: str, spans: Sequence[Span], replace: Replacer) -> str:
    """Replace non-overlapping, ordered spans in `text`."""
    if not spans:
        return text
    out: list[str] = []
    pos = 0
    for s in spans:
        out += [text[pos : s.start], replace(s, text[s.start : s.end])]
        pos = s.end
    out.append(text[pos:])
    return "".join(out)
