"""A benchmark-only filter that asks for the answer and does nothing with it.

`principal,protocol,route,read_answers` costs what the shipped chain costs when a filter reads
answers (pii, audit): 4 ext_proc messages per request instead of 2, the answer parsed by the
protocol filter, no work of its own. Loaded with ZTGATE_FILTER_MODULES=bench.answer_reader.
"""

from __future__ import annotations

from typing import ClassVar

from filters.base import BaseFilter, Phase
from filters.chain import BuildEnv, register


class ReadAnswers(BaseFilter):
    """Takes the response phases; every hook continues."""

    name: ClassVar[str] = "read_answers"
    phases: ClassVar[Phase] = Phase.RESPONSE_HEADERS | Phase.RESPONSE_BODY
    needs: ClassVar[tuple[str, ...]] = ("protocol",)


@register("read_answers")
def _build(_env: BuildEnv, _params: object) -> ReadAnswers:
    return ReadAnswers()
