"""Check digits and structure of the numbers the recognizers look for.

Pure functions on digit strings; the recognizers call them after a regex matched, so a number
with a wrong check digit or an impossible date is a near miss, not an entity.
"""

from __future__ import annotations

import datetime as dt

# GB/T 2260 province-level codes: the first two digits of a resident ID.
CN_PROVINCES = frozenset(
    {11, 12, 13, 14, 15, 21, 22, 23, 31, 32, 33, 34, 35, 36, 37, 41, 42, 43, 44, 45, 46}
    | {50, 51, 52, 53, 54, 61, 62, 63, 64, 65, 71, 81, 82, 83, 91}
)
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"


def digits_only(text: str) -> str:
    """The digits of a grouped number (`6222 0000 …`, `110101-19900307-123X`), X kept."""
    return "".join(c for c in text if c.isdigit() or c in "Xx").upper()


def luhn_ok(digits: str) -> bool:
    """ISO/IEC 7812 Luhn check on a string of digits."""
    if not digits.isdigit():
        return False
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def cn_id_check_char(first17: str) -> str:
    """The ISO 7064 MOD 11-2 check character of an 18-character resident ID."""
    return _ID_CHECK[sum(int(c) * w for c, w in zip(first17, _ID_WEIGHTS, strict=True)) % 11]


def _real_date(year: int, month: int, day: int, *, latest: dt.date | None = None) -> bool:
    try:
        d = dt.date(year, month, day)
    except ValueError:
        return False
    return dt.date(1900, 1, 1) <= d <= (latest or dt.date.today())


def cn_id_structure(value: str) -> bool:
    """Province code and a real birth date: it reads as a resident ID (check char not tested)."""
    if len(value) != 18 or not value[:17].isdigit():
        return False
    return int(value[:2]) in CN_PROVINCES and _real_date(
        int(value[6:10]), int(value[10:12]), int(value[12:14])
    )


def cn_id_ok(value: str) -> bool:
    """An 18-character GB 11643 resident ID: structure and check character."""
    return cn_id_structure(value) and cn_id_check_char(value[:17]) == value[17].upper()


def cn_id15_ok(value: str) -> bool:
    """A legacy 15-digit ID (19yy birth dates, no check digit)."""
    return (
        len(value) == 15
        and value.isdigit()
        and int(value[:2]) in CN_PROVINCES
        and _real_date(1900 + int(value[6:8]), int(value[8:10]), int(value[10:12]))
    )


def iban_ok(value: str) -> bool:
    """ISO 13616 mod-97 check on an IBAN with its spaces removed."""
    v = value.replace(" ", "").upper()
    if not (15 <= len(v) <= 34 and v[:2].isalpha() and v[2:4].isdigit() and v.isalnum()):
        return False
    moved = v[4:] + v[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def card_brand(digits: str) -> str | None:
    """The card scheme a number's prefix and length belong to, or None."""
    n = len(digits)
    p2, p3, p4, p6 = int(digits[:2]), int(digits[:3]), int(digits[:4]), int(digits[:6])
    if digits[0] == "4" and n in (13, 16, 19):
        return "visa"
    if (51 <= p2 <= 55 or 2221 <= p4 <= 2720) and n == 16:
        return "mastercard"
    if p2 in (34, 37) and n == 15:
        return "amex"
    if p2 == 62 and 16 <= n <= 19:
        return "unionpay"
    if (p4 == 6011 or 644 <= p3 <= 649 or p2 == 65 or 622126 <= p6 <= 622925) and 16 <= n <= 19:
        return "discover"
    if 3528 <= p4 <= 3589 and 15 <= n <= 19:
        return "jcb"
    if (300 <= p3 <= 305 or p2 in (36, 38, 39)) and 14 <= n <= 19:
        return "diners"
    if p2 == 81 and 16 <= n <= 19:
        return "unionpay"
    if (p2 == 50 or 56 <= p2 <= 69) and 12 <= n <= 19:
        return "maestro"
    return None
