"""A tiny Llama GGUF generated offline, served by llama.cpp's own server (`xllamacpp`).

2 layers, 64-wide, 4 heads, F32, random weights with a fixed seed (byte-identical across runs),
an SPM tokenizer of byte tokens plus a few hundred words. Output rows of byte and special tokens
are zeroed so it emits readable words; `</s>` is practically never sampled, so answers run to
`max_tokens` (exact stream lengths for tests). `python -m gateway.upstreams.tinyllama PORT GGUF`
serves it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

WORDS = (  # noqa: SIM905 - a word list reads better as text
    "the of and to in is was for on that with as by at from his her are were be this which or an had not "
    "but what all when there can who been one more will would their they if about out so into time people "
    "year said could also them than some only other new over first after most made where way may many well "
    "such like even back any good world should these work life through down before must long great little "
    "own just state both between under never same another while last might found each house since against "
    "right three however during without place again old around small public number part course home large "
    "school often war until water point family city given early case system group hand law both better "
    "model answer question gateway policy secure token stream server request client data simple quick blue "
    "green river mountain garden music window letter paper story light morning evening friend market table "
    "bright calm gentle happy quiet rapid silver golden winter summer spring autumn ocean forest island "
    "bridge road tower field stone cloud rain snow wind fire star moon sun tree flower bird fish horse dog "
    "cat book pen door wall floor chair bread milk tea coffee apple orange lemon sugar salt honey"
).split()
N_EMBD, N_LAYER, N_HEAD, N_FF, N_CTX = 64, 2, 4, 128, 2048
SEED = 1234
# Tools are rendered whole, as Llama 3.1's and Qwen 2.5's templates do (`tool | tojson`), so the
# demo model reads a tool definition the way production models do.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|tools|>' }}{% for t in tools %}{{ t | tojson + '\\n' }}{% endfor %}{% endif %}"
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + (m['content'] if m['content'] is string else '') + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def write_gguf(path: Path, seed: int = SEED) -> None:
    """Write the model to `path`."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [
        gguf.TokenType.BYTE
    ] * 256
    words = list(dict.fromkeys(WORDS))
    tokens += ["▁" + w for w in words] + [".", ",", "▁"]
    types += [gguf.TokenType.NORMAL] * (len(words) + 3)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    n_vocab = len(tokens)

    def w(*shape: int, scale: float = 0.2) -> np.ndarray[Any, Any]:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("ztgate-tiny-llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_tensor("token_embd.weight", w(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    out = w(n_vocab, N_EMBD, scale=0.5)
    out[:259] = 0.0  # never emit special or byte tokens: readable words only
    writer.add_tensor("output.weight", out)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(p + name + ".weight", w(N_EMBD, N_EMBD))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(p + "ffn_gate.weight", w(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_up.weight", w(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_down.weight", w(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def model_path(models_dir: Path) -> Path:
    """Where the demo model lives, named by what shapes it (template, sizes, words, seed): a change
    to any of them makes a new file instead of serving a stale one from the cache."""
    shape = repr((CHAT_TEMPLATE, N_EMBD, N_LAYER, N_HEAD, N_FF, N_CTX, WORDS, SEED)).encode()
    return models_dir / f"tiny-llama-{hashlib.sha256(shape).hexdigest()[:12]}.gguf"


def ensure_model(path: Path) -> None:
    """Generate the model if it is missing, whole or not at all: it is written beside `path` and
    renamed into place, so a start cut short never leaves a truncated file that later starts
    would take for the model."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        write_gguf(part)
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)


def serve(port: int, model: Path, alias: str = "tiny-llama") -> None:
    """Run llama.cpp's server in this process until SIGTERM/SIGINT."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.model_alias = alias
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_ctx = N_CTX
    params.n_parallel = 4
    params.cpuparams.n_threads = 1
    params.use_jinja = True
    server = xllamacpp.Server(params)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    del server


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m gateway.upstreams.tinyllama PORT MODEL.gguf")
    gguf_path = Path(sys.argv[2])
    ensure_model(gguf_path)
    serve(int(sys.argv[1]), gguf_path)
