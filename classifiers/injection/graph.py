"""Graph surgery on an exported classifier: its last layer computes the first token only.

A sequence classifier of the RoBERTa/BERT family reads one position at the end, the first token
(`<s>`/`[CLS]`): the head gathers `hidden[:, 0]`. Every position of the last layer still feeds that
token's attention (keys and values), but past the attention the layer is position-wise (output
projection, residual, LayerNorm, feed-forward, LayerNorm), so computing it for every position
and keeping one is wasted work: for the shipped shape (2 layers, width 128, feed-forward 512) it
is about a third of the model's multiply-adds.

`first_token_head` slices position 0 off the last attention's output and off the residual that
joins it, so the rest of the layer runs on one row per window. Same weights, same operators; the
logits change only where int8 activations are quantized per tensor (a scale over one row instead
of all rows). Refuses (ModelError) any graph where that is not the same computation: a head
that is not a gather of position 0, a node between the attention and the head that is not
position-wise or reads a full-length tensor from outside the last layer, or a tensor of that
stretch that something else reads (hidden states exported as an output).

The training export applies it; `python -m classifiers.injection.graph MODEL_DIR` converts a model
exported before (and prints how its scores moved on the dev texts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from classifiers.injection.runtime import ModelError

ATTENTION = {"Attention", "QAttention", "MultiHeadAttention"}
# Operators that compute each position from that position alone (over the last axis at most), as
# the transformer optimizer and dynamic quantization leave them. DynamicQuantizeLinear's scale
# spans the tensor: the one approximation this surgery makes (module docstring).
POSITIONWISE = {
    "Add", "BiasGelu", "Cast", "Div", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "Erf",
    "FastGelu", "Gelu", "LayerNormalization", "MatMul", "MatMulInteger", "MatMulIntegerToFloat",
    "Mul", "Pow", "ReduceMean", "SkipLayerNormalization", "Sqrt", "Sub", "Tanh",
}  # fmt: skip
MATMUL = {"MatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}  # weights second
NORMS = {"LayerNormalization", "SkipLayerNormalization"}  # position-wise over the last axis only


def _constants(g: onnx.GraphProto) -> dict[str, np.ndarray[Any, Any]]:
    out = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = numpy_helper.to_array(a.t)
    return out


def _axis(node: onnx.NodeProto, default: int = 0) -> int:
    return next((int(a.i) for a in node.attribute if a.name == "axis"), default)


def _head(g: onnx.GraphProto, consts: dict[str, np.ndarray[Any, Any]]) -> onnx.NodeProto:
    """The one gather of position 0 along the token axis: the classification head's input."""
    heads = [
        n
        for n in g.node
        if n.op_type == "Gather"
        and _axis(n) == 1
        and n.input[1] in consts
        and consts[n.input[1]].size == 1
        and int(consts[n.input[1]].reshape(-1)[0]) == 0
    ]
    if len(heads) != 1:
        raise ModelError(f"graph: expected one gather of position 0 (the head), found {len(heads)}")
    return heads[0]


def _last_attention(
    g: onnx.GraphProto, head: onnx.NodeProto, producer: dict[str, onnx.NodeProto]
) -> tuple[onnx.NodeProto, str, set[int]]:
    """(the last attention before the head, its layer's input tensor, ids of the head's ancestors)."""
    ancestors: set[int] = set()
    todo = [head.input[0]]
    while todo:
        n = producer.get(todo.pop())
        if n is not None and id(n) not in ancestors:
            ancestors.add(id(n))
            todo.extend(n.input)
    attn = [n for n in g.node if n.op_type in ATTENTION and id(n) in ancestors]
    if not attn:
        raise ModelError("graph: no attention operator before the head (fuse the model first)")
    last = attn[-1]  # nodes are in topological order
    hidden_in = last.input[0]
    if last.op_type == "QAttention":
        quantizer = producer.get(hidden_in)
        if quantizer is None or quantizer.op_type != "DynamicQuantizeLinear":
            raise ModelError("graph: the last QAttention's input is not dynamically quantized")
        hidden_in = quantizer.input[0]
    return last, hidden_in, ancestors


def _check(
    segment: list[onnx.NodeProto],
    *,
    sources: set[str],
    consts: dict[str, np.ndarray[Any, Any]],
    users: dict[str, list[onnx.NodeProto]],
    outputs: set[str],
    head: onnx.NodeProto,
) -> None:
    """Every node of the segment is position-wise and reads only the segment, `sources` and
    constants; nothing outside it reads what it computes (but the head)."""
    inside = {id(n) for n in segment} | {id(head)}
    produced = {t for n in segment for t in n.output} | sources
    for n in segment:
        if n.op_type not in POSITIONWISE:
            raise ModelError(f"graph: {n.op_type} node {n.name!r} between the last attention and the head")
        if n.op_type in MATMUL and any(t in produced for t in n.input[1:2]):
            raise ModelError(f"graph: {n.op_type} {n.name!r} multiplies by a computed tensor, not weights")
        if n.op_type in NORMS and _axis(n, -1) not in (-1, 2):
            raise ModelError(f"graph: {n.op_type} {n.name!r} is not over the last axis")
        if n.op_type == "ReduceMean":
            given = consts.get(n.input[1]) if len(n.input) > 1 else None
            attr = next((list(a.ints) for a in n.attribute if a.name == "axes"), None)
            if list(np.asarray(given if given is not None else attr).reshape(-1)) not in ([-1], [2]):
                raise ModelError(f"graph: ReduceMean {n.name!r} is not over the last axis")
        for t in n.input:
            if t and t not in produced and t not in consts:
                raise ModelError(f"graph: node {n.name!r} reads {t!r}, computed outside the last layer")
        for t in n.output:
            readers = [u for u in users[t] if id(u) not in inside]
            if t in outputs or readers:
                raise ModelError(f"graph: {t!r} is read outside the path to the head")


def first_token_head(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose last layer runs on position 0 only (module docstring)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    consts = _constants(g)
    producer = {t: n for n in g.node for t in n.output}
    head = _head(g, consts)
    last, hidden_in, ancestors = _last_attention(g, head, producer)
    attn_out = last.output[0]
    users: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in g.node:
        for t in n.input:
            users[t].append(n)
    if [u.op_type for u in users[attn_out]] == ["Slice"]:
        return out  # already done

    # The segment: what the attention's output reaches on its way to the head.
    segment: list[onnx.NodeProto] = []
    seen: set[int] = {id(head)}
    todo = [attn_out]
    while todo:
        for n in users[todo.pop()]:
            if id(n) in ancestors and id(n) not in seen:
                seen.add(id(n))
                segment.append(n)
                todo.extend(n.output)
    _check(
        segment,
        sources={attn_out, hidden_in},
        consts=consts,
        users=users,
        outputs={o.name for o in g.output},
        head=head,
    )

    first = {t: f"{t}_first_token" for t in (attn_out, hidden_in)}
    starts, ends, axes = (f"first_token_{k}" for k in ("starts", "ends", "axes"))
    g.initializer.extend(
        numpy_helper.from_array(np.array(v, np.int64), name)
        for name, v in ((starts, [0]), (ends, [1]), (axes, [1]))
    )
    for n in segment:
        for i, t in enumerate(n.input):
            if t in first:
                n.input[i] = first[t]
    nodes = list(g.node)
    at = next(i for i, n in enumerate(nodes) if n is last or n == last) + 1
    del g.node[:]
    g.node.extend(nodes[:at])
    g.node.extend(
        helper.make_node("Slice", [t, starts, ends, axes], [s], name=f"FirstToken_{i}")
        for i, (t, s) in enumerate(first.items())
    )
    g.node.extend(nodes[at:])
    # Shapes recorded for the segment's tensors no longer hold; let onnxruntime infer them.
    stale = {t for n in segment for t in n.output}
    kept = [v for v in g.value_info if v.name not in stale]
    del g.value_info[:]
    g.value_info.extend(kept)
    onnx.checker.check_model(out)
    return out


def convert(model_dir: Path) -> dict[str, float] | None:
    """Rewrite `model_dir/model.onnx` with `first_token_head`, re-pin it in the manifest (same
    threshold: set it anew with `train --recalibrate`) and compare both graphs on the dev texts,
    read as the gateway reads them. None, and nothing written, if it was converted already."""
    import shutil
    import tempfile

    from classifiers.injection.data import DATASETS, load
    from classifiers.injection.runtime import InjectionModel, Manifest, revision_name, sha256_file

    path = model_dir / "manifest.json"
    before = Manifest.load(path)
    with tempfile.TemporaryDirectory() as d:
        old = Path(d) / "model.onnx"
        shutil.copyfile(before.model, old)
        source = onnx.load(str(old))
        converted = first_token_head(source)
        if converted == source:
            return None
        onnx.save(converted, str(before.model))
        sha = sha256_file(before.model)
        doc = json.loads(path.read_text(encoding="utf-8"))
        doc |= {"model_sha256": sha, "revision": revision_name(sha)}
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        a = InjectionModel(dataclasses.replace(before, model=old), cache_size=0)
        b = InjectionModel(Manifest.load(path), cache_size=0)
        texts = [r.text for r in load(DATASETS / "dev.jsonl")]
        pairs = [(a.score(t), b.score(t)) for t in texts]
    diffs = [abs(x - y) for x, y in pairs]
    thr = before.threshold
    check = {
        "texts": len(texts),
        "max_abs_diff": max(diffs),
        "mean_abs_diff": sum(diffs) / len(diffs),
        "decision_flips": sum((x >= thr) != (y >= thr) for x, y in pairs),
    }
    metrics = model_dir / "metrics.json"
    if metrics.exists():
        doc = json.loads(metrics.read_text(encoding="utf-8"))
        doc["first_token_head"] = {"converted_from": before.revision, "dev_check": check}
        metrics.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path, help="a model directory (manifest.json, model.onnx)")
    a = ap.parse_args()
    try:
        check = convert(a.model_dir)
    except ModelError as exc:
        raise SystemExit(f"{a.model_dir}: left as it is: {exc}") from None
    if check is None:
        print(f"{a.model_dir}/model.onnx already runs its last layer on the first token; nothing changed")
        return
    print(f"rewrote {a.model_dir}/model.onnx; against the previous graph on dev: {json.dumps(check)}")
    print(f"set its threshold: python -m classifiers.injection.train {a.model_dir} --recalibrate")


if __name__ == "__main__":
    main()
