"""The rendered Envoy config is accepted by the real Envoy binary, for local runs and for compose."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gateway import envoy_config
from gateway.registry import Registry
from gateway.settings import Settings
from gateway.supervisor import envoy_binary
from tests.harness import ROOT


@pytest.mark.parametrize(
    ("registry", "settings"),
    [
        (ROOT / "gateway" / "defaults" / "registry.yaml", Settings()),
        (ROOT / "deploy" / "registry.yaml", Settings(listen_address="0.0.0.0", worker_host="gateway")),  # noqa: S104
        (
            ROOT / "gateway" / "defaults" / "registry.yaml",
            Settings(trusted_proxies=("10.0.0.0/8", "2001:db8::/32")),
        ),
    ],
)
def test_envoy_validates_rendered_config(tmp_path: Path, registry: Path, settings: Settings) -> None:
    cfg = tmp_path / "envoy.json"
    cfg.write_text(json.dumps(envoy_config.render(settings, Registry.load(registry))))
    r = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
