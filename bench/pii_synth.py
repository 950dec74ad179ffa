"""Generated PII and near misses for tests and the accuracy report (docs/pii.md).

No public span-labelled data has Chinese resident IDs, mobiles or bank cards, so they are made
here with real check digits (GB 11643, Luhn, mod 97), next to near misses that must not be
found: order numbers, timestamps, IDs with a wrong check character, 11-digit non-phones.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass

from classifiers.pii._checks import CN_PROVINCES, cn_id_check_char, luhn_ok

_PROVINCES = sorted(CN_PROVINCES)


def cn_id(rng: random.Random, *, valid: bool = True) -> str:
    """An 18-character resident ID; with a wrong check character when `valid` is False."""
    birth = dt.date(1940, 1, 1) + dt.timedelta(days=rng.randrange(365 * 70))
    first17 = f"{rng.choice(_PROVINCES)}{rng.randrange(10000):04d}{birth:%Y%m%d}{rng.randrange(1000):03d}"
    check = cn_id_check_char(first17)
    if not valid:
        check = rng.choice([c for c in "0123456789X" if c != check])
    return first17 + check


def cn_mobile(rng: random.Random, form: str = "plain") -> str:
    """A mainland mobile: plain, grouped (`138 0013 8000` / `138-0013-8000`) or with +86/0086."""
    digits = f"1{rng.randint(3, 9)}{rng.randrange(10**9):09d}"
    grouped = {"space": " ", "dash": "-"}.get(form)
    if grouped:
        return f"{digits[:3]}{grouped}{digits[3:7]}{grouped}{digits[7:]}"
    if form == "+86":
        return f"+86 {digits}"
    if form == "0086":
        return f"0086{digits}"
    return digits


def with_luhn(prefix: str, length: int, rng: random.Random) -> str:
    """`prefix` + random digits + the Luhn check digit, `length` digits in all."""
    body = prefix + "".join(str(rng.randrange(10)) for _ in range(length - len(prefix) - 1))
    for d in "0123456789":
        if luhn_ok(body + d):
            return body + d
    raise AssertionError("unreachable")


# (brand, prefixes, lengths): every scheme and length the recognizer promises.
CARD_BRANDS: tuple[tuple[str, tuple[str, ...], tuple[int, ...]], ...] = (
    ("visa", ("4",), (13, 16, 19)),
    ("mastercard", ("51", "55", "2221", "2720", "2500"), (16,)),
    ("amex", ("34", "37"), (15,)),
    ("discover", ("6011", "65", "644"), (16, 19)),
    ("jcb", ("3528", "3589"), (15, 16, 19)),
    ("diners", ("300", "36", "38"), (14, 16)),
    ("maestro", ("5018", "5038", "6304", "6759", "676770"), (12, 13, 15, 16, 19)),
    ("unionpay", ("62",), (16, 17, 18, 19)),
)


def card(rng: random.Random, brand: str | None = None) -> str:
    """A Luhn-valid card number of `brand` (random brand and length if None)."""
    _, prefixes, lengths = next(x for x in CARD_BRANDS if x[0] == brand) if brand else rng.choice(CARD_BRANDS)
    return with_luhn(rng.choice(prefixes), rng.choice(lengths), rng)


def grouped(number: str, sep: str = " ") -> str:
    """A card number grouped the way it is printed: 4-6-5 for 15 digits, else by 4."""
    if len(number) == 15:
        return sep.join((number[:4], number[4:10], number[10:]))
    return sep.join(number[i : i + 4] for i in range(0, len(number), 4))


def cn_bank_card(rng: random.Random) -> str:
    """A UnionPay debit/credit card number (62…, 16-19 digits, Luhn-valid)."""
    return with_luhn(rng.choice(("622202", "622848", "621700", "623668", "62")), rng.choice((16, 19)), rng)


def iban(rng: random.Random) -> str:
    """A mod-97-valid IBAN (DE, GB, FR, ES or NL layout)."""
    country, bban_len = rng.choice((("DE", 18), ("GB", 18), ("FR", 23), ("ES", 20), ("NL", 14)))
    if country in ("GB", "NL"):
        bban = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(4))
        bban += "".join(str(rng.randrange(10)) for _ in range(bban_len - 4))
    else:
        bban = "".join(str(rng.randrange(10)) for _ in range(bban_len))
    moved = bban + country + "00"
    check = 98 - int("".join(str(int(c, 36)) for c in moved)) % 97
    return f"{country}{check:02d}{bban}"


def email(rng: random.Random) -> str:
    """An e-mail address."""
    user = rng.choice(("zhang.san", "li_si", "wang5", "j.doe+news", "mary"))
    return (
        f"{user}{rng.randrange(100)}@{rng.choice(('example.com', 'mail.cn', 'corp.example.org', 'qq.com'))}"
    )


def ssn(rng: random.Random) -> str:
    """A US SSN in the usual 3-2-4 form."""
    return f"{rng.randint(1, 665):03d}-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}"


def ipv4(rng: random.Random) -> str:
    """A dotted-quad IPv4 address."""
    return ".".join(str(rng.randint(1, 254)) for _ in range(4))


def ipv6(rng: random.Random) -> str:
    """A compressed IPv6 address."""
    return f"2001:db8:{rng.randrange(65536):x}::{rng.randrange(65536):x}"


@dataclass(frozen=True, slots=True)
class Labelled:
    """A text and its expected entities as (start, end, entity)."""

    text: str
    spans: tuple[tuple[int, int, str], ...]


_CN_TEMPLATES = (
    ("我的身份证号是{v}，请帮我查一下。", "CN_RESIDENT_ID", "id"),
    ("身份证：{v}", "CN_RESIDENT_ID", "id"),
    ("患者王某，身份证号码{v}，已入院。", "CN_RESIDENT_ID", "id"),
    ("证件号 {v} 已核验", "CN_RESIDENT_ID", "id_grouped"),
    ("请拨打{v}联系我", "CN_MOBILE", "mobile"),
    ("联系电话：{v}", "CN_MOBILE", "mobile_grouped"),
    ("手机号{v}，微信同号。", "CN_MOBILE", "mobile_plus"),
    ("他的号码是{v}吗？", "CN_MOBILE", "mobile"),
    ("请转账到我的银行卡{v}，谢谢", "CN_BANK_CARD", "bank"),
    ("收款卡号：{v}", "CN_BANK_CARD", "bank_grouped"),
    ("我用尾号不详的储蓄卡{v}付款", "CN_BANK_CARD", "bank"),
    ("信用卡号{v}已冻结", "CREDIT_CARD", "card"),
    ("邮箱{v}谢谢", "EMAIL_ADDRESS", "email"),
    ("服务器IP地址{v}无法访问", "IP_ADDRESS", "ipv4"),
)


def _value(kind: str, rng: random.Random) -> str:
    if kind == "id":
        return cn_id(rng)
    if kind == "id_grouped":
        v = cn_id(rng)
        return f"{v[:6]} {v[6:14]} {v[14:]}"
    if kind == "mobile":
        return cn_mobile(rng)
    if kind == "mobile_grouped":
        return cn_mobile(rng, rng.choice(("space", "dash")))
    if kind == "mobile_plus":
        return cn_mobile(rng, rng.choice(("+86", "0086", "plain")))
    if kind == "bank":
        return cn_bank_card(rng)
    if kind == "bank_grouped":
        return grouped(cn_bank_card(rng))
    if kind == "card":
        return card(rng, rng.choice(("visa", "mastercard", "amex", "jcb")))
    if kind == "email":
        return email(rng)
    return ipv4(rng)


def chinese_set(n: int, seed: int = 7) -> list[Labelled]:
    """Chinese sentences with one entity each, full-width digits in some."""
    rng = random.Random(seed)
    out: list[Labelled] = []
    for _ in range(n):
        template, entity, kind = rng.choice(_CN_TEMPLATES)
        value = _value(kind, rng)
        if kind in ("id", "mobile", "bank") and rng.random() < 0.1:
            value = value.translate({ord(c): ord(c) + 0xFEE0 for c in "0123456789"})  # full-width
        start = template.index("{v}")
        text = template.format(v=value)
        out.append(Labelled(text, ((start, start + len(value), entity),)))
    return out


_EN_TEMPLATES = (
    ("Please charge my card {v} for the renewal.", "CREDIT_CARD"),
    ("Card number: {v}, expiry 04/29.", "CREDIT_CARD"),
    ("I paid with {v} yesterday", "CREDIT_CARD"),
    ("Send the invoice to {v} please.", "EMAIL_ADDRESS"),
    ("Wire it to IBAN {v} by Friday.", "IBAN_CODE"),
    ("The login came from {v} at night.", "IP_ADDRESS"),
    ("My SSN is {v}.", "US_SSN"),
)


def _en_value(entity: str, rng: random.Random) -> str:
    if entity == "CREDIT_CARD":
        number = card(rng)
        return rng.choice((number, grouped(number), grouped(number, "-")))
    if entity == "EMAIL_ADDRESS":
        return email(rng)
    if entity == "IBAN_CODE":
        v = iban(rng)
        return v if rng.random() < 0.5 else " ".join(v[i : i + 4] for i in range(0, len(v), 4))
    if entity == "IP_ADDRESS":
        return ipv4(rng) if rng.random() < 0.7 else ipv6(rng)
    return ssn(rng)


def english_set(n: int, seed: int = 13) -> list[Labelled]:
    """English sentences with one entity each: cards of every scheme and length (plain, grouped
    by spaces or dashes), e-mail, IBAN (plain or grouped), IPv4/IPv6, SSN."""
    rng = random.Random(seed)
    out: list[Labelled] = []
    for _ in range(n):
        template, entity = rng.choice(_EN_TEMPLATES)
        value = _en_value(entity, rng)
        start = template.index("{v}")
        out.append(Labelled(template.format(v=value), ((start, start + len(value), entity),)))
    return out


def near_misses(n: int, seed: int = 11) -> list[str]:
    """Number-heavy text that holds no PII: a detector should find nothing here."""
    rng = random.Random(seed)
    makers = (
        lambda: f"订单号{rng.randrange(10**15, 10**16)}已发货",
        lambda: (
            f"Order #{rng.randrange(10**9, 10**10)} shipped at {rng.randrange(1_600_000_000, 1_800_000_000)}"
        ),
        lambda: f"timestamp {rng.randrange(1_600_000_000_000, 1_800_000_000_000)} ms",
        lambda: f"身份证号{cn_id(rng, valid=False)}校验失败",
        lambda: f"编号{rng.choice(('10', '11', '12', '20', '95'))}{rng.randrange(10**9):09d}",
        lambda: f"{rng.choice(('10', '11', '12'))}{rng.randrange(10**9):09d}",
        lambda: (
            f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
        ),
        lambda: f"版本 {rng.randint(1, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 99)}",
        lambda: f"total {rng.randint(1, 999)},{rng.randint(100, 999)}.{rng.randint(10, 99)} 元",
        lambda: f"tracking {rng.randrange(10**11, 10**12)}",
        lambda: "".join(str(rng.randrange(10)) for _ in range(16)) + " (invalid)",
        lambda: (
            f"ISBN 978-{rng.randint(0, 9)}-{rng.randint(100, 999)}-{rng.randint(10000, 99999)}-{rng.randint(0, 9)}"
        ),
    )
    out: list[str] = []
    while len(out) < n:
        text = rng.choice(makers)()
        # A random 16-digit run is Luhn-valid one time in ten: keep only the ones that are not.
        digits = "".join(c for c in text if c.isdigit())
        if "(invalid)" in text and luhn_ok(digits):
            continue
        out.append(text)
    return out
