"""Token quotas counted from real model servers' answers, through real clients.

llama.cpp's server reports `usage` on whole answers and, asked with
`stream_options.include_usage`, in its last stream chunk: those are counted as the server says.
Triton's KServe answers carry no usage: their tokens are estimated from the text. Once the tenant's
tokens are used up the next call is refused (429 with retry-after) before any model server runs it.
A call that sets no `max_tokens` is capped at what it reserved: the tiny model, which otherwise
writes until its slot's context is full (475 answer tokens with `cap_answers: false`), stops there.
A call's reservation must fit in what the window has left, or it is refused. A stream that does
not ask for its usage chunk is forwarded asking for it, counted by it, and gets no such chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import tritonclient.http as triton_http
import yaml
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Sdk
from tests.e2e.test_injection_e2e import _executions
from tests.harness import KEY, GatewayEnv, running

POLICY = """\
version: 1
chain:
  - filter: principal
  - filter: protocol
  - filter: quota
    limits:
      - {name: tenant-tokens, per: tenant, tokens: 200, window_s: 3600}
    reserve_tokens: 16
  - filter: route
  - filter: audit
default_action: allow
"""


def _own_gateway(real: GatewayEnv, tmp: Path, policy: str) -> Iterator[GatewayEnv]:
    """A gateway of its own (own Redis prefix, own audit chains) in front of the real upstreams."""
    (tmp / "policy.yaml").write_text(policy)
    reg = yaml.safe_load(real.settings.registry_file.read_text())
    with running(tmp / "gw", reg, env={"ZTGATE_POLICY_FILE": str(tmp / "policy.yaml")}) as env:
        yield env


@pytest.fixture(scope="module")
def quota_env(real: GatewayEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayEnv]:
    yield from _own_gateway(real, Path(tmp_path_factory.mktemp("quota-e2e")), POLICY)


@pytest.fixture(scope="module")
def capping_env(real: GatewayEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayEnv]:
    policy = POLICY.replace("tokens: 200,", "tokens: 5000,").replace(
        "reserve_tokens: 16", "reserve_tokens: 6"
    )
    yield from _own_gateway(real, Path(tmp_path_factory.mktemp("quota-cap-e2e")), policy)


def _counted(env: GatewayEnv, calls: int) -> list[tuple[int, str]]:
    """(tokens, source) counted per call, in order, once the `calls` calls so far have their records."""
    out = []
    for r in sorted(env.await_audit(calls), key=lambda r: r["time"]):
        for v in r["decision"]["verdicts"]:
            if v["filter"] == "quota" and v["phase"] == "tokens":
                fields = dict(p.split("=", 1) for p in v["detail"].split(","))
                out.append((int(fields["tokens"]), fields["source"]))
    return out


def test_real_answers_are_counted_until_the_tenant_quota_refuses(
    quota_env: GatewayEnv, real: GatewayEnv, request: pytest.FixtureRequest, sdk: Sdk
) -> None:
    oa = sdk(quota_env)
    whole = oa.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    assert whole.usage is not None
    chunks = list(
        oa.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "Say hello again."}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed_usage = [c.usage for c in chunks if c.usage is not None]
    assert len(streamed_usage) == 1
    inp = triton_http.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"hello"], dtype=np.object_), binary_data=True)
    tc = triton_http.InferenceServerClient(quota_env.url.removeprefix("http://"))
    request.addfinalizer(tc.close)
    tc.infer("echo", [inp], headers={"Authorization": f"Bearer {KEY}"})
    # "hello" in, "echo v2: hello" out: 19 bytes, 5 tokens estimated
    assert _counted(quota_env, 3) == [
        (whole.usage.total_tokens, "usage"),
        (streamed_usage[0].total_tokens, "usage"),
        (5, "estimate"),
    ]
    used = whole.usage.total_tokens + streamed_usage[0].total_tokens + 5
    # use up the rest of the 200 with whole answers, until a call's reservation (its prompt,
    # estimated: 3, and max_tokens 8) no longer fits; then the next calls are refused unrun
    calls = 0
    while True:
        try:
            r = oa.chat.completions.create(
                model="tiny-llama", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
            )
        except openai.RateLimitError as exc:
            last = exc.message
            break
        assert r.usage is not None
        used += r.usage.total_tokens
        calls += 1
        assert calls < 50, used
    # refused as the window filled, by used tokens or by the reservation that no longer fits
    assert "token quota 'tenant-tokens'" in last and used > 200 - 11, (last, used)
    before = _executions(real, "echo")
    with pytest.raises(InferenceServerException) as refused:
        tc.infer("echo", [inp], headers={"Authorization": f"Bearer {KEY}"})
    assert refused.value.status() == "429" and "token quota 'tenant-tokens'" in str(refused.value)
    assert _executions(real, "echo") == before  # Triton never ran it
    with pytest.raises(openai.RateLimitError) as info:
        oa.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}])
    assert info.value.response.headers["x-ratelimit-limit-tokens"] == "200"
    assert 1 <= int(info.value.response.headers["retry-after"]) <= 3600


def test_a_call_without_max_tokens_stops_at_what_it_reserved(capping_env: GatewayEnv, sdk: Sdk) -> None:
    oa = sdk(capping_env)
    whole = oa.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Tell a story."}]
    )
    assert whole.usage is not None and whole.usage.completion_tokens == 6, whole.usage
    assert whole.choices[0].finish_reason == "length"
    chunks = list(
        oa.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "Tell another story."}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 6, usage
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]
    # a stream that does not ask for its usage: the gateway asks, counts it, and keeps it back
    unasked = list(
        oa.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "Tell a story."}], stream=True
        )
    )
    assert unasked and all(c.usage is None and c.choices for c in unasked), unasked
    # counted as the server said, each well under the reservation's prompt estimate plus 6; the
    # unasked stream is the whole call's prompt and 6 answer tokens, as the server counts them
    counted = _counted(capping_env, 3)
    assert counted == [
        (whole.usage.total_tokens, "usage"),
        (usage[0].total_tokens, "usage"),
        (whole.usage.total_tokens, "usage"),
    ], counted
