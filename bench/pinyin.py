"""How the shipped injection model reads Chinese written in pinyin (figures, not a test).

    .venv/bin/pip install pypinyin==0.55.0   # MIT; a measuring tool only, not a dependency
    .venv/bin/python -m bench.pinyin

Transliterates dev's Chinese rows (`Row.language == "zh"`) with pypinyin, one syllable per
character, toneless (`hu lve ni zhi qian`) and with tone marks (`hū lüè nǐ zhī qián`), and counts
the attacks and benign rows the shipped threshold flags, against the same rows in characters.
A known gap (MODEL_CARD "Known failure modes"): the model never saw pinyin in training.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path

from classifiers.injection.data import DATASETS, load
from classifiers.injection.runtime import InjectionModel, Manifest


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
    rows = [r for r in load(DATASETS / "dev.jsonl") if r.language == "zh"]
    print(f"dev Chinese rows: {len(rows)}; threshold {threshold}")
    print(f"{'written as':<18}{'attacks flagged':>18}{'benign flagged':>18}")
    forms: dict[str, Callable[[str], str]] = {
        "characters": lambda text: text,
        "pinyin, toneless": lambda text: " ".join(pypinyin.lazy_pinyin(text)),
        "pinyin, tone marks": lambda text: " ".join(pypinyin.lazy_pinyin(text, style=pypinyin.Style.TONE)),
    }
    for name, form in forms.items():
        cells = []
        for label in (1, 0):
            group = [r for r in rows if r.label == label]
            flagged = sum(model.score(form(r.text)) >= threshold for r in group)
            cells.append(f"{flagged}/{len(group)} ({flagged / len(group):.2f})")
        print(f"{name:<18}{cells[0]:>18}{cells[1]:>18}")


if __name__ == "__main__":
    main()
