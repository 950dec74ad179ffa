"""A test-only filter plugin (ZTGATE_FILTER_MODULES) that misbehaves on request, to prove fail-closed.

x-test-fault: sleep   → awaits longer than the per-phase budget (the chain's own timeout answers)
x-test-fault: block   → blocks the event loop (a stuck CPU-bound filter: Envoy's message_timeout answers)
x-test-fault: raise   → raises (a bug: the chain denies with 500)
x-test-fault: raise-response → raises while checking the answer
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

from filters.base import CONTINUE, BaseFilter, Decision, Phase, RequestContext
from filters.chain import BuildEnv, register


class Faulty(BaseFilter):
    name: ClassVar[str] = "faulty"
    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS | Phase.RESPONSE_BODY

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        fault = ctx.headers.get("x-test-fault")
        if fault == "sleep":
            await asyncio.sleep(5)
        elif fault == "block":
            time.sleep(2.5)  # noqa: ASYNC251 - deliberately blocking the loop
        elif fault == "raise":
            raise RuntimeError("secret prompt text must not be logged")
        return CONTINUE

    async def on_response_chunk(self, ctx: RequestContext, chunk: bytes, end: bool) -> Decision:
        if ctx.headers.get("x-test-fault") == "raise-response":
            raise RuntimeError("boom")
        return CONTINUE


@register("faulty")
def _build(env: BuildEnv, _params: object) -> Faulty:
    return Faulty()
