"""The audit chain: format, continuation, the verifier's refusals; the record a request leaves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters._protocols import Answer, Prompt, Segment
from filters.audit import Audit, AuditParams
from filters.base import CONTINUE, BaseFilter, Decision, Deny, Phase, Principal, RequestContext, Verdict
from filters.chain import Chain
from gateway import audit
from gateway.registry import Protocol, Registry, Route

KEY = b"k" * 32


def _chain(path: Path, n: int) -> Path:
    w = audit.ChainWriter(path)
    for i in range(n):
        w.append({"i": i, "text": "提示 ünïcode"})
    w.close()
    return path


def test_records_chain_and_a_restarted_writer_continues(tmp_path: Path) -> None:
    path = _chain(tmp_path / "c.jsonl", 3)
    first = audit.verify(path)
    assert (first.ok, first.records) == (True, 3)
    w = audit.ChainWriter(path)
    w.append({"i": 3})
    w.close()
    recs = audit.verify(path, keep=True).kept
    assert [r["seq"] for r in recs] == [0, 1, 2, 3]
    assert recs[0]["prev"] == audit.GENESIS and recs[3]["prev"] == first.head
    assert audit.verify(path).ok


def test_a_damaged_tail_refuses_to_continue(tmp_path: Path) -> None:
    path = _chain(tmp_path / "c.jsonl", 2)
    path.write_bytes(path.read_bytes()[:-10])  # a torn last write
    with pytest.raises(audit.AuditError, match="ends with a damaged record"):
        audit.ChainWriter(path).open()
    assert audit.verify(path).problem == "line 2: incomplete (no final newline)"


def test_an_unwritable_chain_is_an_audit_error(tmp_path: Path) -> None:
    (tmp_path / "full.jsonl").symlink_to("/dev/full")
    w = audit.ChainWriter(tmp_path / "full.jsonl")
    with pytest.raises(audit.AuditError, match="cannot write audit chain"):
        w.append({"i": 0})
    assert w.seq == 0  # nothing counted that was not written


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_changed_byte_is_found(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    path = _chain(tmp_path_factory.mktemp("c") / "c.jsonl", 4)
    raw = bytearray(path.read_bytes())
    i = data.draw(st.integers(0, len(raw) - 1))
    new = data.draw(st.integers(0, 255).filter(lambda b: b != raw[i]))
    raw[i] = new
    path.write_bytes(bytes(raw))
    assert not audit.verify(path).ok


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_reordering_or_removing_records_is_found(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    path = _chain(tmp_path_factory.mktemp("c") / "c.jsonl", 5)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    order = data.draw(st.permutations(range(5)))
    keep = data.draw(st.lists(st.sampled_from(order), min_size=1, max_size=5, unique=True))
    changed = [lines[k] for k in order if k in keep]
    if changed == lines[: len(changed)]:
        return  # a prefix of the chain in order: valid (cut-off tails are what the head anchor is for)
    path.write_text("".join(changed), encoding="utf-8")
    assert not audit.verify(path).ok


def test_verifier_names_the_line(tmp_path: Path) -> None:
    path = _chain(tmp_path / "c.jsonl", 3)
    lines = path.read_text(encoding="utf-8").splitlines()
    doc = json.loads(lines[1])
    doc["i"] = 99
    lines[1] = audit.canonical(doc)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert audit.verify(path).problem == "line 2: hash does not match its content (edited)"
    lines[1] = lines[1].replace(",", ", ", 1)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert audit.verify(path).problem == "line 2: not in canonical form (edited)"


def _ctx(**kw: object) -> RequestContext:
    ctx = RequestContext(
        "rid-1",
        "POST",
        "/v1/chat/completions",
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        Registry.from_yaml("upstreams: {}\nmodels: {}\n"),
    )
    ctx.principal = Principal("k1", "alice", "acme")
    ctx.prompt = Prompt(Protocol.OPENAI, "chat", "m", segments=(Segment("user", "my card 4111"),))
    ctx.route = Route("up_v", Protocol.OPENAI, "m", "1", "m", None, "abc123")
    ctx.answer = Answer(parts={0: {"content": ["hello ", "there"]}}, finish={0: "stop"}, done=True)
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


def test_fingerprint_record_holds_no_text(tmp_path: Path) -> None:
    f = Audit(audit.ChainWriter(tmp_path / "c.jsonl"), KEY, AuditParams())
    ctx = _ctx(outcome="allowed", status=200)
    ctx.prompt.received_text = "my card 4111 1111 1111 1111"  # type: ignore[union-attr]
    ctx.verdicts.append(Verdict("pii", "end", "redact", 0.0, "", (("request:CREDIT_CARD", 1),)))
    rec = f.record(ctx)
    assert rec["prompt"] == {
        "chars": 27,
        "fingerprint": audit.fingerprint(KEY, "my card 4111 1111 1111 1111"),
        "roles": ["user"],
    }
    assert rec["response"]["fingerprint"] == audit.fingerprint(KEY, "hello there")
    assert rec["model"] == {
        "ref": "m@1",
        "hash": "abc123",
        "upstream": "up_v",
        "registry": ctx.registry.revision,
    }
    assert (rec["trace_id"], rec["traceparent"]) == (
        "rid-1",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    ctx.headers["traceparent"] = "x" * 5000  # anything else a client sends is not kept
    assert f.record(ctx)["traceparent"] is None
    assert rec["redacted"] == [{"side": "request", "entity": "CREDIT_CARD", "count": 1, "action": "redact"}]
    assert "4111" not in audit.canonical(rec) and "hello" not in audit.canonical(rec)


def test_raw_record_holds_the_text(tmp_path: Path) -> None:
    f = Audit(audit.ChainWriter(tmp_path / "c.jsonl"), KEY, AuditParams(mode="raw"))
    rec = f.record(_ctx())
    assert rec["prompt"]["text"] == "my card 4111" and rec["response"]["text"] == "hello there"


class _Boom(BaseFilter):
    name = "boom"
    phases = Phase.SETTLE

    async def on_settle(self, ctx: RequestContext) -> Decision:
        raise RuntimeError("bug")


class _Seen(BaseFilter):
    name = "seen"
    phases = Phase.SETTLE

    async def on_settle(self, ctx: RequestContext) -> Decision:
        ctx.state["seen"] = (ctx.outcome, ctx.status, ctx.error_code)
        return CONTINUE


async def test_a_failing_settle_filter_refuses_and_the_next_still_records() -> None:
    ctx = _ctx(outcome="allowed", status=200)
    d = await Chain([_Boom(), _Seen()]).settle(ctx)
    assert isinstance(d, Deny) and d.status == 500
    assert ctx.state["seen"] == ("denied", 500, "internal_error")
    assert any(v.filter == "boom" and v.detail == "error=RuntimeError" for v in ctx.verdicts)


async def test_a_refused_request_stays_refused_as_it_was() -> None:
    ctx = _ctx(outcome="denied", status=400, error_code="invalid_json")
    d = await Chain([_Boom(), _Seen()]).settle(ctx)
    assert d is CONTINUE
    assert ctx.state["seen"] == ("denied", 400, "invalid_json")


async def test_settle_writes_synced_records_and_refuses_when_it_cannot(tmp_path: Path) -> None:
    ok = Audit(audit.ChainWriter(tmp_path / "c.jsonl"), KEY, AuditParams(fsync=True))
    assert await ok.on_settle(_ctx(outcome="allowed", status=200)) is CONTINUE
    assert audit.verify(tmp_path / "c.jsonl").records == 1
    (tmp_path / "full.jsonl").symlink_to("/dev/full")
    full = Audit(audit.ChainWriter(tmp_path / "full.jsonl"), KEY, AuditParams())
    ctx = _ctx(outcome="allowed", status=200)
    d = await full.on_settle(ctx)
    assert isinstance(d, Deny) and (d.status, d.code) == (503, "audit_unavailable")
    assert [(v.phase, v.action, v.detail) for v in ctx.verdicts] == [
        ("fail_mode", "deny", "audit_failed=AuditError")
    ]
