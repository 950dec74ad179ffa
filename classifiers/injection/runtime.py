"""Injection classifier runtime: onnxruntime + tokenizers, no torch at run time.

Loads any exported sequence-classification ONNX model (inputs `input_ids`, `attention_mask`,
optionally `token_type_ids`; output logits `[batch, labels]`, label 1 = injection) with its
`tokenizer.json`, named by a manifest that pins both files by sha256: a file that does not match
is refused at load, never used.

Long texts are scored in windows of the model's length and the highest score counts. Windows are
capped (`max_windows`): the first windows, and the last one, so an attacker cannot push an
instruction past the cap at the end of a long document; what lies between the capped head and
the tail of a very long text is not read (docs/injection.md). A text far longer than its windows
hold is read by its edges alone (`edges`): reading 4 MB whole took seconds, past any time budget.
Verdicts are cached per text by content hash, so a chat that resends its system prompt and
history pays only for the new turn.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from classifiers import flipped, hant, pinyin
from classifiers.encoded import decipher, unspell, unwrap
from classifiers.invisible import FOLD, unhide
from classifiers.lookalike import STYLED, unmask


class ModelError(ValueError):
    """A model, tokenizer or manifest that cannot be used as it is."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a model directory ships: files pinned by sha256, and how to use them."""

    model: Path
    model_sha256: str
    tokenizer: Path
    tokenizer_sha256: str
    max_length: int = 256
    threshold: float = 0.5
    revision: str = ""
    max_windows: int = 8  # windows per text the threshold was set with (a policy may change it)

    @classmethod
    def load(cls, path: Path) -> Manifest:
        """Read `manifest.json`; file paths are relative to it."""
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            m = cls(
                model=path.parent / doc["model"],
                model_sha256=doc["model_sha256"],
                tokenizer=path.parent / doc["tokenizer"],
                tokenizer_sha256=doc["tokenizer_sha256"],
                max_length=int(doc.get("max_length", 256)),
                threshold=float(doc.get("threshold", 0.5)),
                revision=str(doc.get("revision") or doc["model_sha256"][:12]),
                max_windows=int(doc.get("max_windows", 8)),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"{path}: not a usable manifest ({type(exc).__name__}: {exc})") from None
        if m.max_windows < 1 or m.max_length < 3:
            # 0 windows would read only a text's last window: refuse rather than under-read.
            raise ModelError(
                f"{path}: not a usable manifest (max_windows must be 1 or more, max_length 3 or more)"
            )
        return m


def _reading_table() -> dict[int, str | None]:
    table = dict(FOLD)
    # Fullwidth Latin letters and digits read as ASCII; unusual spaces as a space. Chinese
    # punctuation is left as it is: the model learned it.
    for start, end in ((0xFF10, 0xFF19), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A)):
        table.update({cp: chr(cp - 0xFEE0) for cp in range(start, end + 1)})
    for cp in (0x00A0, *range(0x2000, 0x200B), 0x202F, 0x205F, 0x3000):
        table[cp] = " "
    table.update(STYLED)
    return table


_READING = _reading_table()


def reading_form(text: str) -> str:
    """The text as the classifier reads it: invisible characters folded and bytes smuggled in
    variation selectors read as their text (classifiers.invisible), fullwidth and styled letters
    and odd spaces as ASCII, base64 runs that hold text as that text (classifiers.encoded,
    nested up to three levels), English in a Caesar (ROT13) or Atbash cipher, in Morse or in
    character codes as that English, traditional Chinese as simplified
    (classifiers.hant), look-alike letters in Latin words as Latin and spelled-out words joined
    (classifiers.lookalike), English and Chinese written backwards as written forwards
    (classifiers.flipped), Chinese written in pinyin as characters and characters written for
    their sound (homophones) as the characters meant (classifiers.pinyin). Only what is scored;
    the upstream gets the text as it was sent."""
    text = unhide(text).translate(_READING)
    plain = decipher(unspell(unwrap(text)))
    if plain != text:  # what was encoded may hide characters of its own
        text = plain.translate(_READING)
    return pinyin.correct(pinyin.read(flipped.unflip(unmask(hant.simplify(text)))))


def text_key(text: str) -> str:
    """A text's content hash (any str, lone surrogates included): the verdict cache's key."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class Assessment:
    """One text's verdict: its score, how many of its tokens lay past the window cap, unread, and
    how many of its characters were not read at all (between the edges of a text read by them)."""

    score: float
    unread: int
    skipped: int = 0


# Where a text may be cut without cutting an encoded run (base64, base32, hex, escapes: their
# characters, and the run must end where the cut is) or a word: any other character.
_BREAK = re.compile(r"[^A-Za-z0-9+/=_\-%\\]")
_LAST_BREAK = re.compile(r".*[^A-Za-z0-9+/=_\-%\\]", re.DOTALL)
# Tokens read past what an edge needs: a cut can still fall inside what the reading form joins
# across spaces (Morse, character codes, pinyin, a spelled-out word), and those tokens are dropped.
EDGE_MARGIN = 32
# Characters of an encoded run that decode to whole bytes, and whose bytes again do, through the
# levels of encoding read (base64 four characters to three bytes, base32 eight to five, hex two to
# one): 1,920 base64 characters are 1,440 bytes, 1,080 bytes if those are base64 again.
RUN_ALIGN = 1920


def _break_from(text: str, pos: int) -> int | None:
    """The first place at or after `pos` where `text` may be cut (None: nowhere)."""
    m = _BREAK.search(text, pos)
    return None if m is None else m.start()


def _break_before(text: str, pos: int) -> int | None:
    """The last place at or before `pos` where `text` may be cut, looked for backwards in chunks
    (None: nowhere)."""
    end = pos + 1
    while end > 0:
        start = max(0, end - 4096)
        m = _LAST_BREAK.match(text, start, end)
        if m is not None:
            return m.end() - 1
        end = start
    return None


def _cut(text: str, chars: int, *, forward: bool) -> int:
    """Where an edge of about `chars` characters ends (the head) or starts (the tail): at a break,
    or, inside a run of run characters that goes on past a quarter of the text (4 MB of base64), a
    multiple of RUN_ALIGN characters from the run's start, where its pieces decode as its text."""
    quarter = len(text) // 4
    if forward:
        cut = _break_from(text, chars)
        if cut is not None and cut <= quarter:
            return cut
        before = _break_before(text, chars)
        start = 0 if before is None else before + 1
        return start + RUN_ALIGN * -(-(chars - start) // RUN_ALIGN)
    pos = len(text) - chars
    cut = _break_before(text, pos)
    if cut is not None and len(text) - cut <= quarter:
        return cut
    start = 0 if cut is None else cut + 1
    return start + RUN_ALIGN * ((pos - start) // RUN_ALIGN)


def cut_windows(ids: Sequence[int], body: int, cap: int) -> list[list[int]]:
    """`ids` in the fewest chunks of at most `body` tokens, all of about one length (no stub of a
    few tokens at the end, read without context and padded to a full window in a batch); past
    `cap` chunks, the first `cap - 1` full ones and the last `body` tokens.

    Training cuts its scoring windows with this too, so a model is read as it was evaluated.
    """
    n = len(ids)
    k = max(1, -(-n // body))
    if k > cap:
        return [*(list(ids[i * body : (i + 1) * body]) for i in range(cap - 1)), list(ids[-body:])]
    q, r = divmod(n, k)  # r chunks of q + 1 tokens, then k - r of q
    bounds = [i * q + min(i, r) for i in range(k + 1)]
    return [list(ids[a:b]) for a, b in itertools.pairwise(bounds)]


def revision_name(model_sha256: str) -> str:
    """The revision a model export is shipped under: the day it was made and its sha256."""
    import time

    return f"ztgate-injection-{time.strftime('%Y%m%d')}-{model_sha256[:8]}"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# onnxruntime fuses residual + LayerNorm into SkipLayerNormalization at load; in onnxruntime 1.32
# on this machine that kernel made the shipped model's 256-token window 30% slower (2.5 ms instead
# of 1.7 ms, `python -m bench.injection_arch --fusion`). The export leaves them unfused too.
SLOW_FUSIONS = ["SkipLayerNormFusion"]


def session(path: Path, threads: int = 1, *, fuse_all: bool = False, optimized_to: Path | None = None) -> Any:
    """An onnxruntime CPU session for a classifier graph, as the gateway runs it. `fuse_all`: with
    every onnxruntime fusion (for that benchmark); `optimized_to`: also write the graph as
    onnxruntime optimized it (for inspection)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    if optimized_to is not None:
        opts.optimized_model_filepath = str(optimized_to)
    return ort.InferenceSession(
        str(path),
        opts,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=[] if fuse_all else SLOW_FUSIONS,
    )


class InjectionModel:
    """One ONNX session and tokenizer per worker; `score` is thread-safe and CPU-bound."""

    def __init__(
        self,
        manifest: Manifest,
        *,
        max_windows: int | None = None,
        threads: int = 1,
        cache_size: int = 4096,
    ) -> None:
        # One text per call: a rayon pool per worker would only add threads to a CPU-bound process.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from tokenizers import Tokenizer

        for path, want in (
            (manifest.model, manifest.model_sha256),
            (manifest.tokenizer, manifest.tokenizer_sha256),
        ):
            try:
                got = sha256_file(path)
            except OSError as exc:
                raise ModelError(f"{path}: cannot read ({exc.strerror})") from None
            if got != want:
                raise ModelError(f"{path}: sha256 {got[:12]}… does not match the manifest's {want[:12]}…")
        try:
            hant.table()  # the reading form's tables, checked here at start-up, not on a first prompt
            pinyin.prepare()
            flipped.prepare()
        except (OSError, RuntimeError) as exc:
            raise ModelError(str(exc)) from None
        self.manifest = manifest
        self.revision = manifest.revision
        self.max_windows = max_windows or manifest.max_windows
        try:
            self._session = session(manifest.model, threads)
            self._tok = Tokenizer.from_file(str(manifest.tokenizer))
        except Exception as exc:  # noqa: BLE001 - onnxruntime and tokenizers raise their own types
            raise ModelError(f"cannot load the model: {type(exc).__name__}: {exc}") from None
        self._tok.no_truncation()
        self._tok.no_padding()
        self._inputs = {i.name for i in self._session.get_inputs()}
        if not {"input_ids", "attention_mask"} <= self._inputs:
            raise ModelError(
                f"the model takes {sorted(self._inputs)}; input_ids and attention_mask are needed"
            )
        self._bos = self._special(("<s>", "[CLS]"))
        self._eos = self._special(("</s>", "[SEP]"))
        self._pad = self._special(("<pad>", "[PAD]")) or 0
        # Text tokens per window, the specials left out.
        self._body = manifest.max_length - (self._bos is not None) - (self._eos is not None)
        self._cache: OrderedDict[str, Assessment] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.cache_hits = 0

    def _special(self, names: Sequence[str]) -> int | None:
        for n in names:
            i = self._tok.token_to_id(n)
            if i is not None:
                return int(i)
        return None

    def tokens(self, text: str) -> int:
        """How many tokens `text` is, without the specials."""
        return len(self._ids(text))

    def _ids(self, text: str) -> list[int]:
        # encode_batch_fast: the same ids without character offsets, 25% faster on long texts here.
        ids: list[int] = self._tok.encode_batch_fast([reading_form(text)], add_special_tokens=False)[0].ids
        return ids

    def windows(self, text: str) -> list[list[int]]:
        """Token windows of the model's length: the first `max_windows - 1` and the last one."""
        return self._windows_of(self._read(text)[0])

    def _read(self, text: str) -> tuple[list[int], int, int]:
        """The tokens to score, how many tokens were read and not kept, and how many characters
        were not read: the text read whole, or by its edges when it is far longer than the windows."""
        edges = self.edges(text)
        if edges is None:
            ids = self._ids(text)
            return ids, max(0, len(ids) - self.max_windows * self._body), 0
        (cut, head), (end, tail) = edges
        keep = (self.max_windows - 1) * self._body
        return head[:keep] + tail[-self._body :], len(head) - keep + len(tail) - self._body, end - cut

    def edges(self, text: str) -> tuple[tuple[int, list[int]], tuple[int, list[int]]] | None:
        """A long text read by its edges: (where its head ends, the head's tokens) and (where its
        tail starts, the tail's tokens), each read on its own and holding at least the tokens its
        windows take (the tail: one window) and EDGE_MARGIN more; None to read the text whole,
        when the edges would take more than a quarter of it each or it has no place to cut.

        Each edge is read as a text of its own (the reading form decides, e.g., whether the text
        is mostly pinyin from that edge); a cut falls only where no encoded run or word goes on.
        """
        keep = (self.max_windows - 1) * self._body
        head = (0, []) if keep == 0 else self._edge(text, keep + EDGE_MARGIN, forward=True)
        tail = self._edge(text, self._body + EDGE_MARGIN, forward=False)
        if head is None or tail is None or head[0] > tail[0]:
            return None
        return head, tail

    def _edge(self, text: str, need: int, *, forward: bool) -> tuple[int, list[int]] | None:
        chars = 5 * need  # a token is about four characters of English (Chinese: fewer)
        while 4 * chars <= len(text):
            cut = _cut(text, chars, forward=forward)
            span = cut if forward else len(text) - cut
            if not 0 < span <= len(text) // 4:
                return None  # a cut past a quarter of the text: as well read it whole
            ids = self._ids(text[:cut] if forward else text[cut:])
            if len(ids) >= need:
                return cut, ids
            # The text reads to fewer tokens than that (encoded, folded): as many characters as
            # those tokens suggest, and at least twice as many.
            chars = max(2 * chars, span * need // max(1, len(ids)) * 5 // 4)
        return None

    def _windows_of(self, ids: list[int]) -> list[list[int]]:
        head = [self._bos] if self._bos is not None else []
        tail = [self._eos] if self._eos is not None else []
        return [head + c + tail for c in cut_windows(ids, self._body, self.max_windows)]

    def run_windows(self, windows: list[list[int]]) -> list[float]:
        """Score token windows in one session call."""
        import numpy as np

        width = max(len(w) for w in windows)
        ids = np.full((len(windows), width), self._pad, dtype=np.int64)
        mask = np.zeros((len(windows), width), dtype=np.int64)
        for i, w in enumerate(windows):
            ids[i, : len(w)] = w
            mask[i, : len(w)] = 1
        feed: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        logits = self._session.run(None, feed)[0]
        out = []
        for row in logits:
            m = max(row)
            exps = [math.exp(float(x) - m) for x in row]
            out.append(exps[1] / sum(exps))
        return out

    def clear_cache(self) -> None:
        """Forget every cached verdict (benchmarks; a new model revision gets a new instance)."""
        with self._lock:
            self._cache.clear()

    def score(self, text: str) -> float:
        """Probability that `text` is an injection or jailbreak (max over its windows)."""
        return self.assess(text).score

    def assess(self, text: str) -> Assessment:
        """`score` and how many of the text's tokens no window read (past the window cap)."""
        key = text_key(text)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                self.cache_hits += 1
                return self._cache[key]
        ids, unread, skipped = self._read(text)
        windows = self._windows_of(ids)
        # Four windows per session call: a 2,000-token prompt's sixteen windows took 14.7 ms p50
        # that way and 16.1 ms in one call here (interleaved; docs/injection.md).
        value = max(max(self.run_windows(windows[i : i + 4])) for i in range(0, len(windows), 4))
        result = Assessment(value, unread, skipped)
        with self._lock:
            self._cache[key] = result
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return result
