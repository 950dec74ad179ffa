"""Text that reads as an attack to a person but not to a model: look-alike letters and spaced-out words.

An attacker keeps an instruction legible while changing every token a classifier sees:
- letters from another script that look Latin (Cyrillic `о`, Greek `ο` inside "ignоre"): folded
  to the Latin letter inside a word that also holds Latin letters, and in words made of them
  alone ("СОРУ", "ОВЕУ") where the text is Latin (its other Cyrillic and Greek letters, those
  that look like no Latin one, are fewer than a fifth of its Latin letters), so Russian or Greek
  text is read as written;
- styled letters (mathematical bold or script `𝐢𝐠𝐧𝐨𝐫𝐞`, circled `ⓘⓖⓝ`, small capitals `ɪɢɴ`):
  always folded to ASCII, which is all they are;
- combining marks stacked on Latin letters ("Zalgo", strike-through `I̶g̶n̶`): dropped after a
  Latin letter, so scripts that need their marks keep them;
- letters spelled out one at a time (`I g n o r e`, `I.g.n.o.r.e`, `忽 略 之 前`): three or more
  single letters with one and the same separator are joined into the word they spell;
- leetspeak (`1gn0r3 pr3v10u5 1N57RUC710N5`): in a word of letters and `0 1 3 4 5 7` alone
  where some of those digits stand between two letters, they read as `o i e a s t` (so
  `gpt4`, `h264`, `x86`, `covid19`, `1st`, `35mm`, `2024`, `ID110105`, `0x1F` and hex words
  such as a UUID's `0b7f5c1e` stay).
Only what the injection model reads (runtime.reading_form); the text that travels is left as it was.
"""

from __future__ import annotations

import re
import unicodedata

# Cyrillic and Greek letters (and a few IPA ones) that render like a Latin letter.
_CONFUSABLE_PAIRS = (
    "аa вB еe іi јj кk оo рp сc уy хx ѕs ԁd ԛq ԝw һh ӏl ɑa ɡg ıi ɩi ʏy "
    "АA ВB ЕE КK МM НH ОO РP СC ТT ХX УY ІI ЈJ ЅS ԚQ ԜW "
    "ΑA ΒB ΕE ΖZ ΗH ΙI ΚK ΜM ΝN ΟO ΡP ΤT ΥY ΧX οo νv ιi κk ρp υu χx αa ϲc ϳj"
)
CONFUSABLE: dict[int, str] = {ord(p[0]): p[1] for p in _CONFUSABLE_PAIRS.split()}

_SMALL_CAPS = "ᴀa ʙb ᴄc ᴅd ᴇe ꜰf ɢg ʜh ɪi ᴊj ᴋk ʟl ᴍm ɴn ᴏo ᴘp ʀr ꜱs ᴛt ᴜu ᴠv ᴡw ʏy ᴢz"


def _styled() -> dict[int, str]:
    """Styled Latin letters and digits → ASCII (their compatibility decomposition, where it is ASCII)."""
    table: dict[int, str] = {}
    for start, end in ((0x1D400, 0x1D7FF), (0x2460, 0x24FF), (0x1F130, 0x1F189)):
        for cp in range(start, end + 1):
            folded = unicodedata.normalize("NFKC", chr(cp))
            if folded != chr(cp) and folded.isascii() and folded.isalnum():
                table[cp] = folded
    # Negative squared and negative circled capitals have no decomposition: by position.
    table.update({cp: chr(ord("A") + cp - 0x1F150) for cp in range(0x1F150, 0x1F16A)})
    table.update({cp: chr(ord("A") + cp - 0x1F170) for cp in range(0x1F170, 0x1F18A)})
    table.update({ord(p[0]): p[1] for p in _SMALL_CAPS.split()})
    return table


# For str.translate, always applied: styled letters carry no meaning beyond their ASCII.
STYLED: dict[int, str] = _styled()

_CONF_CLASS = "".join(chr(cp) for cp in CONFUSABLE)
_ANY_CONFUSABLE = re.compile(f"[{_CONF_CLASS}]")
# Words; one holding a look-alike is folded only when it also holds a Latin letter.
_WORD = re.compile(r"[^\W\d_]+")
_LATIN = re.compile(r"[A-Za-z]")
_MARK_CLASS = "[\u0300-\u036f\u0489\u1ab0-\u1aff\u20d0-\u20ff\ufe20-\ufe2f]"
_ANY_MARK = re.compile(_MARK_CLASS)
_MARKS = re.compile(rf"(?<=[A-Za-z]){_MARK_CLASS}+")
# Three or more single letters, each followed by the same one separator (the last by none).
_SPELLED = re.compile(r"(?<![^\W\d_])[^\W\d_]([ .\-_*·/|])(?:[^\W\d_]\1)+[^\W\d_](?![^\W\d_])")


# Cyrillic and Greek letters that look like no Latin letter: the text really is in that script.
_OWN_LETTER = re.compile(
    "[^\\W\\d_"
    + _CONF_CLASS
    + "\u0000-\u036f\u0530-\U0010ffff]"  # i.e. the Greek and Cyrillic blocks, U+0370-U+052F
)


def _fold_mixed(m: re.Match[str]) -> str:
    word = m.group()
    if word.isascii() or not _LATIN.search(word):
        return word
    return word.translate(CONFUSABLE)


def _fold_lookalike(m: re.Match[str]) -> str:
    """In Latin text: also a word of look-alikes alone (a word with letters of its own script is
    that script's word and is kept)."""
    word = m.group()
    if word.isascii() or (not _LATIN.search(word) and _OWN_LETTER.search(word)):
        return word
    return word.translate(CONFUSABLE)


def _latin_text(text: str) -> bool:
    latin = len(_LATIN.findall(text))
    return latin > 0 and 5 * len(_OWN_LETTER.findall(text)) < latin


# Words of letters and the digits leetspeak uses, with such digits between two letters.
_LEET_WORD = re.compile(r"(?<!\w)(?=\w*[A-Za-z][013457]+[A-Za-z])[A-Za-z013457]{3,}(?!\w)")
# The quick tests before the word scan (a third of texts hold such a digit, 1% one inside a word).
_LEET_DIGIT = re.compile(r"[013457]")
_LEET_INSIDE = re.compile(r"[A-Za-z][013457]+[A-Za-z]")
_LEET = str.maketrans("013457", "oieast")
_LEET_UPPER = str.maketrans("013457", "OIEAST")
_FOUR_DIGITS = re.compile(r"\d{4}")
_HEX_WORD = re.compile(r"[0-9a-fA-F]+")  # a hash's or a UUID's digits, not leetspeak


def _unleet(m: re.Match[str]) -> str:
    word = m.group()
    if _FOUR_DIGITS.search(word) or word.startswith("0x") or _HEX_WORD.fullmatch(word):
        return word
    letters = [c for c in word if c.isalpha()]
    return word.translate(_LEET_UPPER if all(c.isupper() for c in letters) else _LEET)


def _join(m: re.Match[str]) -> str:
    return m.group().replace(m.group(1), "")


def unmask(text: str) -> str:
    """Look-alikes folded, stacked marks dropped, spelled-out words joined (after STYLED is applied)."""
    if not text.isascii():
        if _ANY_MARK.search(text):
            text = _MARKS.sub("", text)
        if _ANY_CONFUSABLE.search(text):
            text = _WORD.sub(_fold_lookalike if _latin_text(text) else _fold_mixed, text)
    text = _SPELLED.sub(_join, text)
    if _LEET_DIGIT.search(text) and _LEET_INSIDE.search(text):
        text = _LEET_WORD.sub(_unleet, text)
    return text
