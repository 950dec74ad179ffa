"""Train, export and ship the injection classifier: `python -m classifiers.injection.train OUT_DIR`.

One command, from `../shared/datasets/injection/train.jsonl` to a model directory the runtime
loads (`manifest.json` pinning `model.onnx` and `tokenizer.json` by sha256), on CPU:

1. **tokenizer**: byte-level BPE trained on the pool (`tokenizer.py`), Chinese included;
2. **augmentations** (`augment.py`): attacks embedded in benign documents, benign prompts that use
   attack vocabulary, attack framings composed from hand-written phrase banks (`phrases.py`), and
   their benign look-alikes (role and system prompts, documents with ordinary tasks);
3. **masked-LM pre-training** of the small RoBERTa on every training text (labels unused), so it
   learns the languages before it learns the labels;
4. **teacher** (`teacher.py`): character TF-IDF + frozen MiniLM embeddings, each with logistic
   regression, trained on the same rows; it scores every training window;
5. **fine-tuning with distillation**: family-balanced sampling; each window's target mixes its
   label with the teacher's score (windows cut from inside a long attack take the teacher's score
   alone: the attack may not be in that window);
6. **threshold** on a held-back tenth of the training rows (never dev);
7. **export** to ONNX, fuse (onnxruntime's transformer optimizer), quantize weights to int8, and
   check the exported model against PyTorch on the dev texts;
8. **manifest** + `metrics.json` (dev figures, timings, the recipe).

The same `Student` plugs into the leave-one-source-out evaluation (`evaluate.py --model student`)
with the pre-trained encoder of step 3 reused across folds. Needs `deploy/requirements-train.lock`
(torch, transformers); the runtime never imports torch.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import os
import random
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from classifiers.injection import augment, clean, extra, graph, tokenizer
from classifiers.injection.data import DATASETS, Row, load, split_calibration
from classifiers.injection.evaluate import threshold_at_fpr
from classifiers.injection.runtime import cut_windows, reading_form, session
from classifiers.injection.teacher import Embedder, Teacher

# The shipped architecture: chosen by latency on this 2-core machine (docs/injection.md): two
# layers of width 128 take ~3 ms for a 256-token window with one onnxruntime thread, int8.
ARCH = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512}


@dataclass(frozen=True, slots=True)
class Recipe:
    """Every setting of a training run (recorded in metrics.json)."""

    seed: int = 0
    vocab: int = 16_000
    max_length: int = 256  # positions; masked-LM pre-training windows
    # Fine-tuning and scoring window in tokens, <s> and </s> included (0: max_length). 128 since
    # 2026-12-01 (256 up to revision 41afc817): attention was most of a 256-token window's cost,
    # and the grouped folds read as well or better with 128 (model card).
    window: int = 128
    max_windows: int = 16  # windows read per text when scoring (runtime: the manifest's, or the policy's)
    mlm_steps: int = 2000
    mlm_batch: int = 64
    mlm_lr: float = 1e-3
    epochs: float = 4.0  # passes over a family-balanced sample the size of the training rows
    batch: int = 32
    lr: float = 4e-4
    distill: float = 0.5  # weight of the teacher's score in a window's target (0: labels only)
    crops: int = 2  # random windows per long text, besides its first and last
    embedded: int = 1500  # augmentation: attacks inside benign documents
    trigger: int = 600  # augmentation: benign prompts with attack vocabulary
    composed: int = 1200  # augmentation: attack framings x goals (phrases.py), en + zh
    indirect: int = 600  # augmentation: instructions to an AI inside benign documents
    benign: int = 1500  # augmentation: role/system prompts, documents with ordinary tasks
    length_balance: bool = False  # reweight both classes to one length distribution
    language_balance: bool = False  # ... and to one language distribution (en, zh, other)
    extra: bool = True  # add extra.jsonl (public data from pinned PyPI packages, extra.py) to training
    # ... and extra_prompts.jsonl (benign prompts of LLM frameworks, extra_prompts.py): off, measured
    # no better on the grouped folds (model card)
    prompts: bool = False
    prompt_docs: int = 0  # augmentation (with `prompts`): training documents under those prompts
    # Fine-tuning inputs: this share of each window's tokens is replaced by <mask>, so no single
    # word or template decides a verdict alone. Off: 0.15 read no better on folds 3-4 (model card)
    token_dropout: float = 0.0
    # Label-noise cleaning (clean.py): attack rows whose out-of-fold character-model score is under
    # this are dropped before training (0: off).
    clean: float = 0.0
    calib_fpr: float = 0.005  # threshold: flags this share of the held-back benign rows (model card)
    pretrained: bool = True  # start from the masked-LM encoder (False: from random weights)


def _torch() -> Any:
    import torch

    # The CPUs this process may run on (taskset, cgroups), not the machine's count.
    torch.set_num_threads(len(os.sched_getaffinity(0)) or 1)
    return torch


def _config(tok: Any, recipe: Recipe) -> Any:
    from transformers import RobertaConfig

    return RobertaConfig(
        vocab_size=tok.get_vocab_size(),
        max_position_embeddings=recipe.max_length + 2,
        pad_token_id=tok.token_to_id("<pad>"),
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
        num_labels=2,
        type_vocab_size=1,
        **ARCH,
    )


class Windows:
    """Token windows of `max_length` (with <s> … </s>) as the runtime cuts them."""

    def __init__(self, tok: Any, max_length: int) -> None:
        self.tok = tok
        self.body = max_length - 2
        self.bos, self.eos, self.pad, self.mask = (
            tok.token_to_id(t) for t in ("<s>", "</s>", "<pad>", "<mask>")
        )

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        self.tok.no_truncation()
        self.tok.no_padding()
        forms = [reading_form(t) for t in texts]
        return [e.ids for e in self.tok.encode_batch(forms, add_special_tokens=False)]

    def wrap(self, body: Sequence[int]) -> list[int]:
        return [self.bos, *body, self.eos]

    def for_training(
        self, ids: Sequence[int], rng: random.Random, crops: int
    ) -> list[tuple[list[int], bool]]:
        """(window, whole): the text itself if it fits; else its first, last and `crops` random windows."""
        if len(ids) <= self.body:
            return [(self.wrap(ids), True)]
        starts = {0, len(ids) - self.body, *(rng.randrange(0, len(ids) - self.body) for _ in range(crops))}
        return [(self.wrap(ids[s : s + self.body]), False) for s in sorted(starts)]

    def for_scoring(self, ids: Sequence[int], cap: int) -> list[list[int]]:
        return [self.wrap(c) for c in cut_windows(ids, self.body, cap)]

    def text_tokens(self, ids: Any, att: Any) -> Any:
        """Where a padded batch holds text: not <s>, </s> or padding (the tokens that may be masked)."""
        return (ids != self.bos) & (ids != self.eos) & (att == 1)


def _batches(
    lengths: Sequence[int], order: Sequence[int], batch: int, rng: random.Random
) -> Iterator[list[int]]:
    """Batches of similar length (less padding), in random order."""
    pool = 50 * batch
    out = []
    for i in range(0, len(order), pool):
        chunk = sorted(order[i : i + pool], key=lambda j: lengths[j])
        out += [chunk[k : k + batch] for k in range(0, len(chunk), batch)]
    rng.shuffle(out)
    yield from out


def _pad(torch: Any, seqs: Sequence[Sequence[int]], pad: int) -> tuple[Any, Any]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def _schedule(torch: Any, opt: Any, steps: int) -> Any:
    warm = max(1, steps // 20)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.0, (steps - s) / max(1, steps - warm))
    )


def _mlm_stamp(tok: Any, texts: Sequence[str], recipe: Recipe) -> str:
    """What a pre-trained encoder depends on, hashed."""
    import hashlib

    what = [tok.to_str(), list(texts), recipe.seed, recipe.max_length, recipe.mlm_steps, recipe.mlm_batch]
    # "reading-form-N": the encoder reads texts through runtime.reading_form (2: look-alikes,
    # classifiers.lookalike; 3: words of look-alikes alone in Latin text; 4: base64 that holds text;
    # 5: leetspeak; 6: nested encodings, ciphers and codes; 7: traditional Chinese as simplified;
    # 8, base32, changed no pool text; 9: pinyin as characters; 10: homophones as meant).
    return hashlib.sha256(json.dumps([*what, recipe.mlm_lr, ARCH, "reading-form-11"]).encode()).hexdigest()


def _update(torch: Any, model: Any, opt: Any, sched: Any, loss: Any, *, seen: float | None) -> float:
    """One optimizer step (gradients clipped at 1); returns the running mean of the loss."""
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    value = float(loss.item())
    return value if seen is None else 0.98 * seen + 0.02 * value


def pretrain(tok: Any, texts: Sequence[str], recipe: Recipe, out: Path, log: Any = print) -> Path:
    """Masked-LM pre-training on `texts` (labels unused); saves the encoder to `out`.

    Reused when `out` holds one made from the same tokenizer, texts and settings (it depends on
    nothing else), so retraining the classifier or running the evaluation does not pay for it again.
    """
    stamp = _mlm_stamp(tok, texts, recipe)
    if (out / "ztgate-stamp").exists() and (out / "ztgate-stamp").read_text() == stamp:
        log(f"  mlm: reusing {out}")
        return out
    torch = _torch()
    from transformers import RobertaForMaskedLM

    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)  # noqa: S311 - reproducible training, not a secret
    win = Windows(tok, recipe.max_length)
    seqs = []
    for ids in win.ids(texts):
        chunks = [ids[i : i + win.body] for i in range(0, len(ids), win.body)][:4]
        seqs += [win.wrap(c) for c in chunks if len(c) >= 8]
    model = RobertaForMaskedLM(_config(tok, recipe))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.mlm_lr, weight_decay=0.01)
    sched = _schedule(torch, opt, recipe.mlm_steps)
    vocab = tok.get_vocab_size()
    lengths = [len(s) for s in seqs]
    step, t0, seen = 0, time.time(), 0.0
    while step < recipe.mlm_steps:
        order = list(range(len(seqs)))
        rng.shuffle(order)
        for b in _batches(lengths, order, recipe.mlm_batch, rng):
            ids, att = _pad(torch, [seqs[j] for j in b], win.pad)
            pick = (torch.rand(ids.shape) < 0.15) & win.text_tokens(ids, att)
            if not pick.any():
                continue
            labels = ids[pick]
            inp = ids.clone()
            r = torch.rand(ids.shape)
            inp[pick & (r < 0.8)] = win.mask
            rand = pick & (r >= 0.8) & (r < 0.9)
            inp[rand] = torch.randint(5, vocab, (int(rand.sum()),))
            hidden = model.roberta(input_ids=inp, attention_mask=att).last_hidden_state
            loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[pick]), labels)
            seen = _update(torch, model, opt, sched, loss, seen=seen if step else None)
            step += 1
            if step % 250 == 0 or step == recipe.mlm_steps:
                log(f"  mlm step {step}/{recipe.mlm_steps}: loss {seen:.3f} ({time.time() - t0:.0f} s)")
            if step >= recipe.mlm_steps:
                break
    model.save_pretrained(out)
    (out / "ztgate-stamp").write_text(stamp)
    return out


def encoder_for(tok: Any, rows: Sequence[Row], recipe: Recipe, work: Path, log: Any = print) -> Path:
    """The masked-LM encoder of `rows` (and the trigger-word augmentation), pre-trained into
    `work/mlm-<seed>` once and reused while its inputs stay the same (training and evaluation)."""
    texts = [r.text for r in rows] + [
        r.text for r in augment.trigger_word_benign(recipe.trigger, recipe.seed)
    ]
    return pretrain(tok, texts, recipe, work / f"mlm-{recipe.seed}", log)


LENGTH_BUCKETS = (60, 150, 400, 1000, 3000)  # characters


def _length_bucket(text: str) -> int:
    return bisect.bisect_right(LENGTH_BUCKETS, len(text))


def _weights(
    rows: Sequence[Row], *, length_balance: bool = False, language_balance: bool = False
) -> list[float]:
    """Family-balanced sampling weights, each class half of the mass.

    A row's weight is 1/sqrt(size of its (family, label) group): large families still count more
    than small ones, but a 4,000-row family no longer drowns a 100-row one. With `length_balance`
    both classes are reweighted to one length distribution (the mean of theirs), so text length
    alone says nothing about the label (in the pool, texts over 1,000 characters are 25% of the
    attacks and 8% of the benign rows); `language_balance` does the same for the language (en,
    zh, other: Russian, Japanese, Arabic, Hindi… are mostly attacks in the pool). Both: one
    distribution over (length, language).
    """
    groups = Counter((r.family, r.label) for r in rows)
    raw = [1 / math.sqrt(groups[(r.family, r.label)]) for r in rows]
    if length_balance or language_balance:
        keys = [
            (_length_bucket(r.text) if length_balance else 0, r.language if language_balance else "")
            for r in rows
        ]
        mass: dict[tuple[int, tuple[int, str]], float] = defaultdict(float)
        for w, r, k in zip(raw, rows, keys, strict=True):
            mass[(r.label, k)] += w
        per_label = {y: sum(v for (lab, _), v in mass.items() if lab == y) or 1.0 for y in (0, 1)}
        share = {lk: v / per_label[lk[0]] for lk, v in mass.items()}
        target = {k: (share.get((0, k), 0.0) + share.get((1, k), 0.0)) / 2 for k in set(keys)}
        raw = [w * target[k] / share[(r.label, k)] for w, r, k in zip(raw, rows, keys, strict=True)]
    total = {y: sum(w for w, r in zip(raw, rows, strict=True) if r.label == y) for y in (0, 1)}
    return [w / total[r.label] / 2 if total[r.label] else 0.0 for w, r in zip(raw, rows, strict=True)]


def augmented(rows: Sequence[Row], r: Recipe) -> list[Row]:
    """The training rows (label-cleaned when the recipe asks), the extra rows when the recipe asks
    for them, and every augmentation the recipe asks for (drawn only from `rows`)."""
    rows = clean.drop_noisy_attacks(rows, r.clean, r.seed)
    return [
        *rows,
        *(extra.shipped() if r.extra else ()),
        *(extra.prompts() if r.prompts else ()),
        *augment.embedded_attacks(rows, r.embedded, r.seed),
        *augment.trigger_word_benign(r.trigger, r.seed),
        *augment.composed_attacks(r.composed, r.seed),
        *augment.composed_indirect(rows, r.indirect, r.seed),
        *augment.composed_benign(rows, r.benign, r.seed),
        *(augment.prompted_documents(rows, extra.prompts(), r.prompt_docs, r.seed) if r.prompts else ()),
    ]


class Student:
    """The shipped model's recipe as a trainable, scoreable object (also one LOSO fold)."""

    def __init__(
        self, tok: Any, recipe: Recipe, *, encoder: Path | None, embedder: Embedder, log: Any = print
    ) -> None:
        self.tok, self.recipe, self.encoder, self.embedder, self.log = tok, recipe, encoder, embedder, log
        self.win = Windows(tok, recipe.window or recipe.max_length)
        self.model: Any = None
        self.threshold = 0.5

    def _windows(
        self, rows: Sequence[Row], rng: random.Random
    ) -> tuple[list[tuple[list[int], float]], list[float]]:
        """Training windows with their targets, and their sampling weights."""
        r = self.recipe
        t0 = time.time()
        teacher = Teacher(self.embedder)
        teacher.fit(rows)
        self.log(f"  teacher trained on {len(rows)} rows ({time.time() - t0:.0f} s)")
        # (ids, label or None, row index); None = a window from inside a long attack.
        wins: list[tuple[list[int], int | None, int]] = []
        for i, (row, ids) in enumerate(zip(rows, self.win.ids([x.text for x in rows]), strict=True)):
            for w, whole in self.win.for_training(ids, rng, r.crops):
                wins.append((w, row.label if whole or row.label == 0 else None, i))
        t0 = time.time()
        soft = (
            teacher.score([self.tok.decode(w[1:-1]) for w, _, _ in wins]) if r.distill else [0.0] * len(wins)
        )
        self.log(f"  teacher scored {len(wins)} windows ({time.time() - t0:.0f} s)")
        row_w = _weights(rows, length_balance=r.length_balance, language_balance=r.language_balance)
        per_row = Counter(i for _, _, i in wins)
        # Without a teacher (distill 0) a window from inside a long attack keeps its row's label.
        inside = 1.0 if not r.distill else None
        targets = [
            (w, (inside or t) if label is None else (1 - r.distill) * label + r.distill * t)
            for (w, label, _), t in zip(wins, soft, strict=True)
        ]
        return targets, [row_w[i] / per_row[i] for _, _, i in wins]

    def fit(self, rows: Sequence[Row]) -> None:
        torch = _torch()
        from transformers import RobertaForSequenceClassification

        r = self.recipe
        torch.manual_seed(r.seed)
        rng = random.Random(r.seed)  # noqa: S311 - reproducible training, not a secret
        rows = augmented(rows, r)
        wins, sample_w = self._windows(rows, rng)
        if r.pretrained and self.encoder is not None:
            model = RobertaForSequenceClassification.from_pretrained(self.encoder, num_labels=2)
        else:
            model = RobertaForSequenceClassification(_config(self.tok, r))
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=r.lr, weight_decay=0.01)
        n = len(rows)
        steps = int(r.epochs * n / r.batch)
        sched = _schedule(torch, opt, steps)
        lengths = [len(w) for w, _ in wins]
        t0, step, seen = time.time(), 0, 0.0
        while step < steps:
            order = rng.choices(range(len(wins)), weights=sample_w, k=n)
            for b in _batches(lengths, order, r.batch, rng):
                ids, att = _pad(torch, [wins[j][0] for j in b], self.win.pad)
                if r.token_dropout:
                    ids = self._drop_tokens(torch, ids, att, r.token_dropout)
                y = torch.tensor([wins[j][1] for j in b])
                logits = model(input_ids=ids, attention_mask=att).logits
                loss = torch.nn.functional.cross_entropy(logits, torch.stack([1 - y, y], dim=1))
                seen = _update(torch, model, opt, sched, loss, seen=seen if step else None)
                step += 1
                if step % 200 == 0 or step == steps:
                    self.log(f"  fine-tune step {step}/{steps}: loss {seen:.3f} ({time.time() - t0:.0f} s)")
                if step >= steps:
                    break
        model.eval()
        self.model = model

    def _drop_tokens(self, torch: Any, ids: Any, att: Any, share: float) -> Any:
        """`ids` with about `share` of the text tokens set to <mask>."""
        out = ids.clone()
        out[(torch.rand(ids.shape) < share) & self.win.text_tokens(ids, att)] = self.win.mask
        return out

    def score(self, texts: Sequence[str]) -> list[float]:
        """Max over each text's windows, as the runtime reads it."""
        torch = _torch()
        flat: list[list[int]] = []
        owner: list[int] = []
        for i, ids in enumerate(self.win.ids(texts)):
            for w in self.win.for_scoring(ids, self.recipe.max_windows):
                flat.append(w)
                owner.append(i)
        probs = [0.0] * len(flat)
        order = sorted(range(len(flat)), key=lambda j: len(flat[j]))
        with torch.no_grad():
            for k in range(0, len(order), 64):
                b = order[k : k + 64]
                ids, att = _pad(torch, [flat[j] for j in b], self.win.pad)
                p = torch.softmax(self.model(input_ids=ids, attention_mask=att).logits, dim=-1)[:, 1]
                for j, v in zip(b, p.tolist(), strict=True):
                    probs[j] = v
        out = [0.0] * len(texts)
        for i, v in zip(owner, probs, strict=True):
            out[i] = max(out[i], v)
        return out


def to_onnx(
    model: Any, work: Path, final: Path, *, fuse_all: bool = False, first_token: bool = True
) -> tuple[Path, Path]:
    """`model` (eager attention) → fp32 ONNX in `work` → fused → int8 weights → last layer on the
    first token only (`graph.first_token_head`, unless `first_token` is false) at `final`.

    Fusion leaves residual + LayerNorm and bias + GELU unfused: onnxruntime 1.32's
    SkipLayerNormalization and BiasGelu kernels made a 256-token window of the shipped shape take
    2.5 ms instead of 1.7 ms on this machine (`python -m bench.injection_arch --fusion`); the runtime
    also keeps onnxruntime from fusing them again at load (runtime.py). `fuse_all`: every fusion,
    as before (for that benchmark).
    """
    torch = _torch()
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    cfg = model.config
    ids = torch.full((1, 32), 10, dtype=torch.long)
    fp32 = work / "model.fp32.onnx"
    torch.onnx.export(
        model,
        (ids, torch.ones_like(ids)),
        str(fp32),
        input_names=["input_ids", "attention_mask"],
        output_names=["logits"],
        dynamic_axes={"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"}},
        opset_version=17,
        dynamo=False,
    )
    fusion = FusionOptions("bert")
    fusion.enable_skip_layer_norm = fuse_all
    fusion.enable_bias_gelu = fuse_all
    fused = work / "model.fused.onnx"
    optimizer.optimize_model(
        str(fp32),
        model_type="bert",
        num_heads=cfg.num_attention_heads,
        hidden_size=cfg.hidden_size,
        optimization_options=fusion,
    ).save_model_to_file(str(fused))
    quantize_dynamic(
        str(fused),
        str(final),
        weight_type=QuantType.QInt8,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    if first_token:
        onnx.save(graph.first_token_head(onnx.load(str(final))), str(final))
    return fp32, final


def export(student: Student, out: Path, dev: Sequence[Row], log: Any = print) -> dict[str, Any]:
    """ONNX export, fusion, int8 weights; the exported model checked against PyTorch on dev texts."""
    torch = _torch()
    import numpy as np
    from transformers import RobertaForSequenceClassification

    tmp = out / "_export"
    tmp.mkdir(parents=True, exist_ok=True)
    student.model.save_pretrained(tmp / "torch")
    # Eager attention exports the pattern onnxruntime fuses into its Attention operator.
    model = RobertaForSequenceClassification.from_pretrained(
        tmp / "torch", attn_implementation="eager"
    ).eval()
    fp32, final = to_onnx(model, tmp, out / "model.onnx")
    # Check: PyTorch vs fp32 ONNX vs int8 ONNX on every dev window.
    cap = student.recipe.max_windows
    windows = [
        w for ids_ in student.win.ids([r.text for r in dev]) for w in student.win.for_scoring(ids_, cap)
    ]
    sess = {name: session(path) for name, path in (("fp32", fp32), ("int8", final))}
    diffs: dict[str, list[float]] = {"fp32": [], "int8": []}
    flips = 0
    thr = 0.5  # decisions compared at the middle; the shipped threshold is set afterwards
    with torch.no_grad():
        for w in windows:
            ref = float(torch.softmax(model(input_ids=torch.tensor([w])).logits, -1)[0, 1])
            for name, s in sess.items():
                logits = s.run(
                    None, {"input_ids": np.array([w]), "attention_mask": np.ones((1, len(w)), np.int64)}
                )[0]
                e = np.exp(logits[0] - logits[0].max())
                p = float(e[1] / e.sum())
                diffs[name].append(abs(p - ref))
                if name == "int8":
                    flips += (p >= thr) != (ref >= thr)
    check = {
        "windows": len(windows),
        "max_abs_diff_fp32": max(diffs["fp32"]),
        "max_abs_diff_int8": max(diffs["int8"]),
        "mean_abs_diff_int8": sum(diffs["int8"]) / len(windows),
        "decision_flips_int8": flips,
        "size_bytes": final.stat().st_size,
    }
    log(f"  export check: {json.dumps(check)}")
    return check


def _dev_metrics(scores: Sequence[float], rows: Sequence[Row], thr: float) -> dict[str, Any]:
    tp = sum(1 for r, s in zip(rows, scores, strict=True) if r.label and s >= thr)
    fp = sum(1 for r, s in zip(rows, scores, strict=True) if not r.label and s >= thr)
    fn = sum(1 for r, s in zip(rows, scores, strict=True) if r.label and s < thr)
    benign = sum(1 for r in rows if not r.label)

    def rates(key: Any) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for value in sorted({key(r) for r in rows}):
            sub = [(r, s) for r, s in zip(rows, scores, strict=True) if key(r) == value]
            b = [s for r, s in sub if not r.label]
            a = [s for r, s in sub if r.label]
            out[value] = {
                **({"benign": len(b), "fpr": sum(s >= thr for s in b) / len(b)} if b else {}),
                **({"attacks": len(a), "recall": sum(s >= thr for s in a) / len(a)} if a else {}),
            }
        return out

    by_lang, by_family = rates(lambda r: r.language), rates(lambda r: r.family)
    return {
        "threshold": thr,
        "by_family": by_family,
        "f1": 2 * tp / (2 * tp + fp + fn),
        "precision": tp / (tp + fp) if tp + fp else 0.0,
        "recall": tp / (tp + fn),
        "fpr": fp / benign,
        "by_language": by_lang,
    }


def _write_manifest(out: Path, recipe: Recipe, threshold: float) -> dict[str, Any]:
    from classifiers.injection.runtime import revision_name, sha256_file

    model_sha = sha256_file(out / "model.onnx")
    manifest = {
        "model": "model.onnx",
        "model_sha256": model_sha,
        "tokenizer": "tokenizer.json",
        "tokenizer_sha256": sha256_file(out / "tokenizer.json"),
        "max_length": recipe.window or recipe.max_length,
        "max_windows": recipe.max_windows,
        "threshold": round(threshold, 4),
        "revision": revision_name(model_sha),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _args() -> tuple[argparse.Namespace, Recipe]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument(
        "--work", type=Path, default=Path(".cache/injection"), help="pre-trained encoder, embeddings"
    )
    ap.add_argument("--limit", type=int, help="train on this many rows only (a smoke run)")
    ap.add_argument(
        "--recalibrate",
        action="store_true",
        help="keep the model in OUT, set only its threshold (--calib-fpr) and dev figures anew",
    )
    for name, value in dataclasses.asdict(Recipe()).items():
        kind = int if isinstance(value, bool) else type(value)
        ap.add_argument(f"--{name.replace('_', '-')}", type=kind, default=value)
    args = ap.parse_args()
    defaults = Recipe()
    recipe = Recipe(
        **{f.name: type(getattr(defaults, f.name))(getattr(args, f.name)) for f in dataclasses.fields(Recipe)}
    )
    return args, recipe


def calibrate(out: Path, recipe: Recipe, calib: Sequence[Row], dev: Sequence[Row]) -> dict[str, Any]:
    """Threshold and dev figures from the exported artifact itself, read as the gateway reads it;
    writes `manifest.json`. Returns the manifest and the dev figures."""
    from classifiers.injection.runtime import InjectionModel, Manifest

    _write_manifest(out, recipe, 0.5)
    shipped = InjectionModel(Manifest.load(out / "manifest.json"), cache_size=0)  # the manifest's cap
    calib_scores = [shipped.score(r.text) for r in calib]
    threshold = threshold_at_fpr(calib_scores, [r.label for r in calib], recipe.calib_fpr)
    manifest = _write_manifest(out, recipe, threshold)
    metrics = _dev_metrics([shipped.score(r.text) for r in dev], dev, round(threshold, 4))
    print(
        f"threshold {threshold:.4f} (flags {recipe.calib_fpr:.2%} of held-back benign); dev: {json.dumps(metrics)}"
    )
    return {"manifest": manifest, "dev": metrics}


def main() -> None:
    args, recipe = _args()
    started = time.time()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    rows = load(DATASETS / "train.jsonl")
    dev = load(DATASETS / "dev.jsonl")
    if args.limit:
        rows = random.Random(recipe.seed).sample(rows, args.limit)  # noqa: S311 - a smoke run
        dev = dev[: args.limit // 4]
    calib, fit_rows = split_calibration(rows, recipe.seed)
    if args.recalibrate:
        # A new operating point for the model already in OUT: training does not depend on
        # calib_fpr, so this equals a full run with the same recipe (same model bytes).
        metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
        done = calibrate(out, recipe, calib, dev)
        metrics |= {"revision": done["manifest"]["revision"], "dev": done["dev"]}
        metrics["recipe"] |= {"calib_fpr": recipe.calib_fpr}
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        return
    timings: dict[str, float] = {}

    t = time.time()
    tok = tokenizer.train((r.text for r in rows), recipe.vocab)
    tok.save(str(out / "tokenizer.json"))
    timings["tokenizer_s"] = time.time() - t
    print(f"tokenizer: {tok.get_vocab_size()} tokens ({timings['tokenizer_s']:.0f} s)")

    encoder = None
    if recipe.pretrained:
        t = time.time()
        encoder = encoder_for(tok, rows, recipe, args.work)
        timings["pretrain_s"] = time.time() - t

    t = time.time()
    embedder = Embedder(args.work / "minilm-embeddings.npz")
    student = Student(tok, recipe, encoder=encoder, embedder=embedder)
    student.fit(fit_rows)
    timings["fine_tune_s"] = time.time() - t

    t = time.time()
    check = export(student, out, dev)
    timings["export_s"] = time.time() - t
    shutil.rmtree(out / "_export")
    done = calibrate(out, recipe, calib, dev)
    timings["total_s"] = time.time() - started
    (out / "metrics.json").write_text(
        json.dumps(
            {
                "revision": done["manifest"]["revision"],
                "recipe": dataclasses.asdict(recipe),
                "arch": ARCH,
                "dev": done["dev"],
                "export": check,
                "timings": timings,
                "rows": {
                    "train": len(fit_rows),
                    "calibration": len(calib),
                    "dev": len(dev),
                    "extra": len(extra.shipped()) if recipe.extra else 0,
                    "prompts": len(extra.prompts()) if recipe.prompts else 0,
                },
                "extra_sha256": extra.EXTRA_SHA256 if recipe.extra else None,
                "prompts_sha256": extra.PROMPTS_SHA256 if recipe.prompts else None,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    print(
        f"wrote {out}/manifest.json (revision {done['manifest']['revision']}) in {timings['total_s'] / 60:.1f} min"
    )


if __name__ == "__main__":
    main()
