"""How big can the injection model be? `python -m bench.injection_arch` (needs the training lock).

Builds random-weight RoBERTa classifiers of several sizes, exports each as the training script
does (`train.to_onnx`: eager attention → ONNX → onnxruntime's transformer fusion → int8 weights)
and prints the cost of one 256-token window and of a 2,000-token prompt (8 windows in one call)
with one intra-op thread, in a session built as the gateway builds it (`runtime.session`).
Latency depends on the shape, not on the weights, so this chose the shipped architecture before
any training (classifiers/injection/train.py: ARCH).

`--fusion`: the shipped shape exported and loaded with every onnxruntime fusion (as revisions up
to ed76f14f were) against the export and session the project uses now, interleaved in one run.
`--window`: the shipped shape read in 256-token windows (revisions up to 41afc817) and in
128-token ones, interleaved: attention grows with the square of the window.
`--first-token`: the shipped shape with its last layer computed for every position (revisions up
to bd4374e1) and for the first token only (`graph.first_token_head`), interleaved.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = [(2, 128, 512, 2), (3, 128, 512, 2), (4, 128, 512, 4), (3, 192, 768, 4), (4, 256, 1024, 4)]


def _model(layers: int, hidden: int, ffn: int, heads: int) -> Any:
    import torch
    from transformers import RobertaConfig, RobertaForSequenceClassification

    cfg = RobertaConfig(
        vocab_size=16000, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=ffn, max_position_embeddings=258, num_labels=2, pad_token_id=1,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return RobertaForSequenceClassification(cfg).eval()


def _shipped_shape() -> tuple[int, int, int, int]:
    from classifiers.injection.train import ARCH

    return (
        ARCH["num_hidden_layers"],
        ARCH["hidden_size"],
        ARCH["intermediate_size"],
        ARCH["num_attention_heads"],
    )


def _feed(rng: Any, batch: int, length: int) -> dict[str, Any]:
    """Random token windows of one length, none padded."""
    import numpy as np

    ids = rng.integers(5, 16000, (batch, length))
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def _feeds() -> tuple[dict[str, Any], dict[str, Any]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return _feed(rng, 1, 256), _feed(rng, 8, 256)


def _pct(ts: list[float]) -> tuple[float, float]:
    ts = sorted(ts)
    return ts[len(ts) // 2] * 1000, ts[min(len(ts) - 1, int(0.99 * len(ts)))] * 1000


def _time(session: Any, feed: dict[str, Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        session.run(None, feed)
        out.append(time.perf_counter() - t0)
    return out


def sizes(n: int) -> None:
    from classifiers.injection.runtime import session
    from classifiers.injection.train import to_onnx

    one, eight = _feeds()
    print("layers hidden ffn heads | 1x256 p50/p99 ms | 8x256 (2,000 tokens) p50/p99 ms | MB")
    for layers, hidden, ffn, heads in SIZES:
        with tempfile.TemporaryDirectory() as d:
            _, path = to_onnx(_model(layers, hidden, ffn, heads), Path(d), Path(d) / "int8.onnx")
            s = session(path)
            _time(s, one, 3)
            a = _pct(_time(s, one, n))
            b = _pct(_time(s, eight, max(10, n // 4)))
            print(
                f"{layers:6d} {hidden:6d} {ffn:4d} {heads:5d} | {a[0]:6.2f} / {a[1]:6.2f}   |"
                f" {b[0]:6.1f} / {b[1]:6.1f}                 | {path.stat().st_size / 1e6:.1f}"
            )


def fusion(n: int) -> None:
    from classifiers.injection.runtime import session
    from classifiers.injection.train import to_onnx

    shape = _shipped_shape()
    one, eight = _feeds()
    with tempfile.TemporaryDirectory() as d:
        runs: dict[str, tuple[Any, list[float], list[float]]] = {}
        for label, every in (("every onnxruntime fusion", True), ("as exported now", False)):
            work = Path(d) / label.replace(" ", "-")
            work.mkdir()
            _, path = to_onnx(_model(*shape), work, work / "int8.onnx", fuse_all=every)
            runs[label] = (session(path, fuse_all=every), [], [])
        for _ in range(10):  # interleaved rounds, so drifts of the machine hit both alike
            for s, ones, eights in runs.values():
                ones.extend(_time(s, one, max(1, n // 10)))
                eights.extend(_time(s, eight, max(1, n // 40)))
        print(f"shape {shape}: 1x256 p50/p99 ms | 8x256 p50/p99 ms")
        for label, (_, a, b) in runs.items():
            (a50, a99), (b50, b99) = _pct(a), _pct(b)
            print(f"  {label:26s} {a50:6.2f} / {a99:6.2f} | {b50:6.1f} / {b99:6.1f}")
        x = runs["every onnxruntime fusion"][0].run(None, eight)[0]
        y = runs["as exported now"][0].run(None, eight)[0]
        print(f"  max |logit difference| between the two: {abs(x - y).max():.2e}")


def window_length(n: int) -> None:
    """The shipped shape read in 256-token windows and in 128-token ones, interleaved: one
    256-token prompt (1 window or 2) and a 2,000-token prompt (8 windows or 16)."""
    import numpy as np

    from classifiers.injection.runtime import session
    from classifiers.injection.train import to_onnx

    shape = _shipped_shape()
    rng = np.random.default_rng(0)
    feeds = {}
    for label, (batch, length) in {"256 tokens as 1 x 256": (1, 256), "256 tokens as 2 x 128": (2, 128),
                                   "2,000 tokens as 8 x 256": (8, 256), "2,000 tokens as 16 x 128": (16, 128)}.items():  # fmt: skip
        feeds[label] = _feed(rng, batch, length)
    with tempfile.TemporaryDirectory() as d:
        _, path = to_onnx(_model(*shape), Path(d), Path(d) / "int8.onnx")
        s = session(path)
        times: dict[str, list[float]] = {k: [] for k in feeds}
        for _ in range(20):  # interleaved rounds, so drifts of the machine hit every row alike
            for label, feed in feeds.items():
                times[label].extend(_time(s, feed, max(1, n // (20 if "256 tokens" in label else 80))))
        print(f"shape {shape}, random weights, one thread: p50 / p99 ms")
        for label, ts in times.items():
            a, b = _pct(ts)
            print(f"  {label:26s} {a:6.2f} / {b:6.2f}")


def first_token(n: int) -> None:
    """The shipped shape exported with and without `graph.first_token_head`, interleaved: one
    128-token window, four (one session call of the runtime) and sixteen (a 2,000-token prompt)."""
    import numpy as np

    from classifiers.injection.runtime import session
    from classifiers.injection.train import to_onnx

    shape = _shipped_shape()
    rng = np.random.default_rng(0)
    feeds = {}
    for batch in (1, 4, 16):
        feeds[f"{batch:2d} x 128"] = _feed(rng, batch, 128)
    with tempfile.TemporaryDirectory() as d:
        sessions = {}
        for label, first in (("every position", False), ("first token", True)):
            work = Path(d) / label.replace(" ", "-")
            work.mkdir()
            _, path = to_onnx(_model(*shape), work, work / "int8.onnx", first_token=first)
            sessions[label] = session(path)
        times: dict[tuple[str, str], list[float]] = {(a, b): [] for a in sessions for b in feeds}
        for _ in range(20):  # interleaved rounds, so drifts of the machine hit every row alike
            for (label, size), ts in times.items():
                ts.extend(_time(sessions[label], feeds[size], max(1, n // (20 * int(size[:2])))))
        print(f"shape {shape}, random weights, one thread, last layer on: p50 / p99 ms")
        for (label, size), ts in times.items():
            a, b = _pct(ts)
            print(f"  {size} {label:15s} {a:6.2f} / {b:6.2f}")
        x, y = (s.run(None, feeds["16 x 128"])[0] for s in sessions.values())
        print(f"  max |logit difference| between the two: {abs(x - y).max():.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("--fusion", action="store_true", help="shipped shape: every fusion vs as exported now")
    ap.add_argument("--window", action="store_true", help="shipped shape: 256-token vs 128-token windows")
    ap.add_argument(
        "--first-token", action="store_true", help="shipped shape: last layer on every position vs the first"
    )
    args = ap.parse_args()
    if args.first_token:
        first_token(max(args.n, 1600))
    elif args.fusion:
        fusion(max(args.n, 400))
    elif args.window:
        window_length(max(args.n, 400))
    else:
        sizes(args.n)


if __name__ == "__main__":
    main()
