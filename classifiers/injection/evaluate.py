"""Honest evaluation of an injection classifier: `python -m classifiers.injection.evaluate`.

In-distribution dev F1 says almost nothing (issue 5): this measures what generalization looks like.

- **Leave one source out**: for every family in the pool, train without it (and without the
  families that share its text), then score it: false-positive rate on its benign rows, recall on
  its attack rows, at a threshold set on the training side's own held-back 10% so that 5% of
  benign prompts there are flagged (the target operating point).
- **Benign-only table**: the false-positive rate of each benign family in that run.
- **Per language** (zh / en / other): pooled over the held-out predictions.
- **Dev**: the usual split, for reference only.

Any model with `fit(texts, labels)` and `score(texts) -> list[float]` plugs in; `--model tfidf`
is the character n-gram + logistic-regression baseline.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from classifiers.injection.data import DATASETS, Row, held_out_with, load


class Model(Protocol):
    """What the evaluation needs from a classifier."""

    def fit(self, texts: Sequence[str], labels: Sequence[int]) -> None: ...

    def score(self, texts: Sequence[str]) -> list[float]: ...


def threshold_at_fpr(scores: Sequence[float], labels: Sequence[int], fpr: float = 0.05) -> float:
    """The lowest threshold that flags at most `fpr` of the benign rows."""
    benign = sorted((s for s, y in zip(scores, labels, strict=True) if y == 0), reverse=True)
    if not benign:
        return 0.5
    k = int(fpr * len(benign))
    return benign[k] + 1e-9 if k < len(benign) else benign[-1]


@dataclass(slots=True)
class FamilyResult:
    """What one held-out family scored."""

    family: str
    benign: int = 0
    attacks: int = 0
    false_positives: int = 0
    caught: int = 0
    threshold: float = 0.0
    predictions: list[tuple[Row, float]] = field(default_factory=list)

    @property
    def fpr(self) -> float | None:
        return self.false_positives / self.benign if self.benign else None

    @property
    def recall(self) -> float | None:
        return self.caught / self.attacks if self.attacks else None


def leave_one_source_out(
    rows: Sequence[Row], make: Callable[[], Model], *, seed: int = 0, families: Sequence[str] | None = None
) -> list[FamilyResult]:
    """Train without each family (and its relatives); score it at the 5%-FPR threshold."""
    out: list[FamilyResult] = []
    for family in families or sorted({r.family for r in rows}):
        hidden = held_out_with(family)
        train = [r for r in rows if r.family not in hidden]
        test = [r for r in rows if r.family == family]
        rng = random.Random(seed)  # noqa: S311 - a reproducible split, not a secret
        rng.shuffle(train)
        cut = len(train) // 10
        calib, fit_rows = train[:cut], train[cut:]
        model = make()
        model.fit([r.text for r in fit_rows], [r.label for r in fit_rows])
        thr = threshold_at_fpr(model.score([r.text for r in calib]), [r.label for r in calib])
        res = FamilyResult(family, threshold=thr)
        for r, s in zip(test, model.score([r.text for r in test]), strict=True):
            res.predictions.append((r, s))
            if r.label:
                res.attacks += 1
                res.caught += s >= thr
            else:
                res.benign += 1
                res.false_positives += s >= thr
        out.append(res)
    return out


def by_language(results: Sequence[FamilyResult]) -> dict[str, tuple[float | None, float | None, int]]:
    """Pooled held-out FPR and recall per language: (fpr, recall, rows)."""
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # benign, fp, attacks, caught
    for res in results:
        for r, s in res.predictions:
            a = acc[r.language]
            if r.label:
                a[2] += 1
                a[3] += s >= res.threshold
            else:
                a[0] += 1
                a[1] += s >= res.threshold
    return {
        lang: (a[1] / a[0] if a[0] else None, a[3] / a[2] if a[2] else None, a[0] + a[2])
        for lang, a in sorted(acc.items())
    }


def _fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{x:6.3f}"


def report(results: Sequence[FamilyResult]) -> str:
    """The leave-one-source-out table, the language table and the summary lines."""
    lines = [f"{'held-out family':42} {'benign':>6} {'FPR':>6} {'attacks':>7} {'recall':>6}"]
    lines += [
        f"{res.family[:42]:42} {res.benign:6d} {_fmt(res.fpr)} {res.attacks:7d} {_fmt(res.recall)}"
        for res in results
    ]
    benign = [res.fpr for res in results if res.fpr is not None]
    attacks = [res.recall for res in results if res.recall is not None]
    lines.append(
        f"macro over families: FPR {statistics.mean(benign):.3f} (worst {max(benign):.3f}), "
        f"recall {statistics.mean(attacks):.3f} (worst {min(attacks):.3f})"
    )
    lines.append(f"\n{'language':8} {'FPR':>6} {'recall':>6} {'rows':>6}")
    for lang, (fpr, rec, n) in by_language(results).items():
        lines.append(f"{lang:8} {_fmt(fpr)} {_fmt(rec)} {n:6d}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tfidf", choices=["tfidf"])
    ap.add_argument("--families", help="comma-separated subset (default: every family)")
    args = ap.parse_args()
    from classifiers.injection.baseline import TfidfBaseline

    rows = load(DATASETS / "train.jsonl")
    dev = load(DATASETS / "dev.jsonl")
    t0 = time.perf_counter()
    m = TfidfBaseline()
    m.fit([r.text for r in rows], [r.label for r in rows])
    dev_scores = m.score([r.text for r in dev])
    tp = sum(1 for r, s in zip(dev, dev_scores, strict=True) if r.label and s >= 0.5)
    fp = sum(1 for r, s in zip(dev, dev_scores, strict=True) if not r.label and s >= 0.5)
    fn = sum(1 for r, s in zip(dev, dev_scores, strict=True) if r.label and s < 0.5)
    print(f"dev (in-distribution, reference only): F1 {2 * tp / (2 * tp + fp + fn):.3f} at 0.5\n")
    fams = args.families.split(",") if args.families else None
    print(report(leave_one_source_out(rows, TfidfBaseline, families=fams)))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
