"""Injection classifier runtime cost (figures, not a test): `python -m bench.injection MANIFEST`.

For any model directory (default: the shipped model): p50/p99 per prompt at 64, 256 and 512
tokens (and a 2,000-token prompt, read in windows) with one intra-op thread, prompts of 0.1 to 4 MB
(read by their edges, against read whole), windows per second
when a batch of windows runs in one call, and what the per-message verdict cache saves on a 10-turn
chat that resends its history every turn. `--toy` runs the tests' bag-of-words graph instead,
which measures only the runtime's own overhead (tokenizer, session call, windows).
"""

from __future__ import annotations

import argparse
import base64
import statistics
import tempfile
import time
from pathlib import Path

from classifiers.injection.runtime import InjectionModel, Manifest

SHIPPED = Path(__file__).resolve().parents[1] / "classifiers" / "injection" / "model" / "manifest.json"

WORDS = [
    "please",
    "summarise",
    "the",
    "report",
    "and",
    "ignore",
    "nothing",
    "else",
    "while",
    "你好",
    "reviewing",
    "every",
    "clause",
]


def _fit(model: InjectionModel, prefix: str, words: list[str], tokens: int) -> str:
    """`prefix` + `words`, words dropped from the end until it is at most `tokens` tokens."""
    words = list(words)
    while model.tokens(prefix + " ".join(words)) > tokens and len(words) > 1:
        words.pop()
    return prefix + " ".join(words)


def _text(model: InjectionModel, tokens: int) -> str:
    """A text of about `tokens` tokens (prose-like word salad; the cost depends on length only)."""
    words: list[str] = []
    while not words or model.tokens(" ".join(words)) < tokens:
        words += WORDS
    return _fit(model, "", words, tokens)


def _variants(model: InjectionModel, text: str, tokens: int, n: int) -> list[str]:
    """`n` different texts (no cache hits) of at most `tokens` tokens: `text` after a counter,
    words dropped from its end until the counter fits (so the window count does not change)."""
    return [_fit(model, f"{i} ", text.split(" "), tokens) for i in range(n)]


def _times(model: InjectionModel, texts: list[str]) -> list[float]:
    out = []
    for text in texts:
        t0 = time.perf_counter()
        model.score(text)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("manifest", nargs="?", type=Path, default=SHIPPED)
    ap.add_argument("--toy", action="store_true", help="the tests' bag-of-words graph: runtime overhead only")
    ap.add_argument("-n", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = args.manifest
        if args.toy:
            from tests.injection_model import build

            path = build(Path(d), max_length=512)
            print("no manifest given: the tests' bag-of-words graph (runtime overhead only)\n")
        model = InjectionModel(Manifest.load(path), threads=1)  # the manifest's window cap
        print(
            f"model {model.revision}, max_length {model.manifest.max_length},"
            f" max_windows {model.max_windows}, 1 intra-op thread"
        )
        for tokens in (64, 256, 512, 2000):
            # Sizes count <s> and </s>, as a 256-token model window does.
            texts = _variants(model, _text(model, tokens - 2), tokens - 2, args.n)
            windows = sorted({len(model.windows(t)) for t in texts})
            ts = sorted(_times(model, texts))
            print(
                f"  {tokens:5d} tokens ({'/'.join(map(str, windows))} windows): p50 {statistics.median(ts) * 1000:7.2f} ms"
                f"  p99 {ts[int(0.99 * len(ts))] * 1000:7.2f} ms"
            )
        # Very long prompts: read by their edges, against reading them whole (reading form and
        # tokenizer), which is what a text far past the window cap cost before.
        prose = _text(model, 2000)
        for size in (100_000, 1_000_000, 4_000_000):
            for kind, doc in (("prose", prose), ("one base64 run", None)):
                text = (prose + " ") * (size // (len(prose) + 1) + 1)
                if doc is None:  # a run as long as the text, with nowhere to cut but inside it
                    text = base64.b64encode(text.encode()).decode()
                text = text[:size]
                edge = []
                for i in range(5):
                    model.clear_cache()
                    t0 = time.perf_counter()
                    model.score(f"{i} {text}")
                    edge.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                whole = model.tokens(text)
                took = time.perf_counter() - t0
                print(
                    f"  {size / 1e6:4.1f} MB of {kind:14s}: read by its edges p50 {statistics.median(edge) * 1000:7.1f} ms;"
                    f" read whole {took * 1000:7.1f} ms ({whole} tokens)"
                )
        # Batching: windows per second when several windows run in one session call.
        window = model.windows(_text(model, model.manifest.max_length - 2))[0]
        for size in (1, 4, 8, 16):
            t0 = time.perf_counter()
            rounds = max(4, 64 // size)
            for _ in range(rounds):
                model.run_windows([window] * size)
            rate = rounds * size / (time.perf_counter() - t0)
            print(f"  batch of {size:2d} full windows: {rate:6.0f} windows/s")
        # A chat: system prompt + growing history, each turn resent; scored per message.
        system = _text(model, 200)
        turns = [_text(model, 60) + f" turn {i}" for i in range(10)]
        for cached in (False, True):
            model.clear_cache()
            t0 = time.perf_counter()
            for k in range(1, len(turns) + 1):
                for msg in [system, *turns[:k]]:
                    if not cached:
                        model.clear_cache()
                    model.score(msg)
            label = "with the per-message cache" if cached else "without cache"
            print(
                f"  10-turn chat, history resent each turn, {label}: {(time.perf_counter() - t0) * 1000:.1f} ms"
            )


if __name__ == "__main__":
    main()
