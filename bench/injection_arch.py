"""How big can the injection model be? `python -m bench.injection_arch` (needs the training lock).

Builds random-weight RoBERTa classifiers of several sizes, exports each as the training script
does (eager attention → ONNX → onnxruntime's transformer fusion → int8 weights) and prints the
cost of one 256-token window and of a 2,000-token prompt (8 windows in one call) with one
intra-op thread. Latency depends on the shape, not on the weights, so this chose the shipped
architecture before any training (classifiers/injection/train.py: ARCH).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = [(2, 128, 512, 2), (3, 128, 512, 2), (4, 128, 512, 4), (3, 192, 768, 4), (4, 256, 1024, 4)]


def _export(layers: int, hidden: int, ffn: int, heads: int, d: Path) -> Path:
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer
    from transformers import RobertaConfig, RobertaForSequenceClassification

    cfg = RobertaConfig(
        vocab_size=16000, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=ffn, max_position_embeddings=258, num_labels=2, pad_token_id=1,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    model = RobertaForSequenceClassification(cfg).eval()
    ids = torch.randint(5, 16000, (1, 64))
    fp32, fused, q = d / "fp32.onnx", d / "fused.onnx", d / "int8.onnx"
    torch.onnx.export(
        model, (ids, torch.ones_like(ids)), str(fp32), input_names=["input_ids", "attention_mask"],
        output_names=["logits"], opset_version=17, dynamo=False,
        dynamic_axes={"input_ids": {0: "b", 1: "t"}, "attention_mask": {0: "b", 1: "t"}},
    )  # fmt: skip
    optimizer.optimize_model(
        str(fp32), model_type="bert", num_heads=heads, hidden_size=hidden
    ).save_model_to_file(str(fused))
    quantize_dynamic(
        str(fused),
        str(q),
        weight_type=QuantType.QInt8,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    return q


def _times(session: Any, batch: int, tokens: int, n: int) -> tuple[float, float]:
    import numpy as np

    x = np.random.default_rng(0).integers(5, 16000, (batch, tokens), dtype=np.int64)
    feed = {"input_ids": x, "attention_mask": np.ones_like(x)}
    for _ in range(3):
        session.run(None, feed)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        session.run(None, feed)
        ts.append((time.perf_counter() - t0) * 1000)
    ts.sort()
    return ts[len(ts) // 2], ts[min(len(ts) - 1, int(0.99 * len(ts)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=100)
    args = ap.parse_args()
    import onnxruntime as ort

    print("layers hidden ffn heads | 1x256 p50/p99 ms | 8x256 (2,000 tokens) p50/p99 ms | MB")
    for layers, hidden, ffn, heads in SIZES:
        with tempfile.TemporaryDirectory() as d:
            path = _export(layers, hidden, ffn, heads, Path(d))
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.inter_op_num_threads = 1
            s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            one = _times(s, 1, 256, args.n)
            eight = _times(s, 8, 256, max(10, args.n // 4))
            print(
                f"{layers:6d} {hidden:6d} {ffn:4d} {heads:5d} | {one[0]:6.2f} / {one[1]:6.2f}   |"
                f" {eight[0]:6.1f} / {eight[1]:6.1f}                 | {path.stat().st_size / 1e6:.1f}"
            )


if __name__ == "__main__":
    main()
