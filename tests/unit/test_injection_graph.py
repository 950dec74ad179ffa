"""graph.first_token_head: the last layer on the first token only, the same logits, and refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from classifiers.injection.graph import first_token_head
from classifiers.injection.runtime import ModelError

H, FFN = 8, 16
SHIPPED = Path(__file__).resolve().parents[2] / "classifiers" / "injection" / "model" / "model.onnx"


def _layer(
    i: int, x: str, rng: np.random.Generator, inits: list[onnx.TensorProto]
) -> tuple[list[onnx.NodeProto], str]:
    """One fused encoder layer as onnxruntime's optimizer leaves it (Attention, then position-wise)."""

    def w(name: str, *shape: int) -> str:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), f"{name}{i}"))
        return f"{name}{i}"

    p = f"l{i}_"
    nodes = [
        helper.make_node("Attention", [x, w("qkv", H, 3 * H), w("qkv_b", 3 * H)], [p + "att"],
                         domain="com.microsoft", num_heads=2),
        helper.make_node("MatMul", [p + "att", w("o", H, H)], [p + "o"]),
        helper.make_node("Add", [p + "o", w("o_b", H)], [p + "ob"]),
        helper.make_node("Add", [p + "ob", x], [p + "res1"]),
        helper.make_node("LayerNormalization", [p + "res1", w("g1", H), w("b1", H)], [p + "ln1"], axis=-1),
        helper.make_node("MatMul", [p + "ln1", w("f1", H, FFN)], [p + "f1"]),
        helper.make_node("Gelu", [p + "f1"], [p + "gelu"], domain="com.microsoft"),
        helper.make_node("MatMul", [p + "gelu", w("f2", FFN, H)], [p + "f2"]),
        helper.make_node("Add", [p + "f2", p + "ln1"], [p + "res2"]),
        helper.make_node("LayerNormalization", [p + "res2", w("g2", H), w("b2", H)], [p + "out"], axis=-1),
    ]  # fmt: skip
    return nodes, p + "out"


def _model(layers: int = 2, tamper: str = "") -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(rng.normal(0, 0.3, (H, 2)).astype(np.float32), "cls_w"),
    ]
    nodes, x = [], "x"
    for i in range(layers):
        more, x = _layer(i, x, rng, inits)
        nodes += more
    if tamper == "transpose":  # a node that mixes positions after the last attention
        nodes.insert(-1, helper.make_node("Transpose", ["l1_res2"], ["l1_t"], perm=[1, 0, 2]))
        nodes[-1].input[0] = "l1_t"
    if tamper == "outside":  # reads a full-length tensor from outside the last layer
        nodes[-2].input[1] = "x"
    if tamper == "norm-over-tokens":  # a LayerNorm across positions
        nodes[-1].attribute[0].i = 1
    if tamper == "matmul-by-activations":  # the feed-forward multiplies by a computed tensor
        nodes[-3].input[1] = "l1_gelu"
    if tamper == "leak":  # the last layer's hidden states are also a graph output
        nodes.append(helper.make_node("Identity", ["l1_ln1"], ["hidden"]))
    nodes += [
        helper.make_node("Gather", [x, "zero"], ["cls"], axis=1),
        helper.make_node("MatMul", ["cls", "cls_w"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", H])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        inits,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def _run(model: onnx.ModelProto, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out: np.ndarray[Any, Any] = s.run(None, {"x": x})[0]
    return out


def test_the_last_layer_runs_on_the_first_token_and_the_logits_do_not_move() -> None:
    model = _model()
    cut = first_token_head(model)
    x = np.random.default_rng(1).normal(0, 1, (3, 11, H)).astype(np.float32)
    np.testing.assert_allclose(_run(cut, x), _run(model, x), atol=1e-5)
    # Both inputs of the last layer's position-wise part are sliced; the first layer is untouched.
    sliced = {n.input[0] for n in cut.graph.node if n.op_type == "Slice"}
    assert sliced == {"l1_att", "l0_out"}
    assert model.graph.node[0] == cut.graph.node[0]
    assert first_token_head(cut) == cut  # idempotent: a converted graph stays as it is


def test_a_graph_that_mixes_positions_after_the_last_attention_is_refused() -> None:
    with pytest.raises(ModelError, match="Transpose"):
        first_token_head(_model(tamper="transpose"))
    with pytest.raises(ModelError, match="computed outside the last layer"):
        first_token_head(_model(tamper="outside"))
    with pytest.raises(ModelError, match="not over the last axis"):
        first_token_head(_model(tamper="norm-over-tokens"))
    with pytest.raises(ModelError, match="multiplies by a computed tensor"):
        first_token_head(_model(tamper="matmul-by-activations"))
    with pytest.raises(ModelError, match="read outside the path to the head"):
        first_token_head(_model(tamper="leak"))


def test_a_graph_without_attention_or_head_is_refused() -> None:
    no_attention = _model()
    del no_attention.graph.node[:20]  # both layers gone: the head reads the input
    no_attention.graph.node[0].input[0] = "x"
    with pytest.raises(ModelError, match="no attention operator"):
        first_token_head(no_attention)
    no_head = _model()
    no_head.graph.node[-2].attribute[0].i = 2  # gathers along the hidden axis, not a position
    with pytest.raises(ModelError, match="one gather of position 0"):
        first_token_head(no_head)


def test_the_shipped_model_is_already_converted() -> None:
    shipped = onnx.load(str(SHIPPED))
    assert first_token_head(shipped) == shipped
    assert sum(n.op_type == "Slice" for n in shipped.graph.node) == 2
