"""PII recognizers as tables of (text, expected spans), values generated with real check digits."""

from __future__ import annotations

import base64
import random

import pytest

from bench import pii_synth as synth
from classifiers.invisible import in_selectors
from classifiers.pii._checks import cn_id_ok, iban_ok, luhn_ok
from classifiers.pii.engine import CustomPattern, PiiEngine, Replacement, Span, replacer

ENGINE = PiiEngine()
RNG = random.Random(20261130)


def _found(text: str) -> list[tuple[str, str]]:
    return [(s.entity, text[s.start : s.end]) for s in ENGINE.analyze(text)]


def _fw(s: str) -> str:
    return s.translate({ord(c): ord(c) + 0xFEE0 for c in "0123456789"})


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _b32(s: str) -> str:
    return base64.b32encode(s.encode()).decode()


def _cn(s: str, numerals: str = "零幺二三四五六七八九") -> str:
    return s.translate({ord(str(d)): numerals[d] for d in range(10)})


_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
ID = synth.cn_id(RNG)
ID_X = next(v for v in (synth.cn_id(RNG) for _ in range(500)) if v.endswith("X"))
MOBILE = synth.cn_mobile(RNG)
BANK = synth.cn_bank_card(RNG)
VISA = synth.card(RNG, "visa")
IBAN = synth.iban(RNG)

POSITIVE = [
    # Chinese text around the value: stock \b-anchored regexes miss every one of these.
    (f"我的身份证号是{ID}，请核对", "CN_RESIDENT_ID", ID),
    (f"身份证{ID_X}已登记", "CN_RESIDENT_ID", ID_X),
    (f"证件 {ID[:6]} {ID[6:14]} {ID[14:]}", "CN_RESIDENT_ID", f"{ID[:6]} {ID[6:14]} {ID[14:]}"),
    (f"证件号{ID[:6]}-{ID[6:14]}-{ID[14:]}", "CN_RESIDENT_ID", f"{ID[:6]}-{ID[6:14]}-{ID[14:]}"),
    ("身份证号码110105491231002", "CN_RESIDENT_ID", "110105491231002"),  # legacy 15 digits, context word
    (f"请拨打{MOBILE}联系", "CN_MOBILE", MOBILE),
    (f"手机：{MOBILE[:3]} {MOBILE[3:7]} {MOBILE[7:]}", "CN_MOBILE", f"{MOBILE[:3]} {MOBILE[3:7]} {MOBILE[7:]}"),
    (f"电话+86 {MOBILE}", "CN_MOBILE", f"+86 {MOBILE}"),
    (f"0086{MOBILE}是他的", "CN_MOBILE", f"0086{MOBILE}"),
    (f"手机{_fw(MOBILE)}谢谢", "CN_MOBILE", _fw(MOBILE)),  # full-width digits, offsets mapped back
    # Dictated in Chinese numerals (幺 for 1, financial 壹贰叁), grouped or not.
    (f"手机{_cn(MOBILE)}谢谢", "CN_MOBILE", _cn(MOBILE)),
    (f"电话 {_cn(MOBILE[:3])} {_cn(MOBILE[3:7])} {_cn(MOBILE[7:])}。", "CN_MOBILE",
     f"{_cn(MOBILE[:3])} {_cn(MOBILE[3:7])} {_cn(MOBILE[7:])}"),
    (f"身份证{_cn(ID, '〇壹贰叁肆伍陆柒捌玖')}", "CN_RESIDENT_ID", _cn(ID, "〇壹贰叁肆伍陆柒捌玖")),
    # Encoded (a model asked to "answer in base64"): the whole run is the finding.
    (f"ID: {_b64(ID)} ok", "CN_RESIDENT_ID", _b64(ID)),
    (f"call {_b64(MOBILE)}", "CN_MOBILE", _b64(MOBILE)),  # 15 characters and a padding sign
    (f"ID: {_b64(_b64(ID))} ok", "CN_RESIDENT_ID", _b64(_b64(ID))),  # encoded twice
    (f"hex {_b64(MOBILE).encode().hex()}", "CN_MOBILE", _b64(MOBILE).encode().hex()),
    (f"hex {('手机' + MOBILE).encode().hex()}。", "CN_MOBILE", ("手机" + MOBILE).encode().hex()),
    ("card " + "".join(f"%{ord(c):02X}" for c in VISA), "CREDIT_CARD", "".join(f"%{ord(c):02X}" for c in VISA)),
    (f"mail {_b64('zhang.san@example.com')}", "EMAIL_ADDRESS", _b64("zhang.san@example.com")),
    # Base32: padded (up to six padding signs), unpadded, lower case.
    (f"ID {_b32(ID)} ok", "CN_RESIDENT_ID", _b32(ID)),
    (f"call {_b32(MOBILE).rstrip('=')}", "CN_MOBILE", _b32(MOBILE).rstrip("=")),
    (f"card {_b32(VISA).lower()}", "CREDIT_CARD", _b32(VISA).lower()),
    (f"银行卡{BANK}转账", "CN_BANK_CARD", BANK),
    (f"卡号：{synth.grouped(BANK)}", "CN_BANK_CARD", synth.grouped(BANK)),
    (f"信用卡号{VISA}", "CREDIT_CARD", VISA),
    ("邮箱zhang.san@example.com谢谢", "EMAIL_ADDRESS", "zhang.san@example.com"),
    # Full-width (the full stop `．` is kept as Chinese punctuation, yet is a dot here) and the
    # separators spelled out, as people write an address to keep it from scrapers.
    ("邮箱ｚｈａｎｇ．ｓａｎ＠ｅｘａｍｐｌｅ．ｃｏｍ谢谢", "EMAIL_ADDRESS", "ｚｈａｎｇ．ｓａｎ＠ｅｘａｍｐｌｅ．ｃｏｍ"),
    ("write to john.doe [at] example [dot] com today", "EMAIL_ADDRESS", "john.doe [at] example [dot] com"),
    ("j_doe(at)mail(dot)example.org", "EMAIL_ADDRESS", "j_doe(at)mail(dot)example.org"),
    ("Contact: J.Doe {AT} corp {DOT} co {DOT} uk.", "EMAIL_ADDRESS", "J.Doe {AT} corp {DOT} co {DOT} uk"),
    ("邮箱zhang（at）qq．com谢谢", "EMAIL_ADDRESS", "zhang（at）qq．com"),
    ("IP地址192.168.10.23无法访问", "IP_ADDRESS", "192.168.10.23"),
    ("IPv6地址2001:db8:85a3::8a2e:370:7334不通", "IP_ADDRESS", "2001:db8:85a3::8a2e:370:7334"),
    (f"IBAN {IBAN} please", "IBAN_CODE", IBAN),
    (f"IBAN {' '.join(IBAN[i : i + 4] for i in range(0, len(IBAN), 4))}.", "IBAN_CODE",
     " ".join(IBAN[i : i + 4] for i in range(0, len(IBAN), 4))),
    (f"my iban is {IBAN.lower()}", "IBAN_CODE", IBAN.lower()),
    ("SSN 078-05-1120 on file", "US_SSN", "078-05-1120"),
    ("social security number 078051120", "US_SSN", "078051120"),
    ("call me at (415) 555-2671 tomorrow", "PHONE_NUMBER", "(415) 555-2671"),
    ("office +44 20 7946 0958", "PHONE_NUMBER", "+44 20 7946 0958"),
    ("Phone: 021-4006034", "PHONE_NUMBER", "021-4006034"),
    # Glued to letters (a model told to "put an x before each number"): read as if spaced.
    (f"ID{ID} on file", "CN_RESIDENT_ID", ID),
    (f"tel{MOBILE}", "CN_MOBILE", MOBILE),
    (f"x{MOBILE}y", "CN_MOBILE", MOBILE),
    (f"cardno{VISA}", "CREDIT_CARD", VISA),
    ("call (415) 555-2671x now", "PHONE_NUMBER", "(415) 555-2671"),
    # A national number with its label right after it, as address blocks write them.
    ("Bangladesh 71366\n078 6657 2626 office\n22", "PHONE_NUMBER", "078 6657 2626"),
    ("Tajikistan 67655\n50-98-28-96-Office,7", "PHONE_NUMBER", "50-98-28-96"),
    ("home line 9885 1152 (fax)", "PHONE_NUMBER", "9885 1152"),
    ("地址北京 0479 50 54 03（座机）", "PHONE_NUMBER", "0479 50 54 03"),
    ("地址北京 0479 50 54 03，电话", "PHONE_NUMBER", "0479 50 54 03"),
    ("phone4155552671", "PHONE_NUMBER", "4155552671"),  # the glued word is the context word
    ("host v192.168.10.23", "IP_ADDRESS", "192.168.10.23"),
    # Spelled out in words (a model told to "write the number in words").
    (f"call {' '.join(_WORDS[int(d)] for d in MOBILE)} today", "CN_MOBILE", " ".join(_WORDS[int(d)] for d in MOBILE)),
    ("İstanbul office: call five five five two six seven one", "PHONE_NUMBER", "five five five two six seven one"),
    ("Phone: Four-One-Five-Five-Five-Five-Two-Six-Seven-One.", "PHONE_NUMBER", "Four-One-Five-Five-Five-Five-Two-Six-Seven-One"),
    (f"card {' '.join(_WORDS[int(d)] for d in VISA)}", "CREDIT_CARD", " ".join(_WORDS[int(d)] for d in VISA)),
    # Dictated: repeated digits as `double five`, `triple oh`.
    ("call me on four one five double five five two six seven one.", "PHONE_NUMBER",
     "four one five double five five two six seven one"),
    ("card: four triple one one one one one one one one one one one double one", "CREDIT_CARD",
     "four triple one one one one one one one one one one one double one"),
    ("手机 one three eight double oh one three eight triple oh", "CN_MOBILE",
     "one three eight double oh one three eight triple oh"),
    # Regrouped (a model told to "space the digits out"): a valid ID in any grouping, a card
    # one digit at a time or after a card word.
    (f"here: {' '.join(ID)}", "CN_RESIDENT_ID", " ".join(ID)),
    (f"here {ID[:6]} {ID[6:10]} {ID[10:14]} {ID[14:]}", "CN_RESIDENT_ID", f"{ID[:6]} {ID[6:10]} {ID[10:14]} {ID[14:]}"),
    (f"证件 {ID[:6]}.{ID[6:14]}.{ID[14:]}", "CN_RESIDENT_ID", f"{ID[:6]}.{ID[6:14]}.{ID[14:]}"),
    (f"ok {' '.join(VISA)} ok", "CREDIT_CARD", " ".join(VISA)),
    (f"card {VISA[:3]}-{VISA[3:6]}-{VISA[6:9]}-{VISA[9:12]}-{VISA[12:]}", "CREDIT_CARD",
     f"{VISA[:3]}-{VISA[3:6]}-{VISA[6:9]}-{VISA[9:12]}-{VISA[12:]}"),
    (f"card {'_'.join(VISA[i : i + 4] for i in range(0, len(VISA), 4))}", "CREDIT_CARD",
     "_".join(VISA[i : i + 4] for i in range(0, len(VISA), 4))),
]  # fmt: skip


@pytest.mark.parametrize(("text", "entity", "value"), POSITIVE)
def test_finds_entity_next_to_any_script(text: str, entity: str, value: str) -> None:
    assert (entity, value) in _found(text)


@pytest.mark.parametrize(("brand", "prefixes", "lengths"), synth.CARD_BRANDS)
def test_cards_of_every_scheme_and_length(
    brand: str, prefixes: tuple[str, ...], lengths: tuple[int, ...]
) -> None:
    for prefix in prefixes:
        for n in lengths:
            number = synth.with_luhn(prefix, n, RNG)
            for shown in (number, synth.grouped(number), synth.grouped(number, "-")):
                text = f"Pay with card {shown} today."
                entities = _found(text)
                assert entities and entities[0][1] == shown, (brand, shown, entities)
                assert entities[0][0] in ("CREDIT_CARD", "CN_BANK_CARD")


NEAR_MISSES = [
    f"身份证号{synth.cn_id(RNG, valid=False)}校验不通过",  # wrong check character
    "身份证号11010519491331002X",  # month 13
    "编号12345678901",  # 11 digits, not a 1[3-9] segment
    "订单号13812345678已发货",  # a mobile's shape, but an order number
    "timestamp 1732982400123",
    "Order #4532015112 shipped",  # ten digits: read as a US number by phonenumbers
    # A label after a number only where nothing before says otherwise, and only as a word.
    "order 4532015 office supplies",
    "room 4532015 offices",
    "ticket 45 32 01 fax",  # six digits: no phone number
    "build 10.0.0.1.5",  # a dotted version, not an address
    "total 1,234,567.89",
    "ISBN 978-3-16-148410-0",
    "the 2026-11-30 12:30:45 run",
    "ref 4111111111111112",  # 16 digits, Luhn fails
    "Mrs. Karen Suite 680 36 4022 Oakridge",  # spaced 3-2-4 address numbers are not an SSN
    "std::vector<int> and a::b",
    "tell me 3/23/1940",
    "meet me (at) noon, or [at] 3pm",  # a spelled `at` without a domain after it
    "see you at example dot com",  # bare words are not read as separators (too common in prose)
    "a double espresso, a triple shot and one two three four five six",  # repeats outside a run
    "double five double five double five",  # three units: shorter than any number
    "句号．结束",
    "一二三四五六七八九十，二〇二六年一月一日",  # counting and dates in Chinese numerals
    "他数了一二三四五六七八九〇一二三四五遍",  # a numeral run that validates as nothing
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyIn0 and Professional International",  # text, no PII
    # Digits inside a hash or a mixed identifier are not read apart from their letters.
    f"sha 3f2a9c1b0d{MOBILE}ab12 and commit a1b2{ID}c3",
    "h264 1080p x86_64 mp3 v2 iPhone15",
    "count one two three four five six seven eight nine, then nine eight seven six five four three",
    "someone said one two three four five six seven eight nine ten eleven",
    # Regrouped digits that are no card: no card word and not one digit at a time, or no Luhn.
    f"times {VISA[:4]} {VISA[4:6]} {VISA[6:8]} {VISA[8:10]} {VISA[10:12]} {VISA[12:]}",
    "at 2026 12 03 17 09 54 12 and 2026/12/03 17:09:54.123",
    "numbers 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9",
    "",
]


@pytest.mark.parametrize("text", NEAR_MISSES)
def test_near_misses_are_not_pii(text: str) -> None:
    if text.startswith("ref "):
        assert not luhn_ok(text.split()[1])
    assert _found(text) == []


def test_generated_values_are_what_they_claim() -> None:
    assert all(cn_id_ok(synth.cn_id(RNG)) for _ in range(200))
    assert not any(cn_id_ok(synth.cn_id(RNG, valid=False)) for _ in range(200))
    assert all(iban_ok(synth.iban(RNG)) for _ in range(200))
    assert all(luhn_ok(synth.cn_bank_card(RNG)) for _ in range(200))


def test_replacements_and_keyed_hash() -> None:
    text = f"卡号{BANK}，再说一遍 {synth.grouped(BANK)}"
    masked, spans = ENGINE.redact(text, replacer(Replacement.MASK))
    assert masked == "卡号[REDACTED]，再说一遍 [REDACTED]" and len(spans) == 2
    typed, _ = ENGINE.redact(text, replacer(Replacement.ENTITY))
    assert typed == "卡号<CN_BANK_CARD>，再说一遍 <CN_BANK_CARD>"
    hashed, _ = ENGINE.redact(text, replacer(Replacement.HASH, b"k1"))
    tokens = [t for t in hashed.replace("，", " ").split() if t.startswith("<") or "<" in t]
    assert len({t[t.index("<") :] for t in tokens}) == 1  # one card written two ways: one token
    other, _ = ENGINE.redact(text, replacer(Replacement.HASH, b"k2"))
    assert other != hashed and BANK not in hashed
    with pytest.raises(ValueError, match="key"):
        replacer(Replacement.HASH)


def test_offsets_map_back_through_full_width_text() -> None:
    text = f"ＩＤ：{_fw(ID)}。"
    (span,) = ENGINE.analyze(text)
    assert text[span.start : span.end] == _fw(ID)


@pytest.mark.parametrize("mark", ["\u200b", "\u200d", "\u2060", "\ufeff", "\u202e", "\ufe0f"])
def test_invisible_characters_do_not_hide_an_entity(mark: str) -> None:
    text = f"身份证 {ID[:6]}{mark}{ID[6:12]}{mark}{ID[12:]} ok"
    (span,) = ENGINE.analyze(text)
    assert (
        span.entity == "CN_RESIDENT_ID"
        and text[span.start : span.end] == ID[:6] + mark + ID[6:12] + mark + ID[12:]
    )


def test_digits_spelled_in_invisible_tag_characters_are_found() -> None:
    hidden = "".join(chr(0xE0000 + ord(c)) for c in ID)
    (span,) = ENGINE.analyze(f"see {hidden} here")
    assert span.entity == "CN_RESIDENT_ID" and span.end - span.start == len(hidden)


@pytest.mark.parametrize(
    ("hidden", "entity"),
    [
        ("13800138000", "CN_MOBILE"),
        ("write to john.doe@example.com", "EMAIL_ADDRESS"),
        ("4111 1111 1111 1111", "CREDIT_CARD"),
        (f"身份证 {ID}", "CN_RESIDENT_ID"),
        (base64.b64encode(b"13800138000").decode(), "CN_MOBILE"),  # an encoding inside them
    ],
)
def test_pii_in_the_bytes_of_variation_selectors_is_found_as_the_whole_run(hidden: str, entity: str) -> None:
    run = in_selectors(hidden)
    text = f"Nice day \U0001f600{run} ok"
    (span,) = ENGINE.analyze(text)
    assert span.entity == entity and text[span.start : span.end] == run


@pytest.mark.parametrize(
    "text",
    [
        "I \u2764\ufe0f it",  # one selector choosing a glyph
        f"\U0001f600{in_selectors('hello world')}",  # text, but no PII
        "\U0001f600" + "".join(chr(0xE0100 + 200) for _ in range(11)),  # bytes that are no UTF-8
    ],
)
def test_selectors_without_pii_are_no_finding(text: str) -> None:
    assert ENGINE.analyze(text) == []


def test_a_number_next_to_a_run_of_selectors_is_redacted_with_it() -> None:
    text = f"13800138000{in_selectors(ID)}后"
    out, _ = ENGINE.redact(text, replacer(Replacement.ENTITY))
    assert out.endswith("后") and not any(c.isdigit() or 0xE0100 <= ord(c) < 0xE01F0 for c in out), out


def test_custom_patterns_with_context_and_threshold() -> None:
    eng = PiiEngine(
        ["EMPLOYEE_ID", "EMAIL_ADDRESS"],
        threshold=0.6,
        patterns=[CustomPattern("EMPLOYEE_ID", r"EMP-\d{6}", 0.9, ("工号", "employee"))],
    )
    assert [s.entity for s in eng.analyze("工号EMP-123456")] == ["EMPLOYEE_ID"]
    assert eng.analyze("code EMP-123456") == []  # no context word before it
    assert eng.analyze(f"card {VISA}") == []  # not an entity this engine looks for
    with pytest.raises(ValueError, match="unknown entities"):
        PiiEngine(["NOPE"])


def test_overlaps_keep_the_best_finding() -> None:
    # A Gansu ID (62…) can pass Luhn too: the checked ID wins over a card.
    gansu = next(v for v in (synth.cn_id(RNG) for _ in range(20000)) if v.startswith("62") and luhn_ok(v))
    assert _found(f"身份证{gansu}") == [("CN_RESIDENT_ID", gansu)]
    spans = ENGINE.analyze(f"a {VISA} b a@b.co")
    assert all(isinstance(s, Span) for s in spans)
    assert [s.start for s in spans] == sorted(s.start for s in spans)


@pytest.fixture(scope="module")
def names_engine() -> PiiEngine:
    return PiiEngine(["EMAIL_ADDRESS", "PERSON"], names=["en", "zh"])


def test_names_are_opt_in_and_found_in_both_languages(names_engine: PiiEngine) -> None:
    text = "Please send the report to John Smith today. 请联系张伟，邮箱a@b.co"
    found = [(s.entity, text[s.start : s.end]) for s in names_engine.analyze(text)]
    assert ("PERSON", "John Smith") in found and ("PERSON", "张伟") in found
    assert ("EMAIL_ADDRESS", "a@b.co") in found
    assert all(s.entity != "PERSON" for s in ENGINE.analyze(text))  # off by default
    with pytest.raises(ValueError, match="unknown entities"):
        PiiEngine(["PERSON"])  # asking for names without turning them on


def test_streamed_names_are_held_until_whole(names_engine: PiiEngine) -> None:
    from classifiers.pii.stream import StreamRedactor

    text = "Please send the report to John Smith and Mary Jones before noon."
    whole, _ = names_engine.redact(text, replacer(Replacement.ENTITY))
    for step in (1, 2, 3, 5):
        red = StreamRedactor(names_engine, replacer(Replacement.ENTITY))
        out = "".join(red.push(0, text[i : i + step]) for i in range(0, len(text), step)) + red.flush(0)
        assert "John" not in out and "Smith" not in out and "Jones" not in out, (step, out)
        assert out == whole
