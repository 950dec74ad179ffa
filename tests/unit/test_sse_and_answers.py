"""SSE parsing and answer reassembly across arbitrary chunk boundaries."""

from __future__ import annotations

import json
from typing import Any

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


def test_every_text_field_of_a_chat_answer_is_answer_text_and_rewritable() -> None:
    doc: dict[str, Any] = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "calling",
                    "reasoning_content": "think",
                    "refusal": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"b": 2}'}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    a = Answer()
    _openai.answer_from_json(_openai.CHAT, json.dumps(doc).encode(), a)
    assert a.text() == 'calling\nthink\n{"a": 1}\n{"b": 2}'
    slots = _openai.answer_slots(_openai.CHAT, doc, "message")
    assert [s.key for s in slots] == [
        (0, "content"),
        (0, "reasoning_content"),
        (0, "tool_calls.0"),
        (0, "tool_calls.1"),
    ]
    slots[3].set('{"b": "<X>"}')
    assert doc["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"] == '{"b": "<X>"}'


def test_streamed_tool_call_arguments_are_reassembled_per_call_and_can_be_released_later() -> None:
    a = Answer()
    events = [
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]
                    },
                }
            ]
        },
        {
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"id": "1'}}]}}
            ]
        },
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}}]},
        {
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '23"}'}}]}}
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    _openai.answer_from_sse(_openai.CHAT, SSEParser(), raw, True, a)
    assert a.text() == '{"id": "123"}\n{}'
    # Text held back by the redactor is appended to a later event: into the same call's arguments.
    last = events[-1]
    assert _openai.append_text(_openai.CHAT, last, (0, "tool_calls.0"), "held")
    assert last["choices"][0]["delta"] == {"tool_calls": [{"index": 0, "function": {"arguments": "held"}}]}
    assert _openai.append_text(_openai.CHAT, last, (0, "tool_calls.0"), "+more")
    assert last["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] == "held+more"
    extra = _openai.stream_event(_openai.CHAT, {"id": "s"}, {(0, "function_call"): "x", (0, "content"): "y"})
    assert extra == {
        "id": "s",
        "choices": [
            {
                "index": 0,
                "finish_reason": None,
                "delta": {"function_call": {"arguments": "x"}, "content": "y"},
            }
        ],
    }


@pytest.mark.parametrize(
    "message",
    [
        {"content": ["not", "a string"]},
        {"reasoning": {"text": "x"}},
        {"tool_calls": {"function": {}}},
        {"tool_calls": [{"function": {"arguments": {"id": "123"}}}]},
        {"function_call": "f(x)"},
    ],
)
def test_answer_text_that_is_not_text_is_refused(message: dict[str, object]) -> None:
    body = json.dumps({"choices": [{"index": 0, "message": message}]}).encode()
    with pytest.raises(ProtocolError) as e:
        _openai.answer_from_json(_openai.CHAT, body, Answer())
    assert e.value.status == 502


@pytest.mark.parametrize(
    "extra",
    [
        {"audio": {"id": "a1", "data": "UklGRg==", "transcript": "your card is 4111 1111 1111 1111"}},
        {"thinking": "the card is 4111 1111 1111 1111"},
        {"annotations": [{"type": "url_citation", "url_citation": {"title": "4111 1111 1111 1111"}}]},
    ],
)
def test_answer_fields_holding_text_the_gateway_does_not_read_are_refused(extra: dict[str, object]) -> None:
    for key, doc in (
        ("message", {"choices": [{"index": 0, "message": {"content": "ok", **extra}}]}),
        ("delta", {"choices": [{"index": 0, "delta": {"content": "ok", **extra}}]}),
    ):
        with pytest.raises(ProtocolError) as e:
            _openai.take_document(_openai.CHAT, doc, key, Answer())
        assert e.value.status == 502 and f"{key}.{next(iter(extra))} holds text" in e.value.message


def test_an_answer_field_is_named_only_when_its_name_is_an_identifier() -> None:
    doc = {"choices": [{"index": 0, "message": {"content": "ok", "card 4111 1111 1111 1111": "x"}}]}
    with pytest.raises(ProtocolError) as e:
        _openai.take_document(_openai.CHAT, doc, "message", Answer())
    assert "4111" not in e.value.message and "a field of choices[0].message" in e.value.message


def test_answer_fields_without_text_pass() -> None:
    # What vLLM and the openai SDK put beside a message's text when there is none of it.
    message: dict[str, object] = {
        "role": "assistant",
        "content": "ok",
        "audio": None,
        "annotations": [],
        "tool_calls": [],
    }
    body = json.dumps({"choices": [{"index": 0, "message": message, "logprobs": None}]}).encode()
    answer = Answer()
    _openai.answer_from_json(_openai.CHAT, body, answer)
    assert answer.text(0) == "ok"


def test_kserve_generate_answer_nested_deeper_than_an_array_is_refused() -> None:
    with pytest.raises(ProtocolError) as e:
        _kserve.answer_from_body(_kserve.GENERATE, b'{"text_output": {"x": "secret"}}', None, Answer())
    assert e.value.status == 502


def test_an_event_after_done_is_refused() -> None:
    # The answer is settled at [DONE] (audited, remembered as delivered): nothing may follow it.
    delta = {"choices": [{"index": 0, "delta": {"content": "ok"}}]}
    parser, answer = SSEParser(), Answer()
    _openai.answer_from_sse(
        _openai.CHAT, parser, b"data: " + json.dumps(delta).encode() + b"\n\ndata: [DONE]\n\n", False, answer
    )
    assert answer.done and answer.text(0) == "ok"
    _openai.answer_from_sse(_openai.CHAT, parser, b"", True, answer)  # the stream's empty end passes
    with pytest.raises(ProtocolError) as e:
        _openai.answer_from_sse(
            _openai.CHAT, parser, b"data: " + json.dumps(delta).encode() + b"\n\n", True, answer
        )
    assert e.value.status == 502 and "after [DONE]" in e.value.message
