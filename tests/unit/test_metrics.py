"""Metrics: per-worker snapshots summed into valid Prometheus text."""

from __future__ import annotations

from pathlib import Path

from gateway.metrics import Metrics, read_dir, render


def test_snapshots_from_workers_are_summed(tmp_path: Path) -> None:
    a, b = Metrics(), Metrics()
    a.record("principal", "request_headers", "continue", 0.0003)
    a.record("principal", "request_headers", "deny", 0.0003)
    b.record("principal", "request_headers", "continue", 3.0)
    a.outcome("allowed")
    b.outcome("allowed")
    b.failure("timeout")
    a.found("pii", "redact", (("response:CN_MOBILE", 2), ("request:EMAIL_ADDRESS", 1)))
    b.found("pii", "redact", (("response:CN_MOBILE", 1),))
    a.write(tmp_path, "worker-1")
    b.write(tmp_path, "worker-2")
    (tmp_path / "worker-3.json").write_text("{half written")
    text = render(read_dir(tmp_path))
    lines = set(text.splitlines())
    labels = 'filter="principal",phase="request_headers"'
    assert f'ztgate_filter_seconds_bucket{{{labels},le="0.0005"}} 2.0' in lines
    assert f'ztgate_filter_seconds_bucket{{{labels},le="2.5"}} 2.0' in lines
    assert f'ztgate_filter_seconds_bucket{{{labels},le="+Inf"}} 3.0' in lines
    assert f"ztgate_filter_seconds_count{{{labels}}} 3.0" in lines
    assert 'ztgate_requests_total{outcome="allowed"} 2.0' in lines
    assert 'ztgate_chain_failures_total{kind="timeout"} 1.0' in lines
    assert f'ztgate_filter_decisions_total{{{labels},action="deny"}} 1.0' in lines
    assert "# TYPE ztgate_filter_seconds histogram" in lines
    assert 'ztgate_findings_total{filter="pii",action="redact",kind="response:CN_MOBILE"} 3.0' in lines
    assert 'ztgate_findings_total{filter="pii",action="redact",kind="request:EMAIL_ADDRESS"} 1.0' in lines


def test_label_values_are_escaped() -> None:
    m = Metrics()
    m.outcome('we"ird\\')
    assert 'ztgate_requests_total{outcome="we\\"ird\\\\"} 1.0' in render([m.snapshot()])


def test_envoy_s_certificate_state_is_rendered_for_prometheus() -> None:
    from gateway.metrics import render_tls

    assert render_tls(None) == "" and render_tls({"error": "Envoy's admin did not answer: URLError"}) == ""
    text = render_tls(
        {"days_until_first_cert_expiring": 29, "rotations_refused": {"listener-cert": 2, "extproc-ca": 0}}
    )
    assert text.splitlines()[2] == "ztgate_tls_days_until_first_cert_expiring 29.0"
    assert text.splitlines()[-2:] == [
        'ztgate_tls_rotations_refused_total{secret="extproc-ca"} 0.0',
        'ztgate_tls_rotations_refused_total{secret="listener-cert"} 2.0',
    ]
