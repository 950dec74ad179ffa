"""Train the classifier's byte-level BPE tokenizer on the pool (Chinese included).

`python -m classifiers.injection.tokenizer OUT.json [--vocab 16000]`: trains on every text of
`../shared/datasets/injection/train.jsonl` (never dev), with RoBERTa's special tokens and
post-processing (`<s> … </s>`), deterministic for a given pool. Prints what it means for the
model: tokens per prompt, the share of prompts longer than 256 and 512 tokens, per language.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from classifiers.injection.data import DATASETS, Row, load

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def train(texts: Iterable[str], vocab_size: int = 16_000, min_frequency: int = 2) -> Any:
    """A RoBERTa-style byte-level BPE tokenizer trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Special tokens come first in the vocabulary, in SPECIALS order.
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", SPECIALS.index("</s>")), ("<s>", SPECIALS.index("<s>"))
    )
    return tok


def lengths(tok: Any, rows: Sequence[Row]) -> dict[str, tuple[float, float, float, int]]:
    """Per language: median tokens, share over 256, share over 512, rows."""
    by: dict[str, list[int]] = {}
    for r, enc in zip(rows, tok.encode_batch([r.text for r in rows]), strict=True):
        by.setdefault(r.language, []).append(len(enc.ids))
    return {
        lang: (
            statistics.median(ns),
            sum(n > 256 for n in ns) / len(ns),
            sum(n > 512 for n in ns) / len(ns),
            len(ns),
        )
        for lang, ns in sorted(by.items())
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--vocab", type=int, default=16_000)
    args = ap.parse_args()
    rows = load(DATASETS / "train.jsonl")
    tok = train((r.text for r in rows), args.vocab)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out))
    print(f"{args.out}: vocabulary {tok.get_vocab_size()}")
    dev = load(DATASETS / "dev.jsonl")
    print(f"{'language':8} {'median':>7} {'>256':>6} {'>512':>6} {'rows':>6}   (dev set)")
    for lang, (med, o256, o512, n) in lengths(tok, dev).items():
        print(f"{lang:8} {med:7.0f} {o256:6.1%} {o512:6.1%} {n:6d}")


if __name__ == "__main__":
    main()
