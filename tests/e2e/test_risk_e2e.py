"""The shipped policy's risk escalation with the real classifier, real upstreams and real clients.

Five jailbreaks within the hour (each refused by the shipped classifier) put the user under
manual review: the next request, however benign, is refused before Triton runs anything, until
`ztgate risk clear` releases the user. Every step is in the audit chain, which verifies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import tritonclient.http as triton_http
import yaml
from tritonclient.utils import InferenceServerException

from gateway import audit
from tests.e2e.conftest import Sdk
from tests.e2e.test_injection_e2e import JAILBREAK, JAILBREAK_ZH, _executions
from tests.harness import KEY, ROOT, GatewayEnv, running


@pytest.fixture(scope="module")
def shipped(real: GatewayEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayEnv]:
    """A gateway of its own (own Redis prefix, own audit chains) with the shipped policy."""
    tmp = Path(tmp_path_factory.mktemp("risk-e2e"))
    reg = yaml.safe_load(real.settings.registry_file.read_text())
    with running(tmp / "gw", reg, env={"ZTGATE_POLICY_FILE": str(ROOT / "policies" / "default.yaml")}) as env:
        yield env


def _echo(env: GatewayEnv, text: str) -> str:
    inp = triton_http.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([text.encode()], dtype=np.object_), binary_data=True)
    with triton_http.InferenceServerClient(env.url.removeprefix("http://")) as tc:
        value = tc.infer("echo", [inp], headers={"Authorization": f"Bearer {KEY}"}).as_numpy("text_output")[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def test_five_jailbreaks_hold_the_user_for_review_until_cleared(
    shipped: GatewayEnv, real: GatewayEnv, sdk: Sdk
) -> None:
    oa = sdk(shipped)
    for text in [JAILBREAK, JAILBREAK_ZH] * 2 + [JAILBREAK]:
        with pytest.raises(openai.BadRequestError) as e:
            oa.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": text}])
        assert isinstance(e.value.body, dict) and e.value.body["code"] == "prompt_rejected"

    with pytest.raises(openai.PermissionDeniedError) as held:
        oa.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "What is the capital of France?"}]
        )
    assert isinstance(held.value.body, dict) and held.value.body["code"] == "user_under_review"
    before = _executions(real, "echo")
    with pytest.raises(InferenceServerException) as t:
        _echo(shipped, "hello")
    assert t.value.status() == "403"
    assert _executions(real, "echo") == before  # Triton never ran it

    cleared = shipped.cli("risk", "clear", "--tenant", "acme", "--user", "alice")
    assert "released from review" in cleared.stdout, cleared.stderr
    assert _echo(shipped, "hello") == "echo v2: hello"

    records = shipped.audit()  # every chain verified (two workers: two chains)
    codes = Counter(r["decision"]["code"] for r in records)
    assert (codes["prompt_rejected"], codes["user_under_review"], codes[None]) == (5, 2, 1)
    risk = [
        v
        for r in records
        for v in r["decision"]["verdicts"]
        if v["filter"] == "risk" and v["phase"] == "record"
    ]
    assert sorted(v["action"] for v in risk) == ["count"] * 4 + ["escalate"]
    assert any("in_window=5" in v["detail"] for v in risk if v["action"] == "escalate")
    assert all(r["prompt"] is None or "text" not in r["prompt"] for r in records)
    assert all(audit.verify(p).ok for p in audit.chain_files(shipped.settings.audit_path))
