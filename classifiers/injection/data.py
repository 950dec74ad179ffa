"""The injection pool (`../shared/datasets/injection`): rows, source families, languages.

A *family* is the repository a row came from (the `source` up to its first colon). Families that
share text (translations, one built from another's sentences) are *related*: holding one out
of training holds its relatives out too, or a "held-out" score would be measured on text the
model has seen.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DATASETS = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "injection"

# Families whose texts overlap (README "Caveats" and the build notes): held out together.
RELATED: dict[str, frozenset[str]] = {
    "XSafety": frozenset({"CMRC2018+XSafety-zh"}),
    "CMRC2018+XSafety-zh": frozenset({"XSafety", "CMRC2018"}),
    "CMRC2018": frozenset({"CMRC2018+XSafety-zh"}),
    "awesome-chatgpt-prompts(prompts.chat)": frozenset({"awesome-chatgpt-prompts-zh"}),
    "awesome-chatgpt-prompts-zh": frozenset({"awesome-chatgpt-prompts(prompts.chat)"}),
    "GPTFuzz": frozenset({"verazuo/jailbreak_llms"}),
    "verazuo/jailbreak_llms": frozenset({"GPTFuzz"}),
    "FastChat": frozenset({"MT-Bench-ZH"}),
    "MT-Bench-ZH": frozenset({"FastChat"}),
}

_HAN = re.compile(r"[\u3400-\u9fff]")
_LATIN = re.compile(r"[A-Za-z]")


@dataclass(frozen=True, slots=True)
class Row:
    """One labelled text: 1 = injection or jailbreak, 0 = benign."""

    text: str
    label: int
    source: str
    # Where the attack sits in `text` (character span), when it is known: the augmentations insert
    # one into a benign document. Training then labels each window of a long text by whether it
    # holds the attack, instead of guessing from the teacher.
    mark: tuple[int, int] | None = None

    @property
    def family(self) -> str:
        """The repository the row came from."""
        return self.source.split(":", 1)[0]

    @property
    def language(self) -> str:
        """zh when Han characters make up a fifth of the letters, en when Latin letters dominate, else other."""
        han = len(_HAN.findall(self.text))
        latin = len(_LATIN.findall(self.text))
        letters = sum(c.isalpha() for c in self.text) or 1
        if han / letters >= 0.2:
            return "zh"
        return "en" if latin / letters >= 0.8 else "other"


def load(path: Path) -> list[Row]:
    """Rows of one JSONL file of the pool."""
    with path.open(encoding="utf-8") as f:
        return [Row(d["text"], int(d["label"]), d["source"]) for d in map(json.loads, f)]


def held_out_with(family: str) -> frozenset[str]:
    """`family` and every family that shares text with it."""
    return frozenset({family}) | RELATED.get(family, frozenset())


def split_calibration(rows: Sequence[Row], seed: int) -> tuple[list[Row], list[Row]]:
    """(calibration, training): a seeded tenth of the rows is held back to set the threshold."""
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)  # noqa: S311 - a reproducible split, not a secret
    return shuffled[: len(rows) // 10], shuffled[len(rows) // 10 :]


def mark_insertions(rows: Sequence[Row], min_context: int = 200, key: int = 40) -> list[Row]:
    """`rows`, with each attack that is a benign row of its family plus an inserted instruction
    (BIPIA's recipe: an attack put at the start, middle or end of a real email, table or code
    context) marked where the insertion is. Only contexts of `min_context` characters or more are
    matched: shorter texts fit one window, where the mark changes nothing."""
    heads: dict[tuple[str, str], list[str]] = {}
    tails: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.label == 0 and len(r.text) >= min_context:
            heads.setdefault((r.family, r.text[:key]), []).append(r.text)
            tails.setdefault((r.family, r.text[-key:]), []).append(r.text)
    out = []
    for r in rows:
        t, mark = r.text, r.mark
        if r.label == 1 and mark is None and len(t) > min_context:
            for c in heads.get((r.family, t[:key]), []) + tails.get((r.family, t[-key:]), []):
                if len(c) >= len(t):
                    continue
                head = _common_prefix(t, c)
                tail = min(_common_prefix(t[::-1], c[::-1]), len(c) - head)
                if head + tail == len(c):
                    mark = (head, len(t) - tail)
                    break
        out.append(r if mark == r.mark else Row(t, 1, r.source, mark))
    return out


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
