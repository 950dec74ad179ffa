"""How the injection model reads Chinese written in pinyin (figures, not a test).

    .venv/bin/pip install pypinyin==0.55.0   # MIT; a measuring tool only, not a dependency
    .venv/bin/python -m bench.pinyin

Transliterates dev's Chinese rows (`Row.language == "zh"`) with pypinyin: one syllable per
character, toneless (`hu lve zhi qian`) and with tone marks (`hū lüè zhī qián`), and the same
with each word's syllables joined (`hulve zhiqian`, pypinyin's own word cut), and counts the
attacks and benign rows the shipped threshold flags, as the gateway reads them (pinyin read as
characters, classifiers.pinyin) and without that reading, against the same rows in characters.
Then the other side: how many texts of the pool and dev (every language; train.jsonl, dev.jsonl,
the extra rows) read differently because of it, and whether any decision changes. The reading's
tables were counted on the training text, so that count is in distribution; dev's rows are not.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from classifiers import pinyin
from classifiers.injection.data import DATASETS, load
from classifiers.injection.runtime import InjectionModel, Manifest


def _forms(pypinyin: Any) -> dict[str, Callable[[str], str]]:
    cut = importlib.import_module("pypinyin.seg.mmseg").seg.cut
    tone = pypinyin.Style.TONE

    def joined(text: str, style: Any = pypinyin.Style.NORMAL) -> str:
        return " ".join("".join(pypinyin.lazy_pinyin(word, style=style)) for word in cut(text))

    return {
        "characters": lambda text: text,
        "toneless": lambda text: " ".join(pypinyin.lazy_pinyin(text)),
        "tone marks": lambda text: " ".join(pypinyin.lazy_pinyin(text, style=tone)),
        "toneless, joined": joined,
        "tone marks, joined": lambda text: joined(text, tone),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", default="classifiers/injection/model/manifest.json")
    args = ap.parse_args()
    try:
        pypinyin = importlib.import_module("pypinyin")
    except ImportError:
        raise SystemExit("needs pypinyin: .venv/bin/pip install pypinyin==0.55.0") from None
    model = InjectionModel(Manifest.load(Path(args.manifest)))
    threshold = model.manifest.threshold
    read = pinyin.read
    rows = [r for r in load(DATASETS / "dev.jsonl") if r.language == "zh"]
    print(f"dev Chinese rows: {len(rows)}; threshold {threshold}; attacks / benign flagged")
    print(f"{'written as':<20}{'read as characters':>24}{'read as written':>24}")
    for name, form in _forms(pypinyin).items():
        cells = []
        for reading in (read, lambda text: text):
            pinyin.read = reading
            model.clear_cache()
            counts = []
            for label in (1, 0):
                group = [form(r.text) for r in rows if r.label == label]
                counts.append(f"{sum(model.score(text) >= threshold for text in group)}/{len(group)}")
            cells.append(" / ".join(counts))
        pinyin.read = read
        print(f"{name:<20}{cells[0]:>24}{cells[1]:>24}")

    texts = [r.text for name in ("train.jsonl", "dev.jsonl") for r in load(DATASETS / name)]
    for name in ("extra.jsonl", "extra_prompts.jsonl"):
        with (Path("classifiers/injection") / name).open(encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f]
    changed = [text for text in texts if read(text) != text]
    flipped = 0
    for text in changed:
        scores = []
        for reading in (read, lambda text: text):
            pinyin.read = reading
            model.clear_cache()
            scores.append(model.score(text))
        pinyin.read = read
        flipped += (scores[0] >= threshold) != (scores[1] >= threshold)
    print(
        f"pool and dev texts read differently: {len(changed)} of {len(texts)}; decisions changed: {flipped}"
    )


if __name__ == "__main__":
    main()
