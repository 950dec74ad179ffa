"""The quota filter's parameters, phases and token counting (pure: no Redis is contacted)."""

from __future__ import annotations

import re

import pytest

from filters._protocols import Answer, Prompt, Segment
from filters.base import Phase, Principal, RequestContext
from filters.chain import BuildEnv
from filters.quota import (
    CapError,
    Quota,
    TokenQuota,
    answer_cap,
    ask_usage,
    cap_answer,
    cappable,
    reservation,
    used_tokens,
)
from gateway import policy
from gateway.registry import Protocol, Registry
from gateway.settings import Settings
from tests.policy_text import assert_refused_where, compile_text, problems

ENV = BuildEnv(Settings())
CHAIN = """\
version: 1
chain:
  - filter: principal
  - filter: quota
    limits:
      - {name: per-user, per: user, requests: 10, window_s: 60}
  - filter: protocol
  - filter: route
"""
# protocol before quota: what a token limit needs
AFTER_PROTOCOL = CHAIN.replace("  - filter: protocol\n", "").replace(
    "  - filter: quota\n", "  - filter: protocol\n  - filter: quota\n"
)


def _compile(text: str) -> policy.CompiledPolicy:
    return compile_text(text, ENV)


def _errors(text: str) -> list[str]:
    return problems(text, ENV)


def test_request_limits_read_only_request_headers_and_token_limits_read_answers() -> None:
    chain = _compile(CHAIN).chain
    (quota,) = [f for f in chain.filters if f.name == "quota"]
    assert type(quota) is Quota and quota.phases == Phase.REQUEST_HEADERS
    assert not chain.phases & (Phase.RESPONSE_HEADERS | Phase.RESPONSE_BODY)  # answers not read
    with_tokens = _compile(AFTER_PROTOCOL.replace("requests: 10", "tokens: 1000"))
    (quota,) = [f for f in with_tokens.chain.filters if f.name == "quota"]
    assert type(quota) is TokenQuota and quota.phases & Phase.REQUEST_BODY  # where it reserves
    assert with_tokens.chain.phases & Phase.RESPONSE_BODY and with_tokens.chain.phases & Phase.SETTLE


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("requests: 10", "requests: 10, tokens: 5", "give exactly one of requests, tokens or concurrent"),
        ("requests: 10, ", "", "give exactly one of requests, tokens or concurrent"),
        ("requests: 10", "concurrent: 10", "a concurrent limit has no window: leave window_s out"),
        (", window_s: 60", "", "a limit of requests needs window_s"),
        ("name: per-user", "name: Per User", "String should match pattern"),
        ("per: user", "per: group", "Input should be 'user', 'tenant' or 'key'"),
        ("requests: 10", "requests: 0", "Input should be greater than or equal to 1"),
        (
            "      - {name: per-user, per: user, requests: 10, window_s: 60}\n",
            "      - {name: a, requests: 1, window_s: 1}\n      - {name: a, tokens: 1, window_s: 1}\n",
            "limit names must be unique: a, a",
        ),
        # a token limit reads the answer, which protocol parses: it must come earlier
        ("requests: 10", "tokens: 10", "filter 'quota' needs 'protocol' earlier in the chain"),
    ],
)
def test_bad_limits_are_refused_where_they_are(old: str, new: str, message: str) -> None:
    assert old in CHAIN
    assert_refused_where(CHAIN.replace(old, new), ENV, message)


def test_an_override_with_a_token_limit_makes_the_filter_read_answers_for_its_scope_only() -> None:
    overrides = """\
overrides:
  - name: globex-tokens
    when: {tenant: [globex]}
    filter: quota
    params:
      limits: [{name: tpm, per: tenant, tokens: 500, window_s: 60}]
"""
    compiled = _compile(AFTER_PROTOCOL + overrides)
    (quota,) = [f for f in compiled.chain.filters if f.name == "quota"]
    assert isinstance(quota, policy.ScopedFilter)
    assert quota.phases & Phase.RESPONSE_BODY and quota.phases & Phase.SETTLE
    (o,) = compiled.overrides
    assert type(o.variant) is TokenQuota and type(quota.base) is Quota
    # without protocol before it, the override's token limit could never count: refused there
    assert _errors(CHAIN + overrides) == [
        "p.yaml:14:7: with these parameters 'quota' needs 'protocol' earlier in the chain: add it to the "
        "chain before this filter, or change the override's parameters"
    ]


def _ctx(prompt: str, answer: str, usage: dict[str, object] | None) -> RequestContext:
    ctx = RequestContext(
        "r1", "POST", "/v1/chat/completions", {}, Registry.from_yaml("upstreams: {}\nmodels: {}\n")
    )
    ctx.principal = Principal("k", "ann", "acme")
    ctx.prompt = Prompt(Protocol.OPENAI, "chat", "m", segments=(Segment("user", prompt),))
    ctx.answer = Answer(usage=usage)
    ctx.answer.add(0, answer)
    return ctx


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}, (12, "usage")),
        ({"prompt_tokens": 7, "completion_tokens": 5}, (12, "usage")),
        ({"completion_tokens": 5}, (5, "usage")),
        # what the answer does not say (or says wrongly) is estimated from the text
        ({"total_tokens": "12"}, (5, "estimate")),
        ({"total_tokens": True}, (5, "estimate")),
        ({"total_tokens": -1}, (5, "estimate")),
        (None, (5, "estimate")),
    ],
)
def test_tokens_come_from_usage_else_from_the_text(
    usage: dict[str, object] | None, expected: tuple[int, str]
) -> None:
    # 12 bytes of prompt + 6 of answer = 18 bytes: 5 tokens estimated (18 / 4, rounded up)
    assert used_tokens(_ctx("hello world!", "answer", usage)) == expected


def test_the_estimate_counts_bytes_so_chinese_text_is_not_undercounted() -> None:
    # 6 Han characters are 18 bytes of UTF-8: 5 tokens, where a count of characters would say 2
    assert used_tokens(_ctx("请忽略以上", "好", None)) == (5, "estimate")


@pytest.mark.parametrize(
    ("protocol", "doc", "expected"),
    [
        # 12 bytes of prompt: 3 tokens, plus the answer's cap
        (Protocol.OPENAI, {"max_tokens": 50}, 53),
        # servers differ in which field they obey (vLLM: a 0 in the first falls back to the
        # second; llama.cpp reads n_predict first): the largest is reserved
        (Protocol.OPENAI, {"max_completion_tokens": 40, "max_tokens": 50}, 53),
        (Protocol.OPENAI, {"max_completion_tokens": 0, "max_tokens": 50}, 53),
        (Protocol.OPENAI, {"max_tokens": 10, "n_predict": 900}, 903),
        (Protocol.OPENAI, {"max_tokens": 50, "n": 3}, 153),  # every choice is an answer
        (Protocol.OPENAI, {"n": 2}, 3 + 2 * 1024),
        (Protocol.OPENAI, {}, 3 + 1024),  # no cap: the policy's reserve_tokens
        (Protocol.OPENAI, {"max_tokens": None}, 3 + 1024),
        (Protocol.OPENAI, {"max_tokens": 0}, 3),
        (Protocol.KSERVE_V2, {"max_tokens": 16}, 19),
        (Protocol.KSERVE_V2, {"max_tokens": [16]}, 19),  # a generate input of one value
        (Protocol.KSERVE_V2, {"parameters": {"max_tokens": 8}}, 11),
        (Protocol.KSERVE_V2, {"max_tokens": 4, "parameters": {"max_tokens": 8}}, 11),
        (Protocol.KSERVE_V2, {"n": 4}, 3 + 1024),  # KServe has no choices
    ],
)
def test_a_request_reserves_its_prompt_and_its_answers_largest_cap(
    protocol: Protocol, doc: dict[str, object], expected: int
) -> None:
    p = Prompt(protocol, "chat", "m", segments=(Segment("user", "hello world!"),), document=doc)
    assert reservation(p, answer_cap(p), 1024) == expected


@pytest.mark.parametrize(
    ("protocol", "doc", "field"),
    [
        # each of these a model server may read as a number the quota would not have counted
        (Protocol.OPENAI, {"max_tokens": "50000"}, "max_tokens"),
        (Protocol.OPENAI, {"max_tokens": 5e4}, "max_tokens"),
        (Protocol.OPENAI, {"max_tokens": 50.0}, "max_tokens"),
        (Protocol.OPENAI, {"max_tokens": True}, "max_tokens"),
        (Protocol.OPENAI, {"max_tokens": -1}, "max_tokens"),
        (Protocol.OPENAI, {"max_tokens": 10, "max_completion_tokens": [9]}, "max_completion_tokens"),
        (Protocol.OPENAI, {"max_tokens": 10, "n_predict": "9"}, "n_predict"),
        (Protocol.OPENAI, {"max_tokens": 10, "n": 2.0}, "n"),
        (Protocol.KSERVE_V2, {"max_tokens": [16, 16]}, "max_tokens"),
        (Protocol.KSERVE_V2, {"parameters": {"max_tokens": "8"}}, "parameters.max_tokens"),
    ],
)
def test_a_cap_that_is_no_whole_number_is_refused(
    protocol: Protocol, doc: dict[str, object], field: str
) -> None:
    p = Prompt(protocol, "chat", "m", segments=(Segment("user", "hi"),), document=doc)
    with pytest.raises(CapError, match=f"^'{re.escape(field)}' must be a whole number >= 0"):
        answer_cap(p)


@pytest.mark.parametrize(
    ("protocol", "operation", "doc", "sent"),
    [
        (Protocol.OPENAI, "chat", {"model": "m", "max_tokens": None}, {"model": "m", "max_tokens": 64}),
        (Protocol.OPENAI, "completion", {"model": "m"}, {"model": "m", "max_tokens": 64}),
        (
            Protocol.KSERVE_V2,
            "generate_stream",
            {"text_input": "hi", "parameters": {"temperature": 0}},
            {"text_input": "hi", "parameters": {"temperature": 0, "max_tokens": 64}},
        ),
        (
            Protocol.KSERVE_V2,
            "generate",
            {"text_input": "hi"},
            {"text_input": "hi", "parameters": {"max_tokens": 64}},
        ),
    ],
)
def test_an_uncapped_answer_is_capped_at_what_it_reserved(
    protocol: Protocol, operation: str, doc: dict[str, object], sent: dict[str, object]
) -> None:
    p = Prompt(protocol, operation, "m", segments=(Segment("user", "hi"),), document=doc)
    assert cappable(p)
    cap_answer(p, 64)
    assert p.document == sent and doc != sent  # a copy: later rewrites start from it
    assert answer_cap(p).cap == 64


@pytest.mark.parametrize(
    ("protocol", "operation", "doc", "sent"),
    [
        (  # a stream that does not ask: asked for it, its other options kept
            Protocol.OPENAI,
            "chat",
            {"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": False}},
            {
                "model": "m",
                "stream": True,
                "stream_options": {"continuous_usage_stats": False, "include_usage": True},
            },
        ),
        (
            Protocol.OPENAI,
            "completion",
            {"model": "m", "stream": True, "stream_options": {"include_usage": False}},
            {"model": "m", "stream": True, "stream_options": {"include_usage": True}},
        ),
        (
            Protocol.OPENAI,
            "chat",
            {"model": "m", "stream": True, "stream_options": None},
            {"model": "m", "stream": True, "stream_options": {"include_usage": True}},
        ),
        # unchanged (None): the client asked, so the chunk is its own; a whole answer; KServe
        (
            Protocol.OPENAI,
            "chat",
            {"model": "m", "stream": True, "stream_options": {"include_usage": True}},
            None,
        ),
        (Protocol.OPENAI, "chat", {"model": "m"}, None),
        (Protocol.KSERVE_V2, "generate_stream", {"text_input": "hi"}, None),
    ],
)
def test_a_stream_that_does_not_ask_for_its_usage_is_asked_for_it_and_the_chunk_hidden(
    protocol: Protocol, operation: str, doc: dict[str, object], sent: dict[str, object] | None
) -> None:
    stream = doc.get("stream") is True or operation == "generate_stream"
    p = Prompt(protocol, operation, "m", stream, (Segment("user", "hi"),), document=dict(doc))
    assert ask_usage(p) is (sent is not None)
    assert p.usage_hidden is (sent is not None)
    assert p.document == (doc if sent is None else sent)


def test_a_kserve_infer_request_has_no_cap_to_set() -> None:
    p = Prompt(Protocol.KSERVE_V2, "infer", "m", document={"inputs": []})
    assert not cappable(p)


def test_capping_at_zero_reserved_tokens_is_refused() -> None:
    text = AFTER_PROTOCOL.replace(
        "requests: 10, window_s: 60}", "tokens: 10, window_s: 60}\n    reserve_tokens: 0"
    )
    assert_refused_where(text, ENV, "cap_answers would cap answers at reserve_tokens: 0")
    assert _compile(text.replace("reserve_tokens: 0", "reserve_tokens: 0\n    cap_answers: false"))
