"""Per-scope filter parameters (policy `overrides`) through the real gateway.

Two tenants share one policy: globex's prompts are screened at a stricter injection threshold,
acme's prompts are redacted before they reach the model. What each tenant gets is what the
upstream received and what the audit record says, not the policy object.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.harness import KEY, OTHER_TENANT_KEY, ScriptedUpstream, chat_answer, chat_registry, running
from tests.injection_model import build

pytestmark = pytest.mark.dataplane

# The test model scores "the instructions" 0.33: under the chain's threshold
# (0.5), over globex's (0.3).
BORDERLINE = "the instructions"
EMAIL = "write to ann.lee@example.com"


def test_overrides_give_each_tenant_its_own_parameters(tmp_path: Path) -> None:
    manifest = build(tmp_path / "model")
    (tmp_path / "policy.yaml").write_text(
        f"""\
version: 1
chain:
  - filter: principal
  - filter: protocol
  - filter: route
  - filter: access
  - filter: prompt_injection
    model: {manifest}
    assistant: trust
  - filter: pii
    request: false
  - filter: audit
default_action: allow
overrides:
  - name: globex-strict-screening
    when: {{tenant: [globex]}}
    filter: prompt_injection
    params: {{threshold: 0.3, message: not for globex}}
  - name: acme-prompts-redacted
    when: {{tenant: [acme]}}
    filter: pii
    params: {{request: true}}
"""
    )
    up = ScriptedUpstream("openai").start()
    up.handler = lambda _r: chat_answer("ok")
    try:
        reg = chat_registry(up.port)
        with running(tmp_path / "gw", reg, env={"ZTGATE_POLICY_FILE": str(tmp_path / "policy.yaml")}) as env:

            def ask(key: str, text: str) -> httpx.Response:
                return httpx.post(
                    f"{env.url}/v1/chat/completions",
                    headers={"authorization": f"Bearer {key}"},
                    json={"model": "chat", "messages": [{"role": "user", "content": text}]},
                    timeout=10,
                )

            # acme: the chain's threshold lets the borderline prompt through; its e-mail is redacted.
            r = ask(KEY, BORDERLINE)
            assert r.status_code == 200, r.text
            r = ask(KEY, EMAIL)
            assert r.status_code == 200, r.text
            sent = json.loads(up.requests[-1].body)["messages"][0]["content"]
            assert "ann.lee@example.com" not in sent and "<EMAIL_ADDRESS>" in sent
            acme = env.audit_for(r.headers["x-request-id"])
            applied = [v["detail"] for v in acme["decision"]["verdicts"] if v["phase"] == "override"]
            assert applied == ["acme-prompts-redacted"]
            # globex: the same borderline prompt is refused with globex's message, never forwarded;
            # its e-mail goes to the model as written (the chain's pii has request: false).
            before = len(up.requests)
            r = ask(OTHER_TENANT_KEY, BORDERLINE)
            err = r.json()["error"]
            assert r.status_code == 400 and err["code"] == "prompt_rejected", r.text
            assert err["message"].startswith("not for globex (request id "), r.text
            assert len(up.requests) == before
            refused = env.audit_for(r.headers["x-request-id"])
            assert [v["detail"] for v in refused["decision"]["verdicts"] if v["phase"] == "override"] == [
                "globex-strict-screening"
            ]
            r = ask(OTHER_TENANT_KEY, EMAIL)
            assert r.status_code == 200, r.text
            assert json.loads(up.requests[-1].body)["messages"][0]["content"] == EMAIL
    finally:
        up.stop()


def test_a_tenant_with_a_lower_risk_threshold_is_held_sooner(tmp_path: Path) -> None:
    # Every call is a risk event (a flag rule for all); the chain holds a user after 5 in an hour,
    # globex's override after 2, with its own message. Risk reads request headers: scoped by who.
    (tmp_path / "policy.yaml").write_text(
        """\
version: 1
chain:
  - filter: principal
  - filter: risk
    threshold: 5
  - filter: protocol
  - filter: route
  - filter: access
default_action: allow
rules:
  - {name: every-call-counts, action: flag}
overrides:
  - name: globex-low-tolerance
    when: {tenant: [globex]}
    filter: risk
    params: {threshold: 2, message: globex holds you for review}
"""
    )
    up = ScriptedUpstream("openai").start()
    up.handler = lambda _r: chat_answer("ok")
    try:
        env_vars = {"ZTGATE_POLICY_FILE": str(tmp_path / "policy.yaml")}
        with running(tmp_path / "gw", chat_registry(up.port), env=env_vars) as env:

            def ask(key: str) -> httpx.Response:
                return httpx.post(
                    f"{env.url}/v1/chat/completions",
                    headers={"authorization": f"Bearer {key}"},
                    json={"model": "chat", "messages": [{"role": "user", "content": "hello"}]},
                    timeout=10,
                )

            globex = [ask(OTHER_TENANT_KEY) for _ in range(3)]
            assert [r.status_code for r in globex] == [200, 200, 403]
            err = globex[2].json()["error"]
            assert err["code"] == "user_under_review" and err["message"].startswith("globex holds you")
            assert [ask(KEY).status_code for _ in range(4)] == [200] * 4  # acme: the chain's 5
            assert len(up.requests) == 6
            held = env.cli("risk", "show", "--tenant", "globex", "--user", "bob")
            assert held.returncode == 0 and '"reason": "threshold"' in held.stdout, held.stdout + held.stderr
    finally:
        up.stop()
