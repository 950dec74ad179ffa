"""Label-noise cleaning: attack rows that an out-of-fold model reads as plainly benign.

Some pool rows labelled as attacks are ordinary requests ("Write a short poem about the ocean.",
"List five fruits.", "generate c++": promptshield's and deepset's controls, a few in-the-wild
posts). Trained on, they teach "an ordinary request is an attack", which is how unseen benign
prompts get flagged. Each row is scored by a character TF-IDF model (`baseline.py`) fitted on the
other folds of the same rows, so a row never judges itself; attack rows scored under `below` are
dropped.

Only attacks are cleaned. The benign rows such a model reads as attacks are mostly hard
negatives (BIPIA's untouched emails and tables, role prompts): they are what teaches the model
where the boundary is, and dropping them would remove exactly that.

It runs on the rows a training run (or one evaluation fold) trains on, never on a fold's test
side, so held-out figures stay honest.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

from classifiers.injection.baseline import TfidfBaseline
from classifiers.injection.data import Row


def out_of_fold(rows: Sequence[Row], folds: int, seed: int) -> list[float]:
    """Each row's attack probability from a model fitted without its fold."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)  # noqa: S311 - a reproducible split, not a secret
    scores = [0.0] * len(rows)
    for k in range(folds):
        test = sorted(order[k::folds])
        held = set(test)
        model = TfidfBaseline()
        model.fit([rows[i] for i in order if i not in held])
        for i, p in zip(test, model.score([rows[i].text for i in test]), strict=True):
            scores[i] = p
    return scores


def drop_noisy_attacks(
    rows: Sequence[Row], below: float, seed: int, folds: int = 5, log: Callable[[str], None] = print
) -> list[Row]:
    """`rows` without the attack rows whose out-of-fold attack probability is under `below`."""
    if below <= 0:
        return list(rows)
    scores = out_of_fold(rows, folds, seed)
    kept = [r for r, p in zip(rows, scores, strict=True) if r.label == 0 or p >= below]
    dropped = Counter(r.family for r, p in zip(rows, scores, strict=True) if r.label == 1 and p < below)
    log(
        f"  label cleaning: {sum(dropped.values())} of {sum(r.label for r in rows)} attack rows dropped "
        f"(out-of-fold score < {below}): " + ", ".join(f"{fam} {n}" for fam, n in dropped.most_common())
    )
    return kept
