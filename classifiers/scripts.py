"""Character classes shared by the text readers (PII recognizers and stream, encoded runs)."""

from __future__ import annotations

import re

# Chinese characters: CJK unified ideographs, extension A, compatibility ideographs.
HAN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
