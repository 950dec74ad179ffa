"""SSE parsing and answer reassembly across arbitrary chunk boundaries."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters import _kserve, _openai
from filters._protocols import Answer, ProtocolError
from filters._sse import SSEError, SSEParser

TEXTS = st.lists(
    st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12), min_size=1, max_size=8
)


def _chunks(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(raw) + 1) for c in cuts})
    return [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(TEXTS, min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 10_000), max_size=20),
    crlf=st.booleans(),
)
def test_openai_stream_reassembles_per_choice_for_any_split(
    pieces: list[list[str]], cuts: list[int], crlf: bool
) -> None:
    sep = b"\r\n\r\n" if crlf else b"\n\n"
    events = []
    for step in range(max(len(p) for p in pieces)):
        for idx, parts in enumerate(pieces):
            if step < len(parts):
                events.append({"choices": [{"index": idx, "delta": {"content": parts[step]}}]})
    raw = b"".join(b"data: " + json.dumps(e, ensure_ascii=False).encode() + sep for e in events)
    raw += b"data: [DONE]" + sep
    answer = Answer()
    parser = SSEParser()
    chunks = _chunks(raw, cuts)
    for i, chunk in enumerate(chunks):
        _openai.answer_from_sse(_openai.CHAT, parser, chunk, i == len(chunks) - 1, answer)
    for idx, parts in enumerate(pieces):
        assert answer.text(idx) == "".join(parts)
    assert answer.done


def test_sse_comments_fields_and_trailing_event() -> None:
    p = SSEParser()
    evs = p.feed(b": keep-alive\n\nevent: x\ndata: a\ndata: b\n\ndata: tail")
    assert [(e.event, e.data) for e in evs] == [("x", "a\nb")]
    assert [e.data for e in p.close()] == ["tail"]


def test_sse_rejects_invalid_utf8_and_oversized_events() -> None:
    with pytest.raises(SSEError):
        SSEParser().feed(b"data: \xff\n\n")
    with pytest.raises(SSEError):
        SSEParser(max_event_bytes=10).feed(b"data: " + b"x" * 20)


def test_usage_chunk_and_finish_reason() -> None:
    a = Answer()
    p = SSEParser()
    raw = (
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"length"}]}\n\n'
        b'data: {"choices":[],"usage":{"completion_tokens":1}}\n\ndata: [DONE]\n\n'
    )
    _openai.answer_from_sse(_openai.CHAT, p, raw, True, a)
    assert a.text() == "x" and a.finish == {0: "length"} and a.usage == {"completion_tokens": 1} and a.done


def test_completion_answers_json_and_stream() -> None:
    a = Answer()
    _openai.answer_from_json(
        _openai.COMPLETION, b'{"choices":[{"index":1,"text":"b"},{"index":0,"text":"a"}]}', a
    )
    assert (a.text(0), a.text(1)) == ("a", "b")


def test_malformed_answers_raise_protocol_error() -> None:
    with pytest.raises(ProtocolError) as e:
        _openai.answer_from_json(_openai.CHAT, b'{"choices": 3}', Answer())
    assert e.value.status == 502
    with pytest.raises(ProtocolError):
        _openai.answer_from_sse(_openai.CHAT, SSEParser(), b"data: {oops\n\n", False, Answer())


@settings(max_examples=100, deadline=None)
@given(parts=TEXTS, cuts=st.lists(st.integers(0, 10_000), max_size=10))
def test_kserve_generate_stream_without_done(parts: list[str], cuts: list[int]) -> None:
    raw = b"".join(
        b"data: " + json.dumps({"model_name": "m", "text_output": t}).encode() + b"\n\n" for t in parts
    )
    a = Answer()
    p = SSEParser()
    chunks = _chunks(raw, cuts)
    for i, c in enumerate(chunks):
        _kserve.answer_from_sse(p, c, i == len(chunks) - 1, a)
    assert a.text() == "".join(parts)
    assert a.done


def test_kserve_stream_error_event_is_flagged() -> None:
    a = Answer()
    _kserve.answer_from_sse(SSEParser(), b'data: {"error": "model failed"}\n\n', True, a)
    assert a.upstream_error and a.text() == ""
