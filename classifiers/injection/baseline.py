"""A fast reference model for the evaluation: character n-grams + logistic regression.

Not shipped and not the product's model (that is the RoBERTa of issue 5); it gives the
evaluation a floor to compare against (the issue measured ~0.71 held-out AUC for this family).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from classifiers.injection.data import Row


class TfidfBaseline:
    """char_wb 2-4-grams, sublinear tf, class-balanced logistic regression."""

    def __init__(self) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression

        self._vec: Any = TfidfVectorizer(
            analyzer="char_wb", ngram_range=(2, 4), sublinear_tf=True, min_df=2, max_features=200_000
        )
        self._clf: Any = LogisticRegression(max_iter=2000, class_weight="balanced", C=4.0)

    def fit(self, rows: Sequence[Row]) -> None:
        """Train on texts truncated to their first 4,000 characters."""
        x = self._vec.fit_transform([r.text[:4000] for r in rows])
        self._clf.fit(x, [r.label for r in rows])

    def score(self, texts: Sequence[str]) -> list[float]:
        """Probability of injection for each text."""
        return [
            float(p) for p in self._clf.predict_proba(self._vec.transform([t[:4000] for t in texts]))[:, 1]
        ]
