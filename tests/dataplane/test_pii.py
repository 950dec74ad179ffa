"""PII through the real gateway: prompts reach the upstream redacted, answers reach the client
redacted, whole or streamed, OpenAI and KServe (JSON and binary tensors)."""

from __future__ import annotations

import json
import random
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench import pii_synth as synth
from classifiers.invisible import in_selectors
from tests.harness import (
    KEY,
    GatewayEnv,
    ScriptedUpstream,
    chat_registry,
    json_answer,
    registry_for,
    running,
    streamed,
)

pytestmark = pytest.mark.dataplane

RNG = random.Random(4)
ID = synth.cn_id(RNG)
CARD = synth.card(RNG, "mastercard")
MOBILE = synth.cn_mobile(RNG)
SPELLED = " ".join(
    ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")[int(d)] for d in MOBILE
)
MOBILE_CN = MOBILE.translate({ord(str(d)): "零幺二三四五六七八九"[d] for d in range(10)})  # dictated
POLICY = """
version: 1
chain:
  - filter: principal
  - filter: protocol
  - filter: route
  - filter: pii
    request: true
    response: true
    replacement: entity
    non_text_outputs: pass  # the binary-tensor test sends an INT32 output through (the default denies)
    patterns:
      - {entity: EMPLOYEE_ID, regex: "EMP-\\\\d{6}", score: 0.9}
    entities: [CN_RESIDENT_ID, CN_MOBILE, CN_BANK_CARD, CREDIT_CARD, EMAIL_ADDRESS, EMPLOYEE_ID]
default_action: allow
rules: []
"""


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[httpx.Client, ScriptedUpstream, ScriptedUpstream, GatewayEnv]]:
    tmp = Path(tmp_path_factory.mktemp("pii"))
    oai = ScriptedUpstream("openai").start()
    ks = ScriptedUpstream("kserve").start()
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    reg = registry_for(
        {"v": ("openai", oai.port), "t": ("kserve_v2", ks.port)},
        {
            "chat": {"latest": "1", "versions": {"1": {"upstream": "v", "upstream_model": "org/chat"}}},
            "echo": {"latest": "1", "versions": {"1": {"upstream": "t"}}},
        },
    )
    try:
        with (
            running(tmp / "gw", reg, env={"ZTGATE_POLICY_FILE": str(policy)}) as env,
            httpx.Client(base_url=env.url, headers={"authorization": f"Bearer {KEY}"}, timeout=30) as c,
        ):
            yield c, oai, ks, env
    finally:
        oai.stop()
        ks.stop()


@pytest.fixture
def client(
    gw: tuple[httpx.Client, ScriptedUpstream, ScriptedUpstream, GatewayEnv],
) -> tuple[httpx.Client, ScriptedUpstream, ScriptedUpstream]:
    for up in (gw[1], gw[2]):
        up.requests.clear()
        up.handler = None
    return gw[0], gw[1], gw[2]


Gw = tuple[httpx.Client, ScriptedUpstream, ScriptedUpstream]


def test_prompt_reaches_the_upstream_redacted(client: Gw) -> None:
    c, oai, _ = client
    oai.handler = lambda _r: json_answer(
        {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
    )
    prompt = f"我的身份证{ID}，工号EMP-123456，卡 {synth.grouped(CARD)}，\U0001f600{in_selectors(MOBILE)}"
    r = c.post(
        "/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": prompt}]}
    )
    assert r.status_code == 200, r.text
    sent = json.loads(oai.requests[0].body)
    assert sent["model"] == "org/chat"  # the route's rewrite survives the redaction
    assert sent["messages"][0]["content"] == (
        "我的身份证<CN_RESIDENT_ID>，工号<EMPLOYEE_ID>，卡 <CREDIT_CARD>，\U0001f600<CN_MOBILE>"
    )
    assert ID.encode() not in oai.requests[0].body


def test_whole_answer_reaches_the_client_redacted(client: Gw) -> None:
    c, oai, _ = client
    answer = f"Sure: the card is {CARD}, mail a@b.example.com, 手机{MOBILE}。"
    oai.handler = lambda _r: json_answer(
        {
            "id": "x",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
            ],
        }
    )
    r = c.post(
        "/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == (
        "Sure: the card is <CREDIT_CARD>, mail <EMAIL_ADDRESS>, 手机<CN_MOBILE>。"
    )
    assert int(r.headers["content-length"]) == len(r.content)


def _stream_through(
    c: httpx.Client, oai: ScriptedUpstream, events: list[Any], rng: random.Random, cuts: int
) -> tuple[bytes, list[str]]:
    """Stream `events` (then [DONE]) from the upstream cut into `cuts` + 1 odd byte chunks; the
    raw bytes the client got and its events' data, after checking one client event per event."""
    raw = b"".join(b"data: " + json.dumps(e, ensure_ascii=False).encode() + b"\n\n" for e in events)
    raw += b"data: [DONE]\n\n"
    byte_cuts = sorted(rng.sample(range(1, len(raw)), cuts))
    chunks = [raw[a:b] for a, b in zip([0, *byte_cuts], [*byte_cuts, len(raw)], strict=True)]
    oai.handler = lambda _r: streamed(chunks, gap_s=0.002)
    body = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        got = b"".join(r.iter_raw())
    datas = [b[len("data: ") :] for b in got.decode().split("\n\n") if b.startswith("data: ")]
    assert len(datas) == len(events) + 1 and datas[-1] == "[DONE]"
    return got, datas


@pytest.mark.parametrize("seed", [1, 2])
def test_streamed_answer_is_redacted_live_whatever_the_chunking(client: Gw, seed: int) -> None:
    c, oai, _ = client
    text = (
        f"您的身份证号是{ID}，银行卡{synth.grouped(CARD)}，请拨打{MOBILE}或{MOBILE_CN}。"
        "Mail zhang.san [at] example [dot] com or ｌｉ＿ｓｉ＠ｑｑ．ｃｏｍ. "
        f"Glued: ID{ID}x, tel{MOBILE}. Spaced: {' '.join(ID)}; in words: {SPELLED}. "
        f"Hidden: \U0001f600{in_selectors(MOBILE)}. Thanks!"
    )
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), 16))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    events = [
        {"id": "s", "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces
    ]
    events.append({"id": "s", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    got, datas = _stream_through(c, oai, events, rng, 20)
    content = "".join(json.loads(d)["choices"][0]["delta"].get("content", "") for d in datas[:-1])
    assert content == (
        "您的身份证号是<CN_RESIDENT_ID>，银行卡<CREDIT_CARD>，请拨打<CN_MOBILE>或<CN_MOBILE>。"
        "Mail <EMAIL_ADDRESS> or <EMAIL_ADDRESS>. Glued: ID<CN_RESIDENT_ID>x, tel<CN_MOBILE>. "
        "Spaced: <CN_RESIDENT_ID>; in words: <CN_MOBILE>. Hidden: \U0001f600<CN_MOBILE>. Thanks!"
    )
    for secret in (
        ID[:8],
        " ".join(ID[:6]),
        CARD[:8],
        MOBILE[:6],
        MOBILE_CN[:4],
        SPELLED[:20],
        in_selectors(MOBILE[:4]),
        "zhang",
        "example",
        "ｌｉ",
    ):
        assert secret.encode() not in got


def test_tool_calls_in_a_whole_answer_reach_the_client_redacted(client: Gw) -> None:
    c, oai, _ = client
    args = json.dumps({"customer_id": ID, "note": f"call {MOBILE}"}, ensure_ascii=False)
    oai.handler = lambda _r: json_answer(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "lookup", "arguments": args},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ]
        }
    )
    r = c.post(
        "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "look me up"}]},
    )
    assert r.status_code == 200, r.text
    call = r.json()["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {
        "customer_id": "<CN_RESIDENT_ID>",
        "note": "call <CN_MOBILE>",
    }
    assert call["id"] == "call_1" and call["function"]["name"] == "lookup"
    assert ID.encode() not in r.content and MOBILE.encode() not in r.content


@pytest.mark.parametrize("seed", [3, 4])
def test_streamed_tool_call_arguments_are_redacted_live(client: Gw, seed: int) -> None:
    c, oai, _ = client
    args = json.dumps({"card": CARD, "id": ID})
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(args)), 8))
    pieces = [args[a:b] for a, b in zip([0, *cuts], [*cuts, len(args)], strict=True)]
    first = {"index": 0, "id": "call_9", "type": "function", "function": {"name": "pay", "arguments": ""}}
    events = [{"id": "s", "choices": [{"index": 0, "delta": {"tool_calls": [first]}, "finish_reason": None}]}]
    events += [
        {
            "id": "s",
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": p}}]},
                    "finish_reason": None,
                }
            ],
        }
        for p in pieces
    ]
    events.append({"id": "s", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    got, datas = _stream_through(c, oai, events, rng, 15)
    # What an OpenAI client does: concatenate each call's argument pieces by index.
    sent = "".join(
        call["function"].get("arguments", "")
        for d in datas[:-1]
        for call in json.loads(d)["choices"][0]["delta"].get("tool_calls", [])
        if call["index"] == 0
    )
    assert json.loads(sent) == {"card": "<CREDIT_CARD>", "id": "<CN_RESIDENT_ID>"}
    assert CARD[:8].encode() not in got and ID[:8].encode() not in got


def test_a_request_for_logprobs_is_refused_while_answers_are_redacted(client: Gw) -> None:
    c, oai, _ = client
    for body in (
        {"model": "chat", "logprobs": True, "messages": [{"role": "user", "content": "hi"}]},
        {"model": "chat", "top_logprobs": 2, "messages": [{"role": "user", "content": "hi"}]},
        # vLLM returns the answer's token ids beside its text: the tokens spell what was redacted.
        {"model": "chat", "return_token_ids": True, "messages": [{"role": "user", "content": "hi"}]},
        # llama.cpp's own field: the answer's tokens, with their bytes, in `logprobs`.
        {"model": "chat", "n_probs": 2, "messages": [{"role": "user", "content": "hi"}]},
    ):
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_content", r.text
        assert "logprobs" in r.json()["error"]["message"] and r.headers["x-request-id"]
    r = c.post("/v1/completions", json={"model": "chat", "prompt": "hi", "logprobs": 0})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_content"
    assert oai.requests == []


def test_earlier_tool_calls_are_redacted_and_personal_data_in_a_tool_definition_is_refused(
    client: Gw,
) -> None:
    c, oai, _ = client
    oai.handler = lambda _r: json_answer({"choices": [{"index": 0, "message": {"content": "ok"}}]})
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": json.dumps({"id": ID})},
    }
    messages = [
        {"role": "user", "content": "look me up"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "found"},
    ]
    r = c.post("/v1/chat/completions", json={"model": "chat", "messages": messages})
    assert r.status_code == 200, r.text
    sent = json.loads(oai.requests[0].body)
    assert json.loads(sent["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {
        "id": "<CN_RESIDENT_ID>"
    }
    assert ID.encode() not in oai.requests[0].body
    tool = {"type": "function", "function": {"name": "lookup", "description": f"always use customer {ID}"}}
    r = c.post(
        "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "pii_unredactable", r.text
    assert len(oai.requests) == 1  # the refused request never reached the upstream


def _bytes_tensor(strings: list[str]) -> bytes:
    return b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in strings)


def _read_tensor(raw: bytes) -> list[str]:
    out, pos = [], 0
    while pos < len(raw):
        (n,) = struct.unpack_from("<I", raw, pos)
        out.append(raw[pos + 4 : pos + 4 + n].decode())
        pos += 4 + n
    return out


def test_kserve_binary_tensors_are_redacted_both_ways(client: Gw) -> None:
    c, _, ks = client
    out_tensor = _bytes_tensor([f"卡号{CARD}", "nothing here"])
    ints = struct.pack("<2i", 7, 9)  # a non-text output before it: its bytes must pass untouched
    out_doc = {
        "model_name": "echo",
        "outputs": [
            {"name": "n", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": len(ints)}},
            {
                "name": "text",
                "datatype": "BYTES",
                "shape": [2],
                "parameters": {"binary_data_size": len(out_tensor)},
            },
        ],
    }
    out_json = json.dumps(out_doc).encode()

    def answer(_r: object) -> object:
        from aiohttp import web

        return web.Response(
            body=out_json + ints + out_tensor,
            content_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(len(out_json))},
        )

    ks.handler = answer
    in_tensor = _bytes_tensor([f"身份证{ID}"])
    in_doc = {
        "inputs": [
            {
                "name": "q",
                "datatype": "BYTES",
                "shape": [1],
                "parameters": {"binary_data_size": len(in_tensor)},
            }
        ]
    }
    in_json = json.dumps(in_doc).encode()
    r = c.post(
        "/v2/models/echo/infer",
        content=in_json + in_tensor,
        headers={
            "Inference-Header-Content-Length": str(len(in_json)),
            "content-type": "application/octet-stream",
        },
    )
    assert r.status_code == 200, r.text
    # What the upstream got: a consistent binary body with the ID redacted.
    got = ks.requests[0]
    n = int(got.headers["inference-header-content-length"])
    sent_doc = json.loads(got.body[:n])
    assert _read_tensor(got.body[n:]) == ["身份证<CN_RESIDENT_ID>"]
    assert sent_doc["inputs"][0]["parameters"]["binary_data_size"] == len(got.body) - n
    # What the client got: the same, for the answer.
    n = int(r.headers["inference-header-content-length"])
    doc = json.loads(r.content[:n])
    size0 = doc["outputs"][0]["parameters"]["binary_data_size"]
    assert r.content[n : n + size0] == ints
    assert _read_tensor(r.content[n + size0 :]) == ["卡号<CREDIT_CARD>", "nothing here"]


def test_kserve_json_generate_is_redacted(client: Gw) -> None:
    c, _, ks = client
    ks.handler = lambda _r: json_answer({"model_name": "echo", "text_output": f"call {MOBILE}"})
    r = c.post(
        "/v2/models/echo/generate",
        json={"text_input": f"id {ID}", "parameters": {"max_tokens": 3, "customer": f"card {CARD}"}},
    )
    assert r.status_code == 200
    assert r.json()["text_output"] == "call <CN_MOBILE>"
    sent = json.loads(ks.requests[0].body)
    assert sent["text_input"] == "id <CN_RESIDENT_ID>"
    # Request parameters reach the model too: their strings are redacted like the inputs.
    assert sent["parameters"] == {"max_tokens": 3, "customer": "card <CREDIT_CARD>"}


def test_the_request_log_names_what_was_redacted_never_the_value(
    gw: tuple[httpx.Client, ScriptedUpstream, ScriptedUpstream, GatewayEnv],
) -> None:
    c, oai, _, env = gw
    oai.handler = lambda _r: json_answer({"choices": [{"index": 0, "message": {"content": f"id {ID}"}}]})
    r = c.post(
        "/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": MOBILE}]}
    )
    assert r.json()["choices"][0]["message"]["content"] == "id <CN_RESIDENT_ID>"
    rid = r.headers["x-request-id"]
    deadline = time.monotonic() + 5
    while rid not in (logs := env.logs(0)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    line = next(ln for ln in logs.splitlines() if rid in ln and '"event": "request"' in ln)
    assert "pii:end:redact:request:CN_MOBILE=1,response:CN_RESIDENT_ID=1" in line
    assert ID not in logs and MOBILE not in logs


REDACT_RULE_POLICY = """
version: 1
chain:
  - filter: principal
  - filter: protocol
  - filter: route
  - filter: access
  - filter: pii
    request: false
    response: false
default_action: allow
rules:
  - name: acme-is-redacted
    when: {tenant: [acme]}
    action: redact
"""


def test_a_redact_rule_redacts_its_tenant_only(tmp_path: Path) -> None:
    from tests.harness import OTHER_TENANT_KEY

    up = ScriptedUpstream("openai").start()
    try:
        (tmp_path / "policy.yaml").write_text(REDACT_RULE_POLICY)
        up.handler = lambda _r: json_answer(
            {"choices": [{"index": 0, "message": {"content": f"card {CARD}"}}]}
        )
        reg = chat_registry(up.port)
        body = {"model": "chat", "messages": [{"role": "user", "content": f"my id {ID}"}]}
        with running(tmp_path / "gw", reg, env={"ZTGATE_POLICY_FILE": str(tmp_path / "policy.yaml")}) as env:
            acme = httpx.post(
                f"{env.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"}
            )
            globex = httpx.post(
                f"{env.url}/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {OTHER_TENANT_KEY}"},
            )
        assert acme.json()["choices"][0]["message"]["content"] == "card <CREDIT_CARD>"
        assert json.loads(up.requests[0].body)["messages"][0]["content"] == "my id <CN_RESIDENT_ID>"
        # The other tenant is under the filter's own defaults: nothing redacted.
        assert globex.json()["choices"][0]["message"]["content"] == f"card {CARD}"
        assert json.loads(up.requests[1].body)["messages"][0]["content"] == f"my id {ID}"
    finally:
        up.stop()
