"""A tiny, hand-built sequence-classification ONNX model and tokenizer for tests.

Not a trained classifier: a bag-of-words scorer written as an ONNX graph (embedding lookup →
masked sum → logits), with a WordLevel tokenizer, so the runtime and the filter can be tested
against a real onnxruntime session and a real `tokenizer.json` without torch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB = ["<pad>", "<s>", "</s>", "<unk>", "ignore", "previous", "instructions", "please", "summarise",
         "the", "report", "jailbreak", "忽略", "你好"]  # fmt: skip
ATTACK_WORDS = {"ignore": 3.0, "jailbreak": 4.0, "忽略": 4.0, "instructions": 0.5}


def build(directory: Path, *, threshold: float = 0.5, max_length: int = 16) -> Path:
    """Write model.onnx, tokenizer.json and manifest.json; return the manifest's path."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = np.zeros((len(VOCAB), 2), dtype=np.float32)
    weights[:, 0] = 0.4  # every benign word pulls a little towards label 0
    for word, w in ATTACK_WORDS.items():
        weights[VOCAB.index(word)] = (0.0, w)
    weights[VOCAB.index("<pad>")] = (0.0, 0.0)
    nodes = [
        helper.make_node("Gather", ["W", "input_ids"], ["emb"]),  # [B, T, 2]
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["logits"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "bag_of_words_classifier",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        initializer=[
            numpy_helper.from_array(weights, "W"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, directory / "model.onnx")
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    tok.save(str(directory / "tokenizer.json"))
    manifest = {
        "model": "model.onnx",
        "model_sha256": hashlib.sha256((directory / "model.onnx").read_bytes()).hexdigest(),
        "tokenizer": "tokenizer.json",
        "tokenizer_sha256": hashlib.sha256((directory / "tokenizer.json").read_bytes()).hexdigest(),
        "max_length": max_length,
        "threshold": threshold,
        "revision": "test-bow-1",
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory / "manifest.json"
