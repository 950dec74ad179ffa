"""PII with real upstreams and real clients: Triton echoes what it is sent (tritonclient, binary
tensors; generate_stream), llama.cpp is made to say a card number by a grammar (openai SDK,
streamed and not). Answers arrive redacted; with `request: true` the prompt arrives redacted."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton_http
import yaml

from bench import pii_synth as synth
from tests.e2e.conftest import Sdk
from tests.harness import KEY, GatewayEnv, running

RNG = random.Random(9)
ID = synth.cn_id(RNG)
BANK = synth.cn_bank_card(RNG)
VISA = synth.card(RNG, "visa")


def _infer(url: str, text: str, model: str = "echo") -> str:
    inp = triton_http.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([text.encode()], dtype=np.object_), binary_data=True)
    out = triton_http.InferRequestedOutput("text_output", binary_data=True)
    with triton_http.InferenceServerClient(url.removeprefix("http://")) as tc:
        res = tc.infer(model, [inp], outputs=[out], headers={"Authorization": f"Bearer {KEY}"})
    value = res.as_numpy("text_output")[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def test_triton_answer_is_redacted_for_tritonclient(real: GatewayEnv) -> None:
    # The default policy redacts answers: Triton echoes the ID back, the client gets a placeholder.
    assert _infer(real.url, f"身份证{ID}，谢谢") == "echo v2: 身份证<CN_RESIDENT_ID>，谢谢"


def test_triton_generate_stream_is_redacted_live(real: GatewayEnv) -> None:
    # echo_stream sends the input word by word: the grouped card arrives in five events.
    text = f"银行卡 {synth.grouped(BANK)} 已绑定"
    with httpx.stream(
        "POST",
        f"{real.url}/v2/models/echo_stream/generate_stream",
        json={"text_input": text},
        headers={"authorization": f"Bearer {KEY}"},
        timeout=30,
    ) as r:
        assert r.status_code == 200
        raw = b"".join(r.iter_raw())
    events = [json.loads(b[len("data: ") :]) for b in raw.decode().split("\n\n") if b.startswith("data: ")]
    assert len(events) >= len(text.split(" ")) + 1
    assert "".join(e["text_output"] for e in events) == "stream v1: 银行卡 <CN_BANK_CARD> 已绑定"
    assert BANK[:8].encode() not in raw


GRAMMAR = f'root ::= "Your card {VISA} is on file."'


@pytest.fixture
def oa(real: GatewayEnv, sdk: Sdk) -> openai.OpenAI:
    return sdk(real)


def test_llama_answer_is_redacted(oa: openai.OpenAI) -> None:
    r = oa.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "what card do I have?"}],
        max_tokens=64,
        extra_body={"grammar": GRAMMAR},
    )
    assert r.choices[0].message.content == "Your card <CREDIT_CARD> is on file."


def test_llama_stream_is_redacted(oa: openai.OpenAI) -> None:
    stream = oa.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "what card do I have?"}],
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"grammar": GRAMMAR},
    )
    deltas = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len(deltas) > 10  # many small events, as the model produced them
    assert "".join(deltas) == "Your card <CREDIT_CARD> is on file."


def test_llama_tokens_would_spell_the_card_so_the_gateway_does_not_ask_for_them(
    real: GatewayEnv, oa: openai.OpenAI
) -> None:
    # Straight to llama.cpp: its own `n_probs` field returns the answer token by token.
    up = yaml.safe_load(real.settings.registry_file.read_text())["upstreams"]["llama-demo"]
    ask = {"messages": [{"role": "user", "content": "what card?"}], "max_tokens": 64, "grammar": GRAMMAR}
    direct = httpx.post(
        f"http://{up['host']}:{up['port']}/v1/chat/completions", json={**ask, "n_probs": 1}, timeout=60
    )
    tokens = direct.json()["choices"][0]["logprobs"]["content"]
    assert VISA in "".join(t["token"] for t in tokens)
    # Through the gateway, which redacts answers: refused before llama.cpp runs it.
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "what card?"}],
            max_tokens=64,
            extra_body={"n_probs": 1, "grammar": GRAMMAR},
        )
    assert e.value.code == "unsupported_content"


@pytest.fixture(scope="module")
def strict(real: GatewayEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayEnv]:
    """A second gateway on the same real upstreams whose policy also redacts prompts."""
    tmp = Path(tmp_path_factory.mktemp("pii-strict"))
    policy = yaml.safe_load(Path("policies/default.yaml").read_text())
    # PII only: short prompts that are mostly an ID number are a known false positive of the
    # injection model (classifiers/injection/model/MODEL_CARD.md), which is not under test here.
    policy["chain"] = [e for e in policy["chain"] if e["filter"] != "prompt_injection"]
    for entry in policy["chain"]:
        if entry["filter"] == "pii":
            entry["request"] = True
    (tmp / "policy.yaml").write_text(yaml.safe_dump(policy))
    reg = yaml.safe_load(real.settings.registry_file.read_text())
    with running(tmp / "gw", reg, env={"ZTGATE_POLICY_FILE": str(tmp / "policy.yaml")}) as env:
        yield env


def test_prompt_reaches_triton_redacted_when_policy_says_so(strict: GatewayEnv) -> None:
    # Triton echoes what it received: the ID never reached it.
    assert _infer(strict.url, f"ID {ID} please") == "echo v2: ID <CN_RESIDENT_ID> please"
