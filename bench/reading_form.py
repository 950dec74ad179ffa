"""What the injection model's reading form costs and changes (figures, not a test).

    .venv/bin/python -m bench.reading_form [--texts 5000] [--rounds 3]

Times `runtime.reading_form` per text over the training pool's first `--texts` texts and its 200
longest, against reading form 1 (the translate table alone, before classifiers.lookalike), and
counts the pool and dev texts whose reading form differs between the two.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from classifiers.injection import runtime
from classifiers.injection.data import DATASETS, load
from classifiers.lookalike import STYLED

_FORM_1 = {k: v for k, v in runtime._READING.items() if k not in STYLED}


def form_1(text: str) -> str:
    """Reading form 1: invisible characters, fullwidth letters and odd spaces only."""
    return text.translate(_FORM_1)


def _us_per_text(fn: Callable[[str], str], texts: list[str], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for x in texts:
            fn(x)
        best = min(best, time.perf_counter() - t)
    return best / len(texts) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    pool = [r.text for r in load(DATASETS / "train.jsonl")]
    for name, texts in (("first", pool[: args.texts]), ("longest 200", sorted(pool, key=len)[-200:])):
        mean = sum(map(len, texts)) / len(texts)
        now = _us_per_text(runtime.reading_form, texts, args.rounds)
        before = _us_per_text(form_1, texts, args.rounds)
        print(
            f"{name:12} {len(texts):5} texts, mean {mean:6.0f} chars: {now:7.1f} µs/text (form 1: {before:6.1f})"
        )
    for split in ("train", "dev"):
        rows = load(DATASETS / f"{split}.jsonl")
        changed = [r for r in rows if runtime.reading_form(r.text) != form_1(r.text)]
        attacks = sum(r.label == 1 for r in changed)
        print(f"{split}: {len(changed)} of {len(rows)} texts read differently ({attacks} attacks)")


if __name__ == "__main__":
    main()
