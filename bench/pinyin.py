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

Homophones (谐音, `pinyin.correct`): the same rows with a share of their characters replaced by a
random homophone (a character with one of its toneless syllables; seeded), drawn among the
characters of the pool's text or among the others pypinyin knows (rare ones), scored as written
and as corrected; then how many pool and dev texts read differently because of the correction,
and whether any decision changes.
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
    flipped = _decisions_changed(model, changed, "read")
    print(
        f"pool and dev texts read differently: {len(changed)} of {len(texts)}; decisions changed: {flipped}"
    )
    _homophones(pypinyin, model, rows, texts)


def _decisions_changed(model: InjectionModel, texts: list[str], step: str) -> int:
    """How many of `texts` the shipped threshold decides otherwise without `pinyin.<step>`."""
    threshold = model.manifest.threshold
    kept = getattr(pinyin, step)
    flipped = 0
    for text in texts:
        scores = []
        for reading in (kept, lambda text: text):
            setattr(pinyin, step, reading)
            model.clear_cache()
            scores.append(model.score(text))
        setattr(pinyin, step, kept)
        flipped += (scores[0] >= threshold) != (scores[1] >= threshold)
    return flipped


def _homophones(pypinyin: Any, model: InjectionModel, rows: list[Any], texts: list[str]) -> None:
    import random

    threshold = model.manifest.threshold
    common = set(pinyin.model().unigram)
    by_sound: dict[str, set[str]] = {}
    sounds: dict[str, set[str]] = {}
    for cp in range(0x4E00, 0xA000):
        c = chr(cp)
        spoken = {
            pinyin.split_tone(r)[0] for r in pypinyin.pinyin(c, style=pypinyin.Style.TONE, heteronym=True)[0]
        }
        sounds[c] = spoken
        for s in spoken:
            by_sound.setdefault(s, set()).add(c)

    def swap(text: str, share: float, rare: bool, rng: random.Random) -> str:
        out = []
        for c in text:
            pool = sorted({d for s in sounds.get(c, ()) for d in by_sound[s]} - {c})
            pool = [d for d in pool if (d in common) != rare]
            out.append(rng.choice(pool) if pool and rng.random() < share else c)
        return "".join(out)

    correct = pinyin.correct
    print("homophones for a share of the characters; attacks / benign flagged")
    print(f"{'share, drawn from':<28}{'corrected':>18}{'as written':>18}")
    for rare in (False, True):
        for share in (0.1, 0.2, 0.3):
            cells = []
            for reading in (correct, lambda text: text):
                pinyin.correct = reading
                model.clear_cache()
                rng = random.Random(7)
                swapped = [(r.label, swap(r.text, share, rare, rng)) for r in rows]
                counts = [
                    sum(model.score(t) >= threshold for lab, t in swapped if lab == label) for label in (1, 0)
                ]
                cells.append(f"{counts[0]}/85 / {counts[1]}/175")
            pinyin.correct = correct
            drawn = "rare characters" if rare else "the pool's characters"
            print(f"{f'{share:.0%}, {drawn}':<28}{cells[0]:>18}{cells[1]:>18}")
    han = [t for t in texts if pinyin._HAN_RUN.search(t)]
    changed = [t for t in han if correct(t) != t]
    chars = sum(sum(a != b for a, b in zip(correct(t), t, strict=True)) for t in changed)
    flipped = _decisions_changed(model, changed, "correct")
    total = sum(len(t) for t in han)
    print(
        f"pool and dev texts with Chinese read differently: {len(changed)} of {len(han)} "
        f"({chars} of {total} characters); decisions changed: {flipped}"
    )


if __name__ == "__main__":
    main()
