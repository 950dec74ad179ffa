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
from collections.abc import Iterable, Sequence
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


def parse(lines: Iterable[str]) -> list[Row]:
    """Rows of JSONL lines `{"text", "label", "source"}` (the pool's format)."""
    return [Row(d["text"], int(d["label"]), d["source"]) for d in map(json.loads, lines)]


def load(path: Path) -> list[Row]:
    """Rows of one JSONL file of the pool."""
    with path.open(encoding="utf-8") as f:
        return parse(f)


def held_out_with(family: str) -> frozenset[str]:
    """`family` and every family that shares text with it."""
    return frozenset({family}) | RELATED.get(family, frozenset())


def split_calibration(rows: Sequence[Row], seed: int) -> tuple[list[Row], list[Row]]:
    """(calibration, training): a seeded tenth of the rows is held back to set the threshold."""
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)  # noqa: S311 - a reproducible split, not a secret
    return shuffled[: len(rows) // 10], shuffled[len(rows) // 10 :]
