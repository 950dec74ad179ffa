"""Policy hot reload while requests flow: no request fails or mixes revisions; a broken edit changes nothing."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx

from tests.harness import KEY, ScriptedUpstream, registry_for, running

POLICY = """\
version: 1
chain: [{filter: principal}, {filter: protocol}, {filter: route}, {filter: access}, {filter: audit}]
default_action: allow
rules:
  - name: block-secret
    when: {model: ["secret@*"]}
    action: deny
    message: {message}
"""


def _revisions_by_request(logs: str) -> dict[str, str]:
    out = {}
    for line in logs.splitlines():
        if '"event": "request"' in line:
            rec = json.loads(line)
            out[rec["request_id"]] = rec["policy"]
    return out


def _chains_record_their_loads(audit_dir: Path, refused_at: str) -> None:
    """Each chain holds the loads themselves: a request names a policy its worker had recorded
    loading before it (one in flight across a swap keeps its older one), and the refused edit is
    there with its place."""
    from gateway import audit

    for path in audit.chain_files(audit_dir):
        loaded: list[str] = []
        records = audit.verify(path, keep=True).kept
        for rec in records:
            if rec["kind"] in ("worker_start", "file_loaded") and "policy" in rec:
                loaded.append(rec["policy"])
            elif rec["kind"] == "request":
                assert rec["decision"]["policy"] in loaded[-2:]
        assert len(loaded) >= 3
        refused = [r for r in records if r["kind"] == "file_refused"]
        assert refused and refused_at in refused[-1]["error"]


def test_reload_under_load(tmp_path: Path, openai_up: ScriptedUpstream) -> None:
    pol = tmp_path / "policy.yaml"
    pol.write_text(POLICY.replace("{message}", "no v1"))
    reg = registry_for(
        {"v": ("openai", openai_up.port)},
        {
            "open": {"latest": "1", "versions": {"1": {"upstream": "v"}}},
            "secret": {"latest": "1", "versions": {"1": {"upstream": "v"}}},
        },
    )
    with running(tmp_path / "gw", reg, workers=2, env={"ZTGATE_POLICY_FILE": str(pol)}) as env:
        url = env.url + "/v1/chat/completions"
        auth = {"authorization": f"Bearer {KEY}"}
        body = {"model": "open", "messages": [{"role": "user", "content": "hi"}]}
        results: list[tuple[int, str]] = []
        stop = threading.Event()

        def flow() -> None:
            with httpx.Client(timeout=10) as c:
                while not stop.is_set():
                    r = c.post(url, json=body, headers=auth)
                    results.append((r.status_code, r.headers["x-request-id"]))

        threads = [threading.Thread(target=flow) for _ in range(4)]
        for t in threads:
            t.start()
        messages = []
        for i in range(2, 6):  # four edits while requests flow
            time.sleep(0.7)
            pol.write_text(POLICY.replace("{message}", f"no v{i}"))
            messages.append(f"no v{i}")
        time.sleep(1.5)
        denied = httpx.post(url, json={**body, "model": "secret"}, headers=auth)
        assert denied.status_code == 403
        assert "no v5" in denied.json()["error"]["message"]

        # A broken edit: the last good policy stays in force and the refusal is logged with its place.
        pol.write_text(POLICY.replace("{message}", "no v6").replace("action: deny", "action: blok"))
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join()
        still = httpx.post(url, json={**body, "model": "secret"}, headers=auth)
        assert still.status_code == 403 and "no v5" in still.json()["error"]["message"]
        logs = env.logs(lines=0)
        assert f"{pol}:7:13: rules.0.action" in logs and "file_refused_keeping_last_good" in logs

        assert len(results) > 50
        assert {s for s, _ in results} == {200}
        revisions = _revisions_by_request(logs)
        # Every request names exactly one revision, and the flow crossed the reloads.
        seen = [revisions[rid] for _, rid in results]
        assert all(len(r) == 12 for r in seen)
        assert len(set(seen)) >= 3
        # Its audit record (exactly one per request, chains intact) names that same revision.
        audited = {}
        for rec in env.audit():
            assert rec["trace_id"] not in audited
            audited[rec["trace_id"]] = rec["decision"]["policy"]
        assert [audited[rid] for _, rid in results] == seen
        _chains_record_their_loads(env.settings.audit_path, f"{pol}:7:13")


def test_model_list_shows_only_what_the_caller_may_use(tmp_path: Path, openai_up: ScriptedUpstream) -> None:
    from tests.harness import OTHER_TENANT_KEY

    pol = tmp_path / "policy.yaml"
    pol.write_text(
        "version: 1\n"
        "chain: [{filter: principal}, {filter: protocol}, {filter: route}, {filter: access}]\n"
        "rules:\n"
        "  - {name: acme-no-secret, when: {tenant: [acme], model: ['secret@*']}, action: deny}\n"
    )
    reg = registry_for(
        {"v": ("openai", openai_up.port)},
        {
            "open": {"latest": "1", "versions": {"1": {"upstream": "v"}}},
            "secret": {"latest": "2", "versions": {"1": {"upstream": "v"}, "2": {"upstream": "v"}}},
        },
    )
    with running(tmp_path / "gw", reg, workers=1, env={"ZTGATE_POLICY_FILE": str(pol)}) as env:

        def ids(key: str) -> list[str]:
            r = httpx.get(env.url + "/v1/models", headers={"authorization": f"Bearer {key}"})
            return [m["id"] for m in r.json()["data"]]

        assert ids(KEY) == ["open", "open@1"]  # alice is in tenant acme
        assert ids(OTHER_TENANT_KEY) == ["open", "open@1", "secret", "secret@2", "secret@1"]
        hidden = httpx.get(env.url + "/v1/models/secret@1", headers={"authorization": f"Bearer {KEY}"})
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "model_not_found"
