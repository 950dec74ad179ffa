"""Recall and precision of the PII engine, per entity: `python -m bench.pii_eval`.

Sets: `../shared/datasets/pii/dev.jsonl` (English, presidio-research; only the entities ztgate
detects are scored), generated English and Chinese sets (bench.pii_synth, real check digits,
cards of every scheme and length), and
generated number-heavy near misses (every finding there is a false positive). A finding counts
when it overlaps a labelled span of the same entity; exact-boundary counts are printed too.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.pii_synth import Labelled, chinese_set, english_set, near_misses
from classifiers.pii.engine import PiiEngine
from classifiers.pii.recognizers import BUILTIN_ENTITIES

# presidio-research names → the analyzer's; entities ztgate does not detect are left out.
_DEV_NAMES = {
    "CREDIT_CARD": "CREDIT_CARD",
    "EMAIL_ADDRESS": "EMAIL_ADDRESS",
    "IBAN_CODE": "IBAN_CODE",
    "IP_ADDRESS": "IP_ADDRESS",
    "US_SSN": "US_SSN",
    "PHONE_NUMBER": "PHONE_NUMBER",
}
DEV = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "pii" / "dev.jsonl"


def load_dev(path: Path) -> list[Labelled]:
    """dev.jsonl rows with their spans renamed to analyzer entities."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        spans = tuple(
            (s["start"], s["end"], _DEV_NAMES[s["entity"]]) for s in row["spans"] if s["entity"] in _DEV_NAMES
        )
        out.append(Labelled(row["text"], spans))
    return out


def score(engine: Any, rows: list[Labelled], *, show: int = 0) -> dict[str, dict[str, float]]:
    """Per entity: support, recall, precision (overlap match), exact-boundary recall."""
    tp: Counter[str] = Counter()
    exact: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    shown = 0
    for row in rows:
        found = [_Found(f) for f in engine.analyze(row.text)]
        for s, e, ent in row.spans:
            hit = [f for f in found if f.entity == ent and f.start < e and s < f.end]
            if hit:
                tp[ent] += 1
                exact[ent] += any(f.start == s and f.end == e for f in hit)
            else:
                fn[ent] += 1
                if shown < show:
                    shown += 1
                    print(f"  missed {ent}: {row.text[max(0, s - 30) : e + 10]!r}")
        for f in found:
            if not any(f.entity == ent and f.start < e and s < f.end for s, e, ent in row.spans):
                fp[f.entity] += 1
                if shown < show:
                    shown += 1
                    print(f"  false {f.entity}: {row.text[max(0, f.start - 30) : f.end + 10]!r}")
    out = {}
    for ent in sorted(set(tp) | set(fn) | set(fp)):
        support = tp[ent] + fn[ent]
        out[ent] = {
            "support": support,
            "recall": tp[ent] / support if support else float("nan"),
            "precision": tp[ent] / (tp[ent] + fp[ent]) if tp[ent] + fp[ent] else float("nan"),
            "exact_recall": exact[ent] / support if support else float("nan"),
            "false_positives": fp[ent],
        }
    return out


def _print(title: str, table: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"  {'entity':16} {'support':>7} {'recall':>7} {'precision':>9} {'exact':>6} {'FP':>4}")
    for ent, m in table.items():
        print(
            f"  {ent:16} {int(m['support']):7d} {m['recall']:7.3f} {m['precision']:9.3f} "
            f"{m['exact_recall']:6.3f} {int(m['false_positives']):4d}"
        )


class _Found:
    """A finding from either engine: start, end, entity."""

    def __init__(self, f: Any) -> None:
        self.start, self.end = f.start, f.end
        self.entity = getattr(f, "entity", None) or f.entity_type


class _Stock:
    """presidio's own pattern recognizers (the stock ones ztgate replaces), for comparison."""

    def __init__(self) -> None:
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.nlp_engine import NoOpNlpEngine
        from presidio_analyzer.predefined_recognizers import (
            CreditCardRecognizer,
            EmailRecognizer,
            IbanRecognizer,
            IpRecognizer,
            PhoneRecognizer,
            UsSsnRecognizer,
        )

        recs = [
            CreditCardRecognizer(),
            EmailRecognizer(),
            IbanRecognizer(),
            IpRecognizer(),
            UsSsnRecognizer(),
            PhoneRecognizer(),
        ]
        self._a = AnalyzerEngine(
            registry=RecognizerRegistry(recognizers=recs),
            nlp_engine=NoOpNlpEngine(models=[{"lang_code": "en", "model_name": "none"}]),
        )

    def analyze(self, text: str) -> list[Any]:
        return list(self._a.analyze(text, language="en", score_threshold=0.5))


def main() -> None:
    """Print the tables for docs/pii.md."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dev", type=Path, default=DEV)
    ap.add_argument("--n", type=int, default=3000, help="generated rows per synthetic set")
    ap.add_argument("--show", type=int, default=0, help="print this many misses / false alarms per set")
    ap.add_argument("--stock", action="store_true", help="score presidio's stock recognizers instead")
    ap.add_argument("--names", default="", help="also detect PERSON: en, zh or en,zh (opt-in NER)")
    args = ap.parse_args()
    names = [n for n in args.names.split(",") if n]
    if names:
        _DEV_NAMES["PERSON"] = "PERSON"
    engine: Any = (
        _Stock()
        if args.stock
        else PiiEngine([*BUILTIN_ENTITIES, "PERSON"] if names else BUILTIN_ENTITIES, names=names)
    )
    if not args.stock:
        engine.warm()
    t0 = time.perf_counter()
    dev = load_dev(args.dev)
    _print(f"English dev ({args.dev.name}, {len(dev)} rows)", score(engine, dev, show=args.show))
    _print(f"English generated ({args.n} rows)", score(engine, english_set(args.n), show=args.show))
    _print(f"Chinese generated ({args.n} rows)", score(engine, chinese_set(args.n), show=args.show))
    misses = [Labelled(t, ()) for t in near_misses(args.n)]
    table = score(engine, misses, show=args.show)
    flagged = sum(1 for r in misses if engine.analyze(r.text))
    print(f"\nNear misses ({args.n} number-heavy texts, no PII): {flagged} texts with a finding")
    for ent, m in table.items():
        print(f"  {ent}: {int(m['false_positives'])} false positives")
    print(f"\n({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
