"""The official openai SDK through Envoy and the chain to llama.cpp's OpenAI-compatible server."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import Sdk
from tests.harness import GatewayEnv


@pytest.fixture
def client(real: GatewayEnv, sdk: Sdk) -> openai.OpenAI:
    return sdk(real, timeout=30)


def test_chat(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny-llama", max_tokens=8, temperature=0, messages=[{"role": "user", "content": "Hello there"}]
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 8
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content.strip()


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny-llama@v1",
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Hello"}],
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]


def test_streamed_and_whole_answers_agree(client: openai.OpenAI) -> None:
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "tell me a story"}]
    whole = client.chat.completions.create(model="tiny-llama", max_tokens=10, temperature=0, messages=msgs)
    stream = client.chat.completions.create(
        model="tiny-llama", max_tokens=10, temperature=0, stream=True, messages=msgs
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert whole.choices[0].message.content == streamed


def test_completions(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny-llama", prompt="The river", max_tokens=5, temperature=0)
    assert r.choices[0].text.strip()


def test_models_list_comes_from_the_registry(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny-llama", "tiny-llama@v1"]


def test_sdk_sees_gateway_errors_in_openai_shape(real: GatewayEnv, client: openai.OpenAI, sdk: Sdk) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="ghost", messages=[{"role": "user", "content": "x"}])
    assert nf.value.code == "model_not_found"
    bad = sdk(real, "ztg-wrong")
    with pytest.raises(openai.AuthenticationError) as auth:
        bad.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x"}])
    assert auth.value.code == "invalid_api_key"
    assert auth.value.response.headers["x-request-id"] in auth.value.message
