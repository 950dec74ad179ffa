"""API keys hot-reload: a revoked key stops working within seconds; a broken edit changes nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from filters.principal import digest
from tests.harness import KEY, GatewayEnv, ScriptedUpstream, registry_for, running, running_policy


def _wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def _call(env: GatewayEnv, key: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(env.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})


def _registry(up: ScriptedUpstream) -> dict[str, Any]:
    return registry_for(
        {"v": ("openai", up.port)}, {"m": {"latest": "1", "versions": {"1": {"upstream": "v"}}}}
    )


# The default chain's auth_guard would block loopback after ten refused keys, and this test
# presents a revoked key many more times than that (auth_guard: test_auth_guard.py).
POLICY = """\
version: 1
chain:
  - filter: principal
  - filter: protocol
  - filter: route
default_action: allow
"""


def test_keys_reload_and_broken_edits_keep_last_good(tmp_path: Path, openai_up: ScriptedUpstream) -> None:
    with running_policy(tmp_path, _registry(openai_up), POLICY, workers=2) as env:
        keys_file = env.settings.keys_file

        def status(key: str) -> int:
            return _call(env, key).status_code

        def all_workers(key: str, want: int) -> bool:
            # Several calls, so both workers (round-robin) have answered.
            return all(status(key) == want for _ in range(6))

        assert status(KEY) == 200
        new = "ztg-new-key-for-carol"
        doc = yaml.safe_load(keys_file.read_text())
        doc["keys"].append({"id": "k3", "sha256": digest(new), "user": "carol", "tenant": "acme"})
        keys_file.write_text(yaml.safe_dump(doc))
        assert _wait_for(lambda: all_workers(new, 200))

        # Revoke alice's key.
        doc["keys"] = [k for k in doc["keys"] if k["id"] != "k1"]
        keys_file.write_text(yaml.safe_dump(doc))
        assert _wait_for(lambda: all_workers(KEY, 401))

        # A broken edit: nothing changes, the error is logged with its location.
        keys_file.write_text(keys_file.read_text() + "  - {id: broken\n")
        time.sleep(2)
        assert all_workers(new, 200) and all_workers(KEY, 401)
        assert "file_refused_keeping_last_good" in env.logs()
        assert str(keys_file) + ":" in env.logs()


def test_a_key_stops_working_when_it_expires(tmp_path: Path, openai_up: ScriptedUpstream) -> None:
    with running(tmp_path, _registry(openai_up), workers=2) as env:
        keys_file = env.settings.keys_file
        soon, gone = "ztg-key-expiring-in-seconds", "ztg-key-expired-last-year"
        until = time.time() + 8  # beyond the reload wait below (5 s at most)
        doc = yaml.safe_load(keys_file.read_text())
        doc["keys"] += [
            {"id": "k-soon", "sha256": digest(soon), "user": "dan", "tenant": "acme",
             "expires": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))},
            {"id": "k-gone", "sha256": digest(gone), "user": "eve", "tenant": "acme",
             "expires": "2025-12-01T00:00:00+08:00"},
        ]  # fmt: skip
        keys_file.write_text(yaml.safe_dump(doc))
        # Both workers must have the new file (round-robin: several calls reach each), or the
        # expired key below meets one that does not know it yet (invalid, not expired).
        assert _wait_for(lambda: all(_call(env, soon).status_code == 200 for _ in range(6)))
        before = len(openai_up.requests)
        r = _call(env, gone)
        assert r.status_code == 401 and r.json()["error"]["code"] == "expired_api_key", r.text
        # Read at each request, not at load: the same key file refuses it once its time has come.
        time.sleep(max(0.0, until - time.time()) + 1)
        codes = {_call(env, soon).json()["error"]["code"] for _ in range(4)}  # both workers
        assert codes == {"expired_api_key"}
        assert len(openai_up.requests) == before
        assert "principal:check:deny:key=k-gone,expired" in env.logs(0)
