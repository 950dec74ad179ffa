"""PII redaction cost (figures, not a test): `.venv/bin/python -m bench.pii`.

1. analyze + redact CPU per KB of answer text (1, 4, 16 KB of mixed English/Chinese prose with
   some PII), pattern-only presidio with ztgate's recognizers, one thread;
2. CPU per streamed delta: an OpenAI SSE answer (one token per event) through the protocol filter
   alone and through protocol + pii, as the worker runs them; the difference is what redaction
   adds per delta; plus how many characters are held back and when the first content leaves;
3. added time to first token on a real streamed answer: the real llama.cpp demo upstream (forced
   by a grammar to answer with PII), through two real gateways (Envoy + workers) that differ only
   in the pii filter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import pii_synth as synth
from classifiers.pii.engine import PiiEngine, Replacement, replacer
from classifiers.pii.stream import StreamRedactor
from filters.base import Continue, RequestContext
from filters.chain import BuildEnv, Chain, build_with_params
from gateway.registry import Registry
from gateway.settings import Settings

_PROSE = (
    "The quarterly report shows revenue grew in every region, and the board approved the plan. ",
    "请在下周一之前提交项目总结，并抄送给财务部门的同事。",
    "Our support team can help you reset the device; restart it and wait for the light to turn green. ",
    "根据合同第三条的约定，双方应当在交付后三十日内完成验收。",
)


def answer_text(kb: int, rng: random.Random) -> str:
    """About `kb` KB (UTF-8) of prose with a PII value every few sentences."""
    parts: list[str] = []
    size = 0
    while size < kb * 1024:
        piece = rng.choice(_PROSE)
        if rng.random() < 0.25:
            piece += rng.choice(
                (
                    f"手机{synth.cn_mobile(rng)}。",
                    f"card {synth.card(rng)}. ",
                    f"身份证{synth.cn_id(rng)}。",
                    f"mail {synth.email(rng)} today. ",
                )
            )
        parts.append(piece)
        size += len(piece.encode())
    return "".join(parts)


def per_kb(engine: PiiEngine, rng: random.Random) -> None:
    rep = replacer(Replacement.ENTITY)
    print("analyze + redact, CPU per call (process time), pattern-only presidio + ztgate recognizers")
    for kb in (1, 4, 16):
        texts = [answer_text(kb, rng) for _ in range(20)]
        for t in texts[:3]:
            engine.redact(t, rep)
        times = []
        for t in texts:
            t0 = time.process_time()
            engine.redact(t, rep)
            times.append(time.process_time() - t0)
        ms = statistics.median(times) * 1000
        print(
            f"  {kb:2d} KB: median {ms:6.2f} ms/call = {ms / kb:5.2f} ms per KB   (p90 {sorted(times)[17] * 1000:.2f} ms)"
        )


def _tokens(text: str, rng: random.Random) -> list[str]:
    """Split like a tokenizer would: 1-2 Han characters, 2-6 Latin characters or digits per token."""
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 2) if "\u4e00" <= text[i] <= "\u9fff" else rng.randint(2, 6)
        out.append(text[i : i + n])
        i += n
    return out


def _chain(names: list[tuple[str, dict[str, Any]]]) -> Chain:
    return build_with_params(names, BuildEnv(Settings()))


async def _stream_cpu(chain: Chain, events: list[bytes]) -> float:
    """Process-time seconds per event for one streamed answer through `chain`."""
    ctx = RequestContext(
        "b", "POST", "/v1/chat/completions", {}, Registry.from_yaml("upstreams: {}\nmodels: {}\n")
    )
    await chain.request_headers(ctx)
    await chain.request_body(
        ctx,
        json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "q"}]}).encode(),
    )
    ctx.response_status = 200
    ctx.response_headers = {"content-type": "text/event-stream"}
    await chain.response_headers(ctx)
    t0 = time.process_time()
    for i, ev in enumerate(events):
        d = await chain.response_chunk(ctx, ev, i == len(events) - 1)
        if not isinstance(d, Continue):
            raise TypeError(f"the chain refused the stream: {d}")
    return (time.process_time() - t0) / len(events)


def per_delta(engine: PiiEngine, rng: random.Random) -> None:
    text = answer_text(4, rng)
    toks = _tokens(text, rng)
    events = [
        b"data: "
        + json.dumps(
            {
                "id": "x",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}],
            },
            ensure_ascii=False,
        ).encode()
        + b"\n\n"
        for t in toks
    ] + [b"data: [DONE]\n\n"]
    base = _chain([("protocol", {})])
    full = _chain([("protocol", {}), ("pii", {})])
    runs = 7
    b = statistics.median([asyncio.run(_stream_cpu(base, events)) for _ in range(runs)])
    f = statistics.median([asyncio.run(_stream_cpu(full, events)) for _ in range(runs)])
    red = StreamRedactor(engine, replacer(Replacement.ENTITY))
    held, first = [], None
    t0 = time.process_time()
    for i, t in enumerate(toks):
        if red.push(0, t) and first is None:
            first = i + 1
        held.append(red.held(0))
    only = (time.process_time() - t0) / len(toks)
    print(f"\nstreamed answer of {len(toks)} deltas ({len(text)} characters), median of {runs} runs:")
    print(f"  protocol filter alone:   {b * 1000:.3f} ms CPU per delta")
    print(f"  protocol + pii filters:  {f * 1000:.3f} ms CPU per delta  → pii adds {(f - b) * 1000:.3f} ms")
    print(f"  StreamRedactor alone:    {only * 1000:.3f} ms CPU per delta")
    print(
        f"  held back: median {statistics.median(held):.0f} characters, max {max(held)}; first content after {first} deltas"
    )


def _ttft(url: str, body: dict[str, Any], n: int) -> list[float]:
    out = []
    with httpx.Client(timeout=60) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            with c.stream(
                "POST", f"{url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {_KEY}"}
            ) as r:
                first = None
                for line in r.iter_lines():
                    if first is None and line.startswith("data: {"):
                        choices = json.loads(line[6:])["choices"]
                        if choices and choices[0]["delta"].get("content"):
                            first = time.perf_counter() - t0
                if first is None:
                    raise RuntimeError("no content in the answer")
                out.append(first)
    return out


_KEY = "ztg-demo-key-change-me"


def ttft(n: int) -> None:
    from gateway.procs import free_port
    from tests.e2e.conftest import demo_registry
    from tests.harness import running

    secret = synth.card(random.Random(1), "visa")
    body = {
        "model": "tiny-llama",
        "stream": True,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "card?"}],
        "grammar": f'root ::= "Hello there, your card {secret} is on file and all is well."',
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        reg = demo_registry(free_port(), free_port())
        base = "principal,protocol,route"
        with (
            running(tmp / "a", reg, demo_upstreams=True, env={"ZTGATE_FILTERS": base}) as without,
            running(tmp / "b", reg, env={"ZTGATE_FILTERS": base + ",pii"}) as with_pii,
        ):
            # Keys: the harness writes its own key file; use it for both.
            global _KEY  # noqa: PLW0603 - the harness decides the key
            from tests.harness import KEY

            _KEY = KEY
            for url in (without.url, with_pii.url):
                _ttft(url, body, 3)  # warm up
            a, b = [], []
            for _ in range(n):  # interleaved, so drifts hit both alike
                a += _ttft(without.url, body, 1)
                b += _ttft(with_pii.url, body, 1)
    ma, mb = statistics.median(a) * 1000, statistics.median(b) * 1000
    print(f"\ntime to first content, real llama.cpp stream through real Envoy + workers ({n} requests each):")
    print(f"  chain without pii: median {ma:.2f} ms (p90 {sorted(a)[int(0.9 * len(a))] * 1000:.2f})")
    print(f"  chain with pii:    median {mb:.2f} ms (p90 {sorted(b)[int(0.9 * len(b))] * 1000:.2f})")
    print(
        f"  added by pii:      {mb - ma:+.2f} ms (includes waiting for the 2nd token: the 1st word is held)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ttft-requests", type=int, default=40)
    ap.add_argument("--no-ttft", action="store_true", help="skip the real-upstream part")
    args = ap.parse_args()
    engine = PiiEngine()
    engine.warm()
    rng = random.Random(5)
    per_kb(engine, rng)
    per_delta(engine, rng)
    if not args.no_ttft:
        ttft(args.ttft_requests)


if __name__ == "__main__":
    main()
