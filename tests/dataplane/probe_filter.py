"""A test-only filter plugin that records what the chain understood of each request and answer.

It appends one JSON line per request to $ZTGATE_TEST_PROBE_FILE, so a test can check that the
protocol parser reassembled exactly the answer the client received, through real Envoy chunking.
"""

from __future__ import annotations

import json
import os
from typing import ClassVar

from filters.base import BaseFilter, Phase, RequestContext
from filters.chain import BuildEnv, register


class Probe(BaseFilter):
    name: ClassVar[str] = "probe"
    # It reads the answer, so the protocol filter must parse it (answers are parsed only when read).
    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS | Phase.RESPONSE_BODY

    def __init__(self, path: str) -> None:
        self._path = path

    async def on_end(self, ctx: RequestContext) -> None:
        answer = ctx.answer
        record = {
            "request_id": ctx.request_id,
            "prompt": [[s.role, s.text] for s in ctx.prompt.segments] if ctx.prompt else None,
            "answer": {str(i): answer.text(i) for i in answer.choices} if answer else None,
            "finish": {str(k): v for k, v in answer.finish.items()} if answer else None,
            "done": answer.done if answer else None,
        }
        with open(self._path, "a", encoding="utf-8") as f:  # noqa: ASYNC230 - a test probe, tiny writes
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


@register("probe")
def _build(env: BuildEnv, _params: object) -> Probe:
    return Probe(os.environ["ZTGATE_TEST_PROBE_FILE"])
